"""How much of each layer a chunk touches: the expert hit fraction, and a routing trace to feed it.

    expert_hit_fraction(topk_ids [T, K], E, chunk=None) -> fraction of E experts with >= 1 token
        (per chunk of `chunk` tokens when given: tensor [ceil(T / chunk)])
    route_trace(weights, token_ids [T]) -> RouteTrace(topk [L] x [T, K], resid_rms [L])

`route_trace` uses `strata.models` when that package provides `route_trace(weights, token_ids)`;
until then it runs the small float32 reference forward below (Qwen3-MoE: RMSNorm, GQA attention with
q/k-norm and NEOX RoPE, softmax -> top-k router, SwiGLU experts), which dequantizes each layer's
experts with gguf-py. It is a measuring tool for synthetic models, not the model: tiny and small
shapes on the CPU, the full shape on a GPU host (one layer's experts dequantized at a time, ~2.4 GB
fp32 for qwen3-30b-a3b).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from strata.errors import StrataError
from strata.shapes import ModelShape


def expert_hit_fraction(topk_ids: torch.Tensor, n_expert: int, chunk: int | None = None):
    """Fraction of the layer's `n_expert` experts routed at least one of the tokens.

    topk_ids: int [T, K]. With `chunk`, one fraction per consecutive chunk of `chunk` tokens."""
    ids = torch.as_tensor(topk_ids).long()
    if ids.dim() != 2:
        raise StrataError(f"topk ids must be [T, K], got {list(ids.shape)}")
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= n_expert):
        raise StrataError(f"topk ids must lie in [0, {n_expert})")
    if chunk is None:
        return float(torch.bincount(ids.reshape(-1), minlength=n_expert).gt(0).sum()) / n_expert
    out = [expert_hit_fraction(ids[s:s + chunk], n_expert) for s in range(0, ids.shape[0], chunk)]
    return torch.tensor(out, dtype=torch.float64)


@dataclass
class RouteTrace:
    topk: list[torch.Tensor]     # per layer: int64 [T, K]
    resid_rms: list[float]       # per layer: RMS of the residual stream after the layer

    def hit_fractions(self, n_expert: int, chunk: int | None = None) -> list[float]:
        """Per layer: mean over chunks of the hit fraction."""
        return [float(torch.as_tensor(expert_hit_fraction(t, n_expert, chunk)).mean())
                for t in self.topk]


class PackWeights:
    """Float views of a pack's weights for the reference forward."""

    def __init__(self, pack):
        self.pack, self.shape = pack, pack.shape

    def dense(self, name: str) -> torch.Tensor:
        return self.pack.dense(name).float()

    def experts(self, i: int):
        from strata.packs.blobs import split_blobs
        lay = self.pack.layers[i].layout
        parts = split_blobs(lay, self.pack.experts(i).numpy())
        return tuple(_dequant(parts[m.name], m.fmt, (self.shape.n_expert, m.rows, m.cols))
                     for m in lay.matrices)


class GGUFWeights:
    """Float views of a qwen3moe GGUF's weights for the reference forward."""

    def __init__(self, path):
        from strata.packs.from_gguf import gguf_shape, open_gguf
        self.reader = open_gguf(path)
        self.shape = gguf_shape(self.reader, path)
        self.t = {t.name: t for t in self.reader.tensors}

    def _get(self, name, shp):
        from strata.formats.table import get_format
        t = self.t[name]
        return _dequant(t.data, get_format(t.tensor_type) if t.tensor_type.name not in ("F32", "F16")
                        else t.tensor_type.name, shp)

    def dense(self, name: str) -> torch.Tensor:
        from strata.packs.names import dense_specs
        if name == "output.weight" and name not in self.t:
            name = "token_embd.weight"
        return self._get(name, dense_specs(self.shape)[name])

    def experts(self, i: int):
        s = self.shape
        return (self._get(f"blk.{i}.ffn_gate_exps.weight", (s.n_expert, s.d_expert, s.d_model)),
                self._get(f"blk.{i}.ffn_up_exps.weight", (s.n_expert, s.d_expert, s.d_model)),
                self._get(f"blk.{i}.ffn_down_exps.weight", (s.n_expert, s.d_model, s.d_expert)))


