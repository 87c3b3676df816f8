"""strata's DeltaNet ops composed as transformers 5.24 composes a linear-attention layer
(Qwen3NextGatedDeltaNet, Qwen3_5MoeGatedDeltaNet) on a tiny random layer: the conventions
(projection layout, conv channel order, head repeat, gates, output gate) are checked at each
seam against the tensors transformers itself hands on, so nothing rests on a loose end-to-end
tolerance:
- the projections split by strata.kernels.deltanet.projections, through transformers' own conv,
  give exactly the q, k, v its chunk rule receives; strata's conv is within the conv bound of
  that conv (tests/kernels/test_deltanet_parts.py); the gates are exactly its g and beta;
- strata's chunk rule on those inputs is within the fp64 bound (test_deltanet_chunk.py);
- transformers' core output through strata's z and gated norm and the out projection is the
  layer's output bit for bit.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from strata.kernels.deltanet import (causal_conv1d_torch, chunk_gated_delta_rule, delta_gates,
                                     gated_rms_norm_torch)
from strata.kernels.deltanet.projections import qwen3_next_inputs, split_qkv
from test_deltanet_chunk import check, truth  # this folder: the fp64 recurrence and its bound

U32 = 2.0 ** -24
HK, HV, DK, DV, D = 2, 4, 32, 16, 64


def layer(kind: str):
    """A tiny random layer of `kind` and its modeling module."""
    if kind == "qwen3_next":
        import transformers.models.qwen3_next.modeling_qwen3_next as mod
        from transformers import Qwen3NextConfig as Config
        cls = mod.Qwen3NextGatedDeltaNet
    else:
        import transformers.models.qwen3_5_moe.modeling_qwen3_5_moe as mod
        from transformers import Qwen3_5MoeTextConfig as Config
        cls = mod.Qwen3_5MoeGatedDeltaNet
    cfg = Config(hidden_size=D, linear_num_key_heads=HK, linear_num_value_heads=HV,
                 linear_key_head_dim=DK, linear_value_head_dim=DV, linear_conv_kernel_dim=4,
                 num_hidden_layers=1, layer_types=["linear_attention"], rms_norm_eps=1e-6)
    torch.manual_seed(0)
    m = cls(cfg, 0).eval()
    with torch.no_grad():
        m.norm.weight.copy_(1 + 0.3 * torch.randn(DV))
        m.dt_bias.copy_(torch.rand(HV))
        m.conv1d.weight.mul_(4)
    return m, mod


def projections(m, kind, x):
    """x [1, T, D] -> (mixed_qkv [T, C], z [T, Hv, dv], b, a [T, Hv]) as strata splits them."""
    T = x.shape[1]
    if kind == "qwen3_next":
        return qwen3_next_inputs(F.linear(x, m.in_proj_qkvz.weight)[0],
                                 F.linear(x, m.in_proj_ba.weight)[0], HK, HV, DK, DV)
    return (F.linear(x, m.in_proj_qkv.weight)[0],
            F.linear(x, m.in_proj_z.weight)[0].view(T, HV, DV),
            F.linear(x, m.in_proj_b.weight)[0], F.linear(x, m.in_proj_a.weight)[0])


@pytest.mark.parametrize("T", [1, 65], ids=lambda t: f"T{t}")
@pytest.mark.parametrize("kind", ["qwen3_next", "qwen3_5_moe"])
def test_layer_conventions_match_transformers(monkeypatch, kind, T):
    m, mod = layer(kind)
    seen = {}
    orig = mod.torch_chunk_gated_delta_rule

    def capture(*args, **kw):
        seen["in"], seen["out"] = (args, kw), orig(*args, **kw)
        return seen["out"]
    monkeypatch.setattr(mod, "torch_chunk_gated_delta_rule", capture)
    x = torch.randn(1, T, D, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        y = m(x)
    (hq, hk, hv), kw = seen["in"][0][:3], seen["in"][1]
    mixed, z, b, a = projections(m, kind, x)
    w = m.conv1d.weight.squeeze(1).detach()
    hf_conv = mod.causal_conv1d_fn(mixed.t()[None], w, None, activation="silu")[0].t()
    q, k, v = split_qkv(hf_conv, HK, HV, DK, DV)
    assert torch.equal(q, hq[0]) and torch.equal(k, hk[0]) and torch.equal(v, hv[0])
    ours, state = causal_conv1d_torch(mixed, w)
    xp = torch.cat([torch.zeros(3, mixed.shape[1]), mixed])
    mag = sum((xp[j:j + T] * w[:, j]).abs() for j in range(4))
    assert ((ours - hf_conv).abs() <= (1.1 * 6 + 2) * U32 * mag).all()
    assert torch.equal(state, xp[-3:])
    g, beta = delta_gates(a, b, m.A_log.detach(), m.dt_bias.detach())
    assert torch.equal(g, kw["g"][0]) and torch.equal(beta, kw["beta"][0])
    assert kw["use_qk_l2norm_in_kernel"] is True
    core = seen["out"][0][0]                                                  # [T, Hv, dv]
    normed = gated_rms_norm_torch(core, z, m.norm.weight.detach(), 1e-6)
    with torch.no_grad():
        assert torch.equal(F.linear(normed.reshape(1, T, HV * DV), m.out_proj.weight), y)
    o, S = chunk_gated_delta_rule(q, k, v, g, beta, None, use_qk_l2norm=True)
    check(o, S, truth(q, k, v, g, beta, None), f"{kind} layer T{T}")
