"""The fused norms (strata.kernels.norm) against their plain-torch twins, the models' own code.

What is held, and why it is the right bar:
- exact sums: inputs on a grid of 1/8 with small integers make every fp32 sum of squares exact,
  so any summation order gives the same mean square; then every rounding step (to x's dtype
  before the weight, to the output's after it, the rope's products and sum) must match the
  twin's bit for bit. This is what pins the rounding steps: leaving one out moves results by
  under a bf16 step, which the random-data bounds below would forgive.
- random data: the sum order differs, so the fp32 mean square differs by a few fp32 ulps. Then
  the normed value x·r rounded to x's dtype differs by at most one step of that dtype (the
  claim), the weighted output by what that one step becomes through w plus one rounding
  (`norm_bound`), and the rope's output by what the normed inputs' errors become through the
  rotation plus one rounding and, on the GPU, a contracted multiply-add (`rope_bound`). fp32
  inputs: the sum-order bound (N + 6) u relative (u = 2^-24).
Outputs start as NaN (tests/conftest.py poisons torch.empty), so an element a kernel never
writes fails every comparison. Row counts are not multiples of the row block; widths include
non-powers of two (masked columns) and the shapes the models use (2048, 128 over T·h rows).
"""
from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from hypothesis import example, given, settings, strategies as st

from strata.errors import StrataError
from strata.kernels import norm
from strata.kernels.norm import (NormTile, norm_impl, norm_tile, pin_norm, qk_norm_rope,
                                 qk_norm_rope_supported, qk_norm_rope_torch, rms_norm,
                                 rms_norm_torch)
from strata.models.layers import apply_rope, rope_cos_sin, yarn_cos_sin
from tests.kernels.compiled import compile_lines

