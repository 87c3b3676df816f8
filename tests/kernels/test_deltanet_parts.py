"""The smaller parts of a Gated DeltaNet layer (strata.kernels.deltanet): the short causal conv
and its carried state, the gates, the q/k L2 norm and the gated output norm against their twins
and transformers 5.24, and the sizes the planner reads against what the chunk launcher allocates.

Bounds (u = 2^-24, fp32 unless said):
- conv: K products and K + 1 sums in fp32 against F.conv1d's own order: (K + 2) u sum |w x|
  before SiLU, which moves an error by at most 1.1x (|silu'| <= 1.1), plus one rounding of
  silu: (1.1 (K + 2) + 2) u (sum |w x| + |bias|). The kernel against its twin: the same sums
  in the same order, each multiply-add maybe one FMA (an fp32 rounding fewer), and another exp:
  the same bound; in bf16 plus one bf16 step of the output (two roundings of close fp32s).
- l2norm: sum of N squares in another order, rsqrt and a product: (N + 4) u |y|.
- gated_rms_norm, fp32: the mean square in another order, rsqrt, the weight, silu (its exp
  within 2 u on the GPU) and the product: (N + 10) u |ref|. bf16: the normed value x r may land
  one bf16 step off (as strata.kernels.norm), which w and silu(z) scale, plus one bf16 rounding
  of the output (a full step: the interpreter truncates).
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from strata.errors import StrataError
from strata.kernels.deltanet.launch import pin_delta_launch
from strata.planning import deltanet_buffers
from strata.kernels.deltanet import (causal_conv1d, causal_conv1d_torch, chunk_buffers,
                                     chunk_gated_delta_rule, chunk_scratch_bytes,
                                     conv_state_bytes, delta_gates,
                                     gated_rms_norm, gated_rms_norm_torch, l2norm, l2norm_torch,
                                     recurrent_state_bytes)

U32 = 2.0 ** -24
EPS = 1e-6


def bf16_step(x):
    _, e = torch.frexp(x.abs().float())
    return torch.ldexp(torch.ones_like(x, dtype=torch.float32), e - 1 - 7)


# -- the short causal conv -------------------------------------------------------------------
def conv_inputs(T, C=24, K=4, seed=0, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(T, C, generator=gen).to(dtype)
    w = (0.5 * torch.randn(C, K, generator=gen)).to(dtype)
    b = (0.1 * torch.randn(C, generator=gen)).to(dtype)
    return x, w, b


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("T", [1, 2, 3, 63, 64, 65, 200], ids=lambda t: f"T{t}")
def test_conv_matches_transformers(T, bias):
    """The whole prompt in one call against causal_conv1d_fn ([B, C, T], F.conv1d, SiLU)."""
    from transformers.models.qwen3_next.modeling_qwen3_next import causal_conv1d_fn
    x, w, b = conv_inputs(T, seed=1)
    b = b if bias else None
    y, state = causal_conv1d_torch(x, w, b)
    ref = causal_conv1d_fn(x.t()[None], w, b, activation="silu")[0].t()
    xp = torch.cat([torch.zeros(3, x.shape[1]), x])
    mag = sum((xp[j:j + T] * w[:, j]).abs() for j in range(4)) + (0 if b is None else b.abs())
    assert ((y - ref).abs() <= (1.1 * 6 + 2) * U32 * mag).all()
    assert torch.equal(state, xp[-3:])          # the last K-1 inputs (zeros before the prompt)


def conv_in_pieces(x, w, b, cuts):
    ys, state, last = [], None, 0
    for c in (*cuts, x.shape[0]):
        y, state = causal_conv1d_torch(x[last:c], w, b, state)
        ys.append(y)
        last = c
    return torch.cat(ys), state


@pytest.mark.parametrize("cuts", [(0,), (64,), (128,), (64, 128, 192)],
                         ids=lambda c: "cut" + "-".join(map(str, c)))
@pytest.mark.parametrize("C", [24, 8192], ids=lambda c: f"C{c}")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_conv_carry_at_chunk_multiples_is_bit_exact(cuts, C, dtype):
    """200 rows cut at multiples of 64, the state handed over, equal one call bit for bit
    (C 8192: Qwen3.5's channels, where torch splits SiLU over threads)."""
    x, w, b = conv_inputs(200, C=C, seed=2, dtype=dtype)
    one, s_one = causal_conv1d_torch(x, w, b)
    y, state = conv_in_pieces(x, w, b, cuts)
    assert torch.equal(y, one) and torch.equal(state, s_one)


@pytest.mark.parametrize("cuts", [(1,), (3,), (100,), (1, 2, 3, 50, 51)],
                         ids=lambda c: "cut" + "-".join(map(str, c)))
def test_conv_carry_elsewhere_within_an_ulp(cuts):
    """Cut off the 64-row grid (the decode step's one row included), the sums are the same
    and SiLU may move by one fp32 ulp (its exp's vector or scalar path); the state is exact."""
    x, w, b = conv_inputs(200, seed=2)
    one, s_one = causal_conv1d_torch(x, w, b)
    y, state = conv_in_pieces(x, w, b, cuts)
    assert torch.equal(state, s_one)
    assert ((y - one).abs() <= 2 * U32 * one.abs()).all()


def test_conv_bad_state_one_line():
    x, w, b = conv_inputs(5)
    with pytest.raises(StrataError) as e:
        causal_conv1d_torch(x, w, b, torch.zeros(4, x.shape[1]))
    assert "\n" not in str(e.value)


def conv_kernel_case(T, C, dtype, bias, carried, seed, device="cpu"):
    x, w, b = conv_inputs(T, C=C, seed=seed, dtype=dtype)
    gen = torch.Generator().manual_seed(seed + 100)
    state = torch.randn(3, C, generator=gen).to(dtype) if carried else None
    args = [t.to(device) if t is not None else None
            for t in (x, w, b if bias else None, state)]
    y, s = causal_conv1d(*args)
    ref, s_ref = causal_conv1d_torch(*args)
    xp = torch.cat([state if carried else torch.zeros(3, C, dtype=dtype), x]).float()
    mag = sum((xp[j:j + T] * w.float()[:, j]).abs() for j in range(4)) + \
        (b.float().abs() if bias else 0)
    bound = (1.1 * 6 + 2) * U32 * mag.to(device)
    if dtype != torch.float32:
        bound = bound + bf16_step(ref)
    assert not y.isnan().any()
    assert ((y.float() - ref.float()).abs() <= bound).all()
    assert torch.equal(s, s_ref)               # the carried inputs are copied, not computed
    return y, s


@pytest.mark.parametrize("carried", [False, True], ids=["fresh", "carried"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("T", [1, 2, 3, 64, 65, 150], ids=lambda t: f"T{t}")
@pytest.mark.parametrize("C", [24, 200], ids=lambda c: f"C{c}")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_conv_kernel_matches_its_twin(T, C, dtype, bias, carried):
    """The Triton conv (interpreted here) against the torch twin on fresh random data: rows
    fewer than the carry, a partial row tile (65, 150 of 64), a partial channel tile (200 of
    128), a carried state or none; the output poisoned before the launch."""
    conv_kernel_case(T, C, dtype, bias, carried, seed=T * 7 + C)


@pytest.mark.parametrize("cuts", [(1,), (3,), (64,), (1, 2, 3, 50, 51, 130)],
                         ids=lambda c: "cut" + "-".join(map(str, c)))
def test_conv_kernel_carry_is_bit_exact_anywhere(cuts):
    """The kernel's row does not depend on the call it falls in: 200 rows cut anywhere (the
    decode step's one row included), the state handed over, equal one call bit for bit."""
    x, w, b = conv_inputs(200, C=200, seed=5, dtype=torch.bfloat16)
    one, s_one = causal_conv1d(x, w, b)
    ys, state, last = [], None, 0
    for c in (*cuts, 200):
        y, state = causal_conv1d(x[last:c], w, b, state)
        ys.append(y)
        last = c
    assert torch.equal(torch.cat(ys), one) and torch.equal(state, s_one)


@pytest.mark.parametrize("split", [64, 100, 199], ids=lambda s: f"split{s}")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_a_split_conv_is_the_one_output_s_columns(split, dtype):
    """split: the columns before it and from it land in two contiguous outputs (q and k, then
    v), bit for bit the one-output call's columns, for the kernel (a split inside a channel
    tile: 100, 199; on a tile edge: 64) and its twin alike; the state is the same; a split
    outside [0, C) is refused in one line."""
    x, w, b = conv_inputs(70, C=200, seed=9, dtype=dtype)
    state = torch.randn(3, 200, generator=torch.Generator().manual_seed(3)).to(dtype)
    for conv in (causal_conv1d, causal_conv1d_torch):
        one, s_one = conv(x, w, b, state)
        (left, right), s = conv(x, w, b, state, split=split)
        assert left.is_contiguous() and right.is_contiguous()
        assert left.shape == (70, split) and right.shape == (70, 200 - split)
        assert torch.equal(left, one[:, :split]) and torch.equal(right, one[:, split:])
        assert torch.equal(s, s_one)
        for bad in (200, -1, True):
            with pytest.raises(StrataError) as e:
                conv(x, w, b, split=bad)
            assert "\n" not in str(e.value) and "split" in str(e.value)


def test_conv_kernel_refusals_are_the_twins():
    x, w, b = conv_inputs(5)
    for conv in (causal_conv1d, causal_conv1d_torch):
        with pytest.raises(StrataError) as e:
            conv(x, w, b, torch.zeros(4, x.shape[1]))
        assert "\n" not in str(e.value) and "state" in str(e.value)
        with pytest.raises(StrataError) as e:
            conv(x, w, b, activation="gelu")
        assert "\n" not in str(e.value) and "activation" in str(e.value)


@pytest.mark.gpu
@pytest.mark.parametrize("T", [1, 3, 4096], ids=lambda t: f"T{t}")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_conv_kernel_matches_its_twin_on_the_gpu(T, dtype):
    """Compiled, at Qwen3.5's 8192 channels, a carried state, against the twin on the GPU."""
    conv_kernel_case(T, 8192, dtype, False, True, seed=T, device="cuda")


# -- the gates -------------------------------------------------------------------------------
def test_gates_are_transformers():
    """beta = sigmoid(b) in b's dtype, g = -exp(A_log) softplus(a + dt_bias) in fp32, the lines
    of Qwen3NextGatedDeltaNet.forward, and g <= 0 (the decay the bound of the rule needs)."""
    gen = torch.Generator().manual_seed(3)
    a, b = torch.randn(9, 4, generator=gen).bfloat16(), torch.randn(9, 4, generator=gen).bfloat16()
    A_log = torch.empty(4).uniform_(0.01, 16, generator=gen).log()
    dt = torch.rand(4, generator=gen)
    g, beta = delta_gates(a, b, A_log, dt)
    assert beta.dtype == torch.bfloat16 and torch.equal(beta, b.sigmoid())
    assert g.dtype == torch.float32 and (g <= 0).all()
    assert torch.equal(g, -A_log.float().exp() * F.softplus(a.float() + dt))


# -- the norms -------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(1, 1, 128), (65, 2, 128), (7, 3, 48), (5, 1)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_l2norm(shape, dtype):
    from transformers.models.qwen3_next.modeling_qwen3_next import l2norm as hf_l2norm
    gen = torch.Generator().manual_seed(4)
    x = (3 * torch.randn(shape, generator=gen)).to(dtype)
    got, ref = l2norm(x), l2norm_torch(x)
    assert got.dtype == torch.float32 and got.shape == x.shape
    assert torch.equal(ref, hf_l2norm(x.float()))
    assert ((got - ref).abs() <= (shape[-1] + 4) * U32 * ref.abs()).all()
    out = torch.empty(shape, dtype=torch.float32)
    assert l2norm(x, out=out).data_ptr() == out.data_ptr() and torch.equal(out, got)
    # into a bf16 `out` (fla's operands): the kernel's fp32 result rounded once to nearest even,
    # as torch rounds it (the interpreter's own cast truncates: strata's _rnd rounds on the bits)
    ob = torch.empty(shape, dtype=torch.bfloat16)
    assert l2norm(x, out=ob).data_ptr() == ob.data_ptr() and torch.equal(ob, got.bfloat16())
    assert torch.equal(l2norm_torch(x, out=torch.empty_like(ob)), ref.bfloat16())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_l2norm_reads_split_heads_in_place(dtype):
    """q and k as split views of the conv's [T, C] output ([T, H, N], rows a stride apart that
    no one stride covers) are read where they are: the same values as of a contiguous copy,
    bit for bit, into fp32 and into a bf16 `out`; the source is left as it was."""
    from strata.kernels.deltanet.projections import split_qkv
    gen = torch.Generator().manual_seed(6)
    Hk, Hv, dk, dv = 3, 5, 16, 8
    mixed = (3 * torch.randn(37, 2 * Hk * dk + Hv * dv, generator=gen)).to(dtype)
    keep = mixed.clone()
    q, k, _ = split_qkv(mixed, Hk, Hv, dk, dv)
    with pytest.raises(RuntimeError):
        q.view(-1, dk)                                   # the case: rows do not merge
    from strata.kernels.deltanet.norms import _head_rows
    src, R, s_row, s_head, H = _head_rows(q, dk, "l2norm")
    assert src is q and (R, s_row, s_head, H) == (37 * Hk, mixed.shape[1], dk, Hk)   # no copy
    for x in (q, k):
        got = l2norm(x)
        assert torch.equal(got, l2norm(x.contiguous()))
        assert torch.equal(l2norm(x, out=torch.empty(x.shape, dtype=torch.bfloat16)),
                           got.bfloat16())
        assert ((got - l2norm_torch(x)).abs() <= (dk + 4) * U32 * got.abs()).all()
    assert torch.equal(mixed, keep)


@pytest.mark.parametrize("rows,N,dt,wdt", [(65, 128, "fp32", "fp32"), (130, 128, "bf16", "fp32"),
                                          (33, 128, "bf16", "bf16"), (9, 48, "fp32", "fp32"),
                                          (1, 128, "bf16", "bf16")],
                         ids=lambda v: str(v))
def test_gated_rms_norm(rows, N, dt, wdt):
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextRMSNormGated
    dts = {"fp32": torch.float32, "bf16": torch.bfloat16}
    gen = torch.Generator().manual_seed(5)
    x = (2 * torch.randn(rows, N, generator=gen)).to(dts[dt])
    z = (2 * torch.randn(rows, N, generator=gen)).to(dts[dt])
    w = (1 + 0.3 * torch.randn(N, generator=gen)).to(dts[wdt])
    hf = Qwen3NextRMSNormGated(N, eps=EPS).to(dts[wdt])
    with torch.no_grad():
        hf.weight.copy_(w)
        assert torch.equal(gated_rms_norm_torch(x, z, w, EPS), hf(x, z))
    got, ref = gated_rms_norm(x, z, w, EPS), gated_rms_norm_torch(x, z, w, EPS)
    assert got.dtype == x.dtype and got.shape == x.shape
    diff = (got.float() - ref.float()).abs()
    if dt == "fp32":
        assert (diff <= (N + 10) * U32 * ref.abs()).all()
    else:
        xf = x.float()
        n = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)).bfloat16().float()
        moved = w.float().abs() * bf16_step(n) * F.silu(z.float()).abs()
        assert (diff <= moved + bf16_step(ref.float().abs() + moved)).all()


# -- sizes -----------------------------------------------------------------------------------
def test_sizes_of_qwen35():
    """Qwen3.5-35B-A3B's DeltaNet layer (16 key heads, 32 value heads of 128, conv 4, bf16):
    the conv state holds 3 rows of 8192 channels, the recurrent matrix 32 x 128 x 128 fp32."""
    assert conv_state_bytes(16, 32, 128, 128) == 3 * 8192 * 2
    assert recurrent_state_bytes(16, 32, 128, 128) == 3 * 8192 * 2 + 32 * 128 * 128 * 4
    T = 8192
    assert chunk_scratch_bytes(T, 16, 32, 128, 128) == T * 32 * (1 + 128 + 128) * 4
    assert (chunk_scratch_bytes(T, 16, 32, 128, 128, qk_l2norm=True)
            == T * 32 * (1 + 128 + 128) * 4 + 2 * T * 16 * 128 * 4)
    with pytest.raises(StrataError):
        chunk_scratch_bytes(T, 3, 32, 128, 128)


def created(monkeypatch, call) -> list:
    """(shape, dtype) of every tensor `call()` creates through torch.empty."""
    made = []
    empty = torch.empty

    def record(*args, **kw):
        t = empty(*args, **kw)
        made.append((tuple(t.shape), t.dtype))
        return t
    monkeypatch.setattr(torch, "empty", record)
    try:
        call()
    finally:
        monkeypatch.setattr(torch, "empty", empty)
    return made


@pytest.mark.parametrize("T,qk_l2norm,split", [(1, False, False), (1, True, False),
                                               (65, False, False), (65, True, False),
                                               (65, True, True)],
                         ids=["T1-prenormed", "T1-l2norm", "T65-prenormed", "T65-l2norm",
                              "T65-l2norm-split"])
def test_launcher_allocates_what_the_sizes_count(monkeypatch, T, qk_l2norm, split):
    """Every tensor the launcher creates goes through torch.empty: recorded, they are the
    output, the final state and exactly chunk_buffers (names' shapes, fp32), for the launch in
    force (split: the oi buffer too)."""
    Hk, Hv, dk, dv = 1, 2, 32, 16
    gen = torch.Generator().manual_seed(6)
    q, k = torch.randn(T, Hk, dk, generator=gen), torch.randn(T, Hk, dk, generator=gen)
    if not qk_l2norm:
        q, k = l2norm_torch(q), l2norm_torch(k)
    v = torch.randn(T, Hv, dv, generator=gen)
    g, beta = -torch.rand(T, Hv, generator=gen), torch.rand(T, Hv, generator=gen)
    with pin_delta_launch(split=split):
        made = created(monkeypatch, lambda: chunk_gated_delta_rule(q, k, v, g, beta, None,
                                                                   use_qk_l2norm=qk_l2norm))
        planned = deltanet_buffers(_lin_shape(Hk, Hv, dk, dv), T) if qk_l2norm else None
    outputs = [((T, Hv, dv), q.dtype), ((Hv, dk, dv), torch.float32)]
    bufs = chunk_buffers(T, Hk, Hv, dk, dv, qk_l2norm=qk_l2norm, split=split)
    assert ("oi" in {b.name for b in bufs}) == split
    if planned is not None:         # the planner's count under the same launch is this one
        assert planned == bufs
    scratch = [(b.shape, torch.float32) for b in bufs]
    assert sorted(made, key=str) == sorted(outputs + scratch, key=str)
    nbytes = sum(torch.Size(s).numel() * torch.finfo(d).bits // 8 for s, d in made)
    assert nbytes - T * Hv * dv * 4 - Hv * dk * dv * 4 == chunk_scratch_bytes(
        T, Hk, Hv, dk, dv, qk_l2norm=qk_l2norm, split=split)


def _lin_shape(Hk, Hv, dk, dv):
    """A ModelShape whose linear-attention option group has these heads (the planner's input)."""
    from strata.shapes import get_preset
    base = get_preset("tiny-qwen35moe")
    return base.with_(**{"linear.n_k_head": Hk, "linear.n_v_head": Hv,
                         "linear.k_head_dim": dk, "linear.v_head_dim": dv})


@pytest.mark.parametrize("T,kv", [(1, "fp32"), (77, "fp32"), (130, "bf16")])
def test_fla_launcher_allocates_what_the_sizes_count(monkeypatch, T, kv):
    """The fla backend's launcher: every tensor it creates is the output, the final state and
    exactly sizes.fla_buffers in the activations' dtype (h one [Hv, dk, dv] per chunk of 64),
    and the planner's count under the pinned backend is that list at the KV's itemsize."""
    pytest.importorskip("fla", reason="fla-core is not installed")
    from strata.kernels.deltanet.fla_rule import chunk_gated_delta_rule_fla
    from strata.planning import KVPolicy
    Hk, Hv, dk, dv = 1, 2, 32, 16
    dt = torch.float32 if kv == "fp32" else torch.bfloat16
    gen = torch.Generator().manual_seed(7)
    q, k = (torch.randn(T, Hk, dk, generator=gen).to(dt) for _ in range(2))
    v = torch.randn(T, Hv, dv, generator=gen).to(dt)
    g, beta = -torch.rand(T, Hv, generator=gen), torch.rand(T, Hv, generator=gen).to(dt)
    made = created(monkeypatch, lambda: chunk_gated_delta_rule_fla(q, k, v, g, beta, None,
                                                                   use_qk_l2norm=True))
    bufs = chunk_buffers(T, Hk, Hv, dk, dv, qk_l2norm=True, backend="fla", itemsize=dt.itemsize)
    with pin_delta_launch(backend="fla"):
        assert deltanet_buffers(_lin_shape(Hk, Hv, dk, dv), T, KVPolicy(kv)) == bufs
    assert {b.name: b.shape[0] for b in bufs}["h"] == -(-T // 64)
    outputs = [((T, Hv, dv), dt), ((Hv, dk, dv), torch.float32)]
    assert sorted(made, key=str) == sorted(outputs + [(b.shape, b.torch_dtype) for b in bufs],
                                           key=str)
    assert sum(b.nbytes for b in bufs) == chunk_scratch_bytes(
        T, Hk, Hv, dk, dv, qk_l2norm=True, backend="fla", itemsize=dt.itemsize)


def test_fla_sizes_of_qwen35():
    """Qwen3.5's layer at T 32768 in bf16, buffer by buffer: g_cum fp32, A, w, u, v_new, h (512
    chunks of a [32, 128, 128] state), the fp32 final state, qn and kn: 1,670 MiB (fla-core's own
    wrapper peaked 1,930 MiB above its inputs on the H100 with its o, its gate and norm copies;
    the launcher's own peak is held to this count by the GPU test in test_deltanet_chunk)."""
    T, Hk, Hv, d = 32768, 16, 32, 128
    got = chunk_scratch_bytes(T, Hk, Hv, d, d, qk_l2norm=True, backend="fla", itemsize=2)
    want = (T * Hv * 4 + T * Hv * 64 * 2 + 3 * T * Hv * d * 2 + 512 * Hv * d * d * 2
            + Hv * d * d * 4 + 2 * T * Hk * d * 2)
    assert got == want and round(got / 2**20) == 1670
    with pytest.raises(StrataError):
        chunk_buffers(T, Hk, Hv, d, d, backend="cutlass")


@pytest.mark.gpu
def test_gpu_peak_memory_is_the_sizes():
    """On CUDA the call's peak allocation above its inputs is the outputs plus the scratch the
    sizes count, in bytes requested (the caching allocator's allocated bytes round each block up
    to 512 bytes and count a reused block whole when less than 1 MiB of it would be left)."""
    T, Hk, Hv, dk, dv = 4096, 16, 32, 128, 128
    dev = torch.device("cuda")
    q, k = (torch.randn(T, Hk, dk, device=dev, dtype=torch.bfloat16) for _ in range(2))
    v = torch.randn(T, Hv, dv, device=dev, dtype=torch.bfloat16)
    g, beta = -torch.rand(T, Hv, device=dev), torch.rand(T, Hv, device=dev)
    with pin_delta_launch(backend="strata"):    # strata's sizes (fla's: test_deltanet_chunk)
        chunk_gated_delta_rule(q, k, v, g, beta, None, use_qk_l2norm=True)     # compile first
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_stats()["requested_bytes.all.current"]
        o, S = chunk_gated_delta_rule(q, k, v, g, beta, None, use_qk_l2norm=True)
        torch.cuda.synchronize()
    peak = torch.cuda.memory_stats()["requested_bytes.all.peak"] - base   # a reused block counts whole
    want = (chunk_scratch_bytes(T, Hk, Hv, dk, dv, qk_l2norm=True)
            + o.numel() * o.element_size() + S.numel() * 4)
    assert want <= peak <= want + 512 * 8


@pytest.mark.parametrize("fn", [causal_conv1d, causal_conv1d_torch], ids=["kernel", "twin"])
def test_the_conv_carry_is_its_own_rows_not_a_view_of_the_input(fn):
    """The carried K-1 rows are a compact copy: a view would hold the whole [T, C] input (Qwen3.5's
    qkv projection, 537 MB at a 32K chunk) alive until the layer returns."""
    g = torch.Generator().manual_seed(2)
    x, w = torch.randn(40, 24, generator=g), torch.randn(24, 4, generator=g)
    _, state = fn(x, w)
    assert state.shape == (3, 24) and torch.equal(state, x[-3:])
    assert state.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
    assert state.untyped_storage().nbytes() == state.numel() * state.element_size()