def _dequant(raw, fmt, shp) -> torch.Tensor:
    import gguf
    from gguf.quants import dequantize
    if isinstance(fmt, str):  # plain numpy float tensor from GGUF
        return torch.from_numpy(np.array(raw, np.float32)).reshape(shp)
    try:
        qt = gguf.GGMLQuantizationType(fmt.ggml_type)
    except ValueError:
        raise StrataError(f"the reference router trace cannot decode {fmt.name} (gguf-py lacks it)") from None
    w = dequantize(np.ascontiguousarray(raw).view(np.uint8), qt)
    return torch.from_numpy(np.ascontiguousarray(w, np.float32)).reshape(shp)


def _rms(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _rope(x, pos, theta):  # x [T, H, hd], NEOX: rotate the two halves
    hd = x.shape[-1]
    inv = theta ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    ang = (pos.double()[:, None] * inv[None]).float()          # [T, hd/2]
    cos, sin = ang.cos()[:, None], ang.sin()[:, None]
    a, b = x[..., :hd // 2], x[..., hd // 2:]
    return torch.cat([a * cos - b * sin, b * cos + a * sin], -1)


@torch.no_grad()
def reference_route_trace(w, token_ids) -> RouteTrace:
    """float32 reference forward over all layers recording each layer's top-k expert ids."""
    s: ModelShape = w.shape
    ids = torch.as_tensor(token_ids).long()
    T = ids.numel()
    x = w.dense("token_embd.weight")[ids]                       # [T, D]
    pos = torch.arange(T)
    topks, rms = [], []
    for i in range(s.n_layer):
        p = f"blk.{i}."
        h = _rms(x, w.dense(p + "attn_norm.weight"), s.rms_eps)
        q = (h @ w.dense(p + "attn_q.weight").T).view(T, s.n_head, s.head_dim)
        k = (h @ w.dense(p + "attn_k.weight").T).view(T, s.n_kv_head, s.head_dim)
        v = (h @ w.dense(p + "attn_v.weight").T).view(T, s.n_kv_head, s.head_dim)
        q = _rope(_rms(q, w.dense(p + "attn_q_norm.weight"), s.rms_eps), pos, s.rope_theta)
        k = _rope(_rms(k, w.dense(p + "attn_k_norm.weight"), s.rms_eps), pos, s.rope_theta)
        rep = s.n_head // s.n_kv_head
        a = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(0, 1), k.repeat_interleave(rep, 1).transpose(0, 1),
            v.repeat_interleave(rep, 1).transpose(0, 1), is_causal=True)  # [H, T, hd]
        x = x + a.transpose(0, 1).reshape(T, -1) @ w.dense(p + "attn_output.weight").T
        h = _rms(x, w.dense(p + "ffn_norm.weight"), s.rms_eps)
        probs = torch.softmax(h @ w.dense(p + "ffn_gate_inp.weight").T, -1)   # [T, E]
        tw, ti = probs.topk(s.top_k, -1)                                         # [T, K]
        if s.norm_topk_prob:
            tw = tw / tw.sum(-1, keepdim=True)
        gate, up, down = w.experts(i)                      # [E, F, D], [E, F, D], [E, D, F]
        y = torch.zeros_like(x)
        for e in ti.unique().tolist():
            t, kk = (ti == e).nonzero(as_tuple=True)
            z = torch.nn.functional.silu(h[t] @ gate[e].T) * (h[t] @ up[e].T)
            y.index_add_(0, t, (z @ down[e].T) * tw[t, kk, None])
        x = x + y
        topks.append(ti)
        rms.append(float(x.pow(2).mean().sqrt()))
    return RouteTrace(topks, rms)


def route_trace(w, token_ids) -> RouteTrace:
    """The model's routing over `token_ids`: strata.models when it offers route_trace, else the
    reference forward above. `w`: a Pack, a GGUF path, or PackWeights/GGUFWeights."""
    from pathlib import Path
    if isinstance(w, (str, Path)):
        w = GGUFWeights(w) if str(w).endswith(".gguf") else PackWeights(_open_pack(w))
    elif not isinstance(w, (PackWeights, GGUFWeights)):
        w = PackWeights(w)
    try:
        from strata import models
        fn = getattr(models, "route_trace", None)
    except ImportError:
        fn = None
    if fn is not None and isinstance(w, PackWeights):
        return fn(w.pack, token_ids)
    return reference_route_trace(w, token_ids)


def _open_pack(p):
    from strata.packs.file import Pack
    return Pack.open(p)