EPS = 1e-6
U32 = 2.0 ** -24
MANT = {torch.bfloat16: 7, torch.float16: 10, torch.float32: 23}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def step(v: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The spacing of `dtype` at |v| (fp32 tensor): 2^(floor(log2 |v|) - mantissa bits), at
    least the smallest subnormal step."""
    _, e = torch.frexp(v.abs().float())
    s = torch.ldexp(torch.ones_like(v, dtype=torch.float32), e - 1 - MANT[dtype])
    low = {torch.bfloat16: 2.0 ** -133, torch.float16: 2.0 ** -24, torch.float32: 2.0 ** -149}
    return s.clamp_min(low[dtype])


def ulps(a: torch.Tensor, b: torch.Tensor) -> int:
    """The largest distance between a and b in representable values of their dtype (16 bit)."""
    bits = {torch.bfloat16: torch.int16, torch.float16: torch.int16}[a.dtype]
    ia, ib = a.view(bits).int(), b.view(bits).int()
    ia = torch.where(ia < 0, -(ia & 0x7FFF), ia)     # sign-magnitude -> ordered integers
    ib = torch.where(ib < 0, -(ib & 0x7FFF), ib)
    return int((ia - ib).abs().max()) if a.numel() else 0


def norm_bound(x, w, eps=EPS):
    """Per-element bound on |kernel - twin| of rms_norm(x, w) under another fp32 sum order."""
    y = rms_norm_torch(x, None, eps).float()                     # x·r rounded to x's dtype
    ref = rms_norm_torch(x, w, eps).float()
    if x.dtype == torch.float32:
        return (x.shape[-1] + 6) * U32 * ref.abs()
    if w is None:
        return step(y, x.dtype)
    odt = torch.promote_types(w.dtype, x.dtype)
    moved = w.float().abs() * step(y, x.dtype)                  # one step of y, through w
    return moved + step(ref.abs() + moved, odt)


def rope_bound(x, w, cos, sin, eps=EPS):
    """Per-element bound on |kernel - twin| of qk_norm_rope: the normed inputs' errors through
    the rotation, the fp32 error of the products (a contracted multiply-add on the GPU), one
    rounding of the output. [h, T, hd]."""
    n = (x if w is None else rms_norm_torch(x, w, eps)).float()            # [T, h, hd]
    e = torch.zeros_like(n) if w is None else norm_bound(x, w, eps)
    hd, R = n.shape[-1], cos.shape[-1]
    half = R // 2       # partial rotary: dims R.. pass through (cos 1, sin 0 there)
    rot = lambda t: torch.cat([t[..., half:R], t[..., :half], t[..., R:]], dim=-1)  # noqa: E731
    def pad(t, v):   # cos/sin [T, R] -> [T, hd]
        return torch.cat([t, torch.full((t.shape[0], hd - R), v, dtype=t.dtype,
                                        device=t.device)], dim=1)
    c, s = pad(cos, 1.0)[:, None, :].abs(), pad(sin, 0.0)[:, None, :].abs()  # [T, 1, hd]
    moved = e * c + rot(e) * s
    prods = 2 * U32 * (n.abs() * c + rot(n).abs() * s)
    ref = qk_norm_rope_torch(x, w, cos, sin, eps).float().transpose(0, 1)  # [T, h, hd]
    odt = x.dtype if w is None else torch.promote_types(w.dtype, x.dtype)
    return (moved + prods + step(ref.abs() + moved + prods, odt)).transpose(0, 1)


def same_layout(a, b) -> bool:
    """Equal strides over every dimension longer than 1 (a size-1 dim's stride is arbitrary)."""
    return a.shape == b.shape and all(sa == sb for sa, sb, n in
                                      zip(a.stride(), b.stride(), a.shape) if n > 1)


def exact_grid(shape, gen, dtype):
    """Values k/8, |k| <= 16: squares and their sums are exact in fp32 in any order."""
    return (torch.randint(-16, 17, shape, generator=gen) / 8).to(dtype)


# -- rms_norm --------------------------------------------------------------------------------
@dataclass(frozen=True)
class RowCase:
    rows: tuple[int, ...]      # leading shape
    N: int
    dtype: str = "bf16"
    weight: str | None = "same"   # "same": x's dtype, "fp32", None: no weight

    @property
    def id(self) -> str:
        lead = "x".join(map(str, self.rows))
        return f"R{lead}-N{self.N}-{self.dtype}-w{self.weight}"


ROW_CASES = [
    RowCase((37,), 2048),                     # the hidden norm's width; 37 rows: no block multiple
    RowCase((5, 3), 128, "bf16"),             # the q/k heads' shape [T, h, hd]
    RowCase((1,), 1, "fp32"),                 # one element: the mean square is x^2
    RowCase((130,), 96, "fp16"),              # masked columns (BN = 128), rows past one block
    RowCase((3,), 8192, "bf16", None),        # the widest the models need, no weight
    RowCase((9,), 7, "fp32", "same"),
    RowCase((33,), 300, "bf16", "fp32"),      # w fp32 x bf16: the output is fp32
    RowCase((2, 3, 4), 64, "fp16", None),     # three leading dims
]


def inputs(c: RowCase, seed: int, exact: bool, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    dt = DTYPES[c.dtype]
    x = (exact_grid((*c.rows, c.N), gen, dt) if exact
         else (torch.randn(*c.rows, c.N, generator=gen) * 3).to(dt))
    w = None
    if c.weight is not None:
        w = (1 + 0.5 * torch.randn(c.N, generator=gen)).to(dt if c.weight == "same"
                                                             else torch.float32)
        w = w.to(device)
    return x.to(device), w


@pytest.mark.parametrize("c", ROW_CASES, ids=lambda c: c.id)
def test_rms_norm_exact_sums_are_bit_exact(c):
    x, w = inputs(c, 1, exact=True)
    got = rms_norm(x, w, EPS)
    assert got.shape == x.shape and got.dtype == rms_norm_torch(x, w, EPS).dtype
    assert torch.equal(got, rms_norm_torch(x, w, EPS))


@pytest.mark.parametrize("c", ROW_CASES, ids=lambda c: c.id)
def test_rms_norm_random_within_one_step(c):
    x, w = inputs(c, 2, exact=False)
    got, ref = rms_norm(x, w, EPS), rms_norm_torch(x, w, EPS)
    assert torch.isfinite(got).all()
    if w is None and x.dtype != torch.float32:
        assert ulps(got, ref) <= 1
    assert ((got.float() - ref.float()).abs() <= norm_bound(x, w)).all()


def test_rms_norm_reads_strided_rows():
    """Rows with a stride past their width (a slice of a wider matrix, MLA's latent) are read in
    place; the result is contiguous."""
    gen = torch.Generator().manual_seed(3)
    big = exact_grid((11, 200), gen, torch.bfloat16)
    x, w = big[:, :136], exact_grid((136,), gen, torch.bfloat16)
    got = rms_norm(x, w, EPS)
    assert got.is_contiguous() and torch.equal(got, rms_norm_torch(x, w, EPS))


@settings(max_examples=25)
@given(rows=st.integers(1, 70), N=st.integers(1, 300), dtype=st.sampled_from(sorted(DTYPES)),
       weight=st.sampled_from([None, "same", "fp32"]), bm=st.sampled_from([None, 1, 4, 16]),
       seed=st.integers(0, 2 ** 16))
@example(rows=1, N=1, dtype="bf16", weight="same", bm=None, seed=0).via("one element")
@example(rows=17, N=256, dtype="bf16", weight="same", bm=16, seed=1).via(
    "a last block of one row")
def test_rms_norm_property_exact_sums(rows, N, dtype, weight, bm, seed):
    """On inputs whose sums are exact, any shape and any pinned row block give the twin's bits."""
    c = RowCase((rows,), N, dtype, weight)
    x, w = inputs(c, seed, exact=True)
    tile = None if bm is None else NormTile(bm, 4)
    assert torch.equal(rms_norm(x, w, EPS, tile=tile), rms_norm_torch(x, w, EPS))


def test_rms_norm_empty_and_bad_inputs():
    x = torch.empty(0, 64, dtype=torch.bfloat16)
    assert rms_norm(x, None, EPS).shape == (0, 64)
    with pytest.raises(StrataError, match="weight must be a float \\[64\\]"):
        rms_norm(torch.ones(2, 64), torch.ones(32), EPS)
    with pytest.raises(StrataError, match="unit stride"):
        rms_norm(torch.ones(64, 2).t(), None, EPS)
    with pytest.raises(StrataError, match="at least one element"):
        rms_norm(torch.ones(3, 0), None, EPS)
    with pytest.raises(StrataError, match="at most"):
        rms_norm(torch.ones(1, norm.MAX_N + 1), None, EPS)
    with pytest.raises(StrataError, match="power of two"):
        NormTile(3, 4)


def test_norm_tile_holds_whole_rows():
    """A program's rows hold ROW_ELEMS elements (one row when a row is wider)."""
    import triton
    for n in (1, 7, 128, 2048, 8192, norm.MAX_N):
        t = norm_tile(n)
        bn = triton.next_power_of_2(n)
        assert 4 <= t.num_warps <= 16 and t == norm_tile(n)
        assert t.block_m * bn == max(norm.ROW_ELEMS, bn)


# -- qk_norm_rope -----------------------------------------------------------------------------
@dataclass(frozen=True)
class HeadCase:
    T: int
    h: int
    hd: int
    dtype: str = "bf16"
    weight: str | None = "same"
    rope: str = "neox"        # "neox": rope_cos_sin; "yarn": yarn_cos_sin (scaled cos/sin)
    P: int = 0                # the chunk's first position
    rot: int = 0              # rotary dims (0: all hd; fewer: partial rotary, the rest passed)

    @property
    def id(self) -> str:
        return (f"T{self.T}-h{self.h}-hd{self.hd}-{self.dtype}-w{self.weight}-{self.rope}-P{self.P}"
                + (f"-rot{self.rot}" if self.rot else ""))


HEAD_CASES = [
    HeadCase(37, 4, 128),                        # Qwen3's q/k heads, rows = 148: not a multiple
    HeadCase(37, 4, 128, weight=None),           # Mixtral / GPT-OSS: rope only
    HeadCase(5, 3, 64, "fp32", P=1000),          # fp32, far positions
    HeadCase(9, 2, 96, "bf16", P=3),             # hd / 2 = 48: masked half columns
    HeadCase(1, 1, 16, "fp16"),
    HeadCase(13, 8, 64, "bf16", None, "yarn", P=40),   # GPT-OSS: YaRN cos/sin, no norm
    HeadCase(7, 2, 32, "bf16", "fp32"),          # an fp32 norm weight: fp32 output
    HeadCase(11, 4, 256, P=77, rot=64),          # Qwen3.5 / Qwen3-Next: 64 of 256 rotated
    HeadCase(9, 3, 128, weight=None, rot=64),    # MiniMax-M2 (norm over the projection)
    HeadCase(6, 2, 96, "fp32", rot=48, P=5),     # GLM-4.5: half rotary, hd 96 (masked cols)
    HeadCase(3, 2, 16, "bf16", "fp32", rot=2),   # one rotated pair
]


def head_inputs(c: HeadCase, seed: int, exact: bool, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    dt = DTYPES[c.dtype]
    flat = (exact_grid((c.T, c.h * c.hd), gen, dt) if exact
            else (torch.randn(c.T, c.h * c.hd, generator=gen) * 3).to(dt))
    x = flat.view(c.T, c.h, c.hd)                          # the projection's view
    w = None
    if c.weight is not None:
        w = (1 + 0.5 * torch.randn(c.hd, generator=gen)).to(dt if c.weight == "same"
                                                              else torch.float32)
        w = w.to(device)
    pos = torch.arange(c.P, c.P + c.T)
    R = c.rot or c.hd
    if c.rope == "yarn":
        cos, sin = yarn_cos_sin(pos, R, 150000.0, 32.0, 4096)
    else:
        cos, sin = rope_cos_sin(pos, R, 1e6)
    return x.to(device), w, cos.to(device), sin.to(device)


@pytest.mark.parametrize("c", HEAD_CASES, ids=lambda c: c.id)
def test_qk_norm_rope_exact_sums_are_bit_exact(c):
    """The fused pass is the models' two steps, apply_rope(rms_norm(x).transpose(0, 1)), bit for
    bit where the sums are exact (the interpreter does no multiply-add contraction)."""
    x, w, cos, sin = head_inputs(c, 4, exact=True)
    got = qk_norm_rope(x, w, cos, sin, EPS)
    n = x if w is None else rms_norm_torch(x, w, EPS)
    want = apply_rope(n.transpose(0, 1), cos, sin)
    assert got.shape == (c.h, c.T, c.hd) and got.dtype == want.dtype
    assert torch.equal(got, want)


@pytest.mark.parametrize("c", HEAD_CASES, ids=lambda c: c.id)
def test_qk_norm_rope_random_within_bound(c):
    x, w, cos, sin = head_inputs(c, 5, exact=False)
    got, ref = qk_norm_rope(x, w, cos, sin, EPS), qk_norm_rope_torch(x, w, cos, sin, EPS)
    assert torch.isfinite(got).all()
    if w is None:   # no sum: the same products in the same order
        assert torch.equal(got, ref)
    assert ((got.float() - ref.float()).abs() <= rope_bound(x, w, cos, sin)).all()


@settings(max_examples=15)
@given(T=st.integers(1, 12), h=st.integers(1, 5), half=st.integers(1, 40),
       dtype=st.sampled_from(sorted(DTYPES)), weight=st.sampled_from([None, "same", "fp32"]),
       P=st.integers(0, 5000), bm=st.sampled_from([None, 1, 8]), seed=st.integers(0, 2 ** 16),
       rot=st.integers(0, 40))
@example(T=1, h=1, half=1, dtype="bf16", weight="same", P=0, bm=None, seed=0, rot=0).via(
    "hd = 2: one rotated pair")
@example(T=3, h=5, half=64, dtype="bf16", weight="same", P=7, bm=8, seed=1, rot=0).via(
    "rows = 15: a last block of 7 rows")
@example(T=3, h=5, half=64, dtype="bf16", weight="same", P=7, bm=8, seed=1, rot=16).via(
    "partial rotary: 32 of 128 dims, a last block of 7 rows")
def test_qk_norm_rope_property_exact_sums(T, h, half, dtype, weight, P, bm, seed, rot):
    """On inputs whose sums are exact, any (T, h, even hd), rotary width (full, or 2·rot < hd
    dims), start position and row block give the twin's bits."""
    c = HeadCase(T, h, 2 * half, dtype, weight, P=P, rot=2 * rot if 0 < rot < half else 0)
    x, w, cos, sin = head_inputs(c, seed, exact=True)
    tile = None if bm is None else NormTile(bm, 4)
    got, ref = qk_norm_rope(x, w, cos, sin, EPS, tile=tile), qk_norm_rope_torch(x, w, cos, sin, EPS)
    assert torch.equal(got, ref) and same_layout(got, ref)


def test_qk_norm_rope_layout_is_the_twins():
    """[h, T, hd], the transposed view of a [T, h, hd] buffer: the strides torch's apply_rope
    gives the models' x.transpose(0, 1), so attend / PromptKV / KVCache see what they saw."""
    for rot in (0, 16):      # full and partial rotary (the twin writes into x's layout)
        x, w, cos, sin = head_inputs(HeadCase(6, 4, 32, rot=rot), 6, exact=True)
        got, ref = qk_norm_rope(x, w, cos, sin, EPS), qk_norm_rope_torch(x, w, cos, sin, EPS)
        assert got.stride() == ref.stride() == (32, 4 * 32, 1), rot
        assert got.transpose(0, 1).is_contiguous()


def test_qk_norm_rope_takes_neox_over_even_rotary_dims():
    """Full or partial rotary cos/sin [T, R] (GLM-4.5: R = hd/2, Qwen3.5: hd/4) with R even are
    the kernel's; an odd R, R > hd, non-fp32 cos/sin, an odd head width or a wrong weight are
    not: the wiring keeps the torch code for them."""
    x, w, cos, sin = head_inputs(HeadCase(4, 2, 32), 7, exact=True)
    assert qk_norm_rope_supported(x, w, cos, sin)
    assert qk_norm_rope_supported(x, None, cos, sin)
    assert qk_norm_rope_supported(x, w, cos[:, :16].contiguous(), sin[:, :16].contiguous())
    assert not qk_norm_rope_supported(x, w, cos[:, :15].contiguous(), sin[:, :15].contiguous())
    big = torch.ones(4, 34)
    assert not qk_norm_rope_supported(x, w, big, big)
    assert not qk_norm_rope_supported(x, w, cos.bfloat16(), sin.bfloat16())
    assert not qk_norm_rope_supported(x, w[:16], cos, sin)
    assert not qk_norm_rope_supported(x[..., :31], None, cos[:, :31], sin[:, :31])
    with pytest.raises(StrataError, match="qk_norm_rope takes"):
        qk_norm_rope(x, w, cos[:, :15], sin[:, :15], EPS)


# -- the switch ---------------------------------------------------------------------------
def test_norm_impl_defaults_and_pins():
    cpu16 = torch.ones(2, dtype=torch.bfloat16)
    assert norm_impl(cpu16) == "torch" and norm_impl(torch.ones(2)) == "torch"
    with pin_norm("triton"):
        assert norm_impl(torch.ones(2)) == "triton"
        with pin_norm("torch"):
            assert norm_impl(cpu16) == "torch"
        assert norm_impl(cpu16) == "triton"
    assert norm_impl(cpu16) == "torch"
    with pytest.raises(StrataError, match="pin_norm takes"):
        with pin_norm("cuda"):
            pass


def test_norm_kernels_compile_for_h200():
    """The norm kernels and the pair RoPE's (strata.kernels.rope_pairs, DeepSeek-V3's 64 rope
    dims) compile for sm_90 with triton's passes and ptxas (no GPU), at qwen3-30b-a3b's
    shapes and Qwen3.5's partial rotary (64 of 256) and norm_tile's tiles, in a process without
    the interpreter, with no register spills (compile_norm.py without --quick: every width and
    head shape, their footprints)."""
    lines, out = compile_lines("compile_norm.py", "--quick", timeout=600)
    assert len(lines) == 4, out
    for line in lines:
        assert "spill 0/0" in line, line


# -- on the GPU: the real shapes (qwen3-30b-a3b: D 2048, H 32, Hkv 4, hd 128) ----------------
@pytest.mark.gpu
@pytest.mark.parametrize("c", [RowCase((4099,), 2048), RowCase((1000, 32), 128),
                               RowCase((257,), 8192, "bf16", None),
                               RowCase((300,), 4096, "fp16")], ids=lambda c: c.id)
def test_rms_norm_gpu(c):
    """Random and exact-sum inputs alike within the bound: on the GPU torch's rsqrt and
    libdevice's need not agree to the bit, so exact sums do not make the results equal; the
    normed value stays within one step either way."""
    for seed, exact in ((8, False), (9, True)):
        x, w = inputs(c, seed, exact=exact, device="cuda")
        got, ref = rms_norm(x, w, EPS), rms_norm_torch(x, w, EPS)
        assert torch.isfinite(got).all()
        assert ((got.float() - ref.float()).abs() <= norm_bound(x, w)).all()
        if x.dtype != torch.float32:
            assert ulps(rms_norm(x, None, EPS), rms_norm_torch(x, None, EPS)) <= 1


@pytest.mark.gpu
@pytest.mark.parametrize("c", [HeadCase(2049, 32, 128, P=8192), HeadCase(2049, 4, 128),
                               HeadCase(515, 64, 64, weight=None, rope="yarn"),
                               HeadCase(77, 16, 256, "fp16"),
                               HeadCase(2049, 16, 256, P=8192, rot=64),
                               HeadCase(1025, 48, 128, weight=None, rot=64),
                               HeadCase(513, 96, 128, rot=64)], ids=lambda c: c.id)
def test_qk_norm_rope_gpu(c):
    x, w, cos, sin = head_inputs(c, 10, exact=False, device="cuda")
    got, ref = qk_norm_rope(x, w, cos, sin, EPS), qk_norm_rope_torch(x, w, cos, sin, EPS)
    assert torch.isfinite(got).all() and same_layout(got, ref)
    assert ((got.float() - ref.float()).abs() <= rope_bound(x, w, cos, sin)).all()
