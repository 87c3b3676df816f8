"""chunk_attention (Triton) against chunk_attention_torch (plain torch) on fresh random data.

Legend: T chunk tokens, P prefix tokens, H query heads, Hkv kv heads, G = H / Hkv, hd head width.

The bound (`attention_bound`), per output element, kernel (bf16 out) against the reference (fp32
out), with u = 2^-8 (bf16's unit roundoff) and A the reference's attention probabilities:
- u · (A @ |V|): the kernel rounds the probabilities to bf16 for the p @ v tensor-core dot
  (int8 V: p · v_scale), each by at most u relative;
- u · |o|: the bf16 output rounding;
- 4δ · (A @ |V|): fp32 noise of the scores, δ = (hd + 2) · 2^-24 · scale · max|q| · max|k| (γ_n of
  an hd-term fp32 dot with Cauchy-Schwarz, the int8 dequantization's rounding in the +2) on
  each side; a softmax turns score errors of at most 2δ into relative p errors of at most 4δ;
- 3 · S · 2^-24 · (A @ |V|): fp32 accumulation of p @ v and of the normalizer over S keys.
A @ |V| is the reference run on |v| (int8: |v_i8| with the same non-negative scales).
`test_the_bound_catches_a_dropped_key` shows it is tight enough to see one missing key.

int8 segments run two ways (AttnTile.int8): "expand" (the default: codes expanded to exact bf16
first, in pieces of the scratch when the prefix is longer, the softmax state carried between
launches) and "kernel" (each tile converted in the attention loop). Both take the same bf16
operands in the same tile order, so in the interpreter they agree bit for bit; on the GPU the two
compiled dots may accumulate in another order, and the tests hold each to the bound above.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch
from hypothesis import example, given, strategies as st

from strata.errors import StrataError
from strata.kernels.attention import (AttnProblem, AttnScratch, AttnTile, KVSegment,
                                      causal_pairs, choose_attn_tile, chunk_attention,
                                      chunk_attention_torch, expand_codes, expand_codes_torch,
                                      pin_attn_tile, quantize_kv, resolve_attn_tile)
from strata.kernels.attention.scratch import (EXPAND_ROWS, expand_rows, needs_state,
                                              plan_pieces, state_floats)
from tests.kernels.compiled import compile_lines

U = 2.0 ** -8
U32 = 2.0 ** -24


@dataclass(frozen=True)
class Case:
    T: int
    P: int
    H: int
    Hkv: int
    hd: int = 16
    kv: str = "bf16"          # the prefix's dtype
    split: int | None = None  # prefix given as two segments [0, split), [split, P)

    @property
    def id(self) -> str:
        s = f"-split{self.split}" if self.split is not None else ""
        return f"T{self.T}-P{self.P}-G{self.H // self.Hkv}-Hkv{self.Hkv}-hd{self.hd}-{self.kv}{s}"


def make_inputs(c: Case, device, seed=0):
    """q, k, v and the prefix segments (int8 ones quantized from random bf16 keys/values)."""
    gen = torch.Generator().manual_seed(seed)

    def rnd(*shape):
        return torch.randn(*shape, generator=gen).to(torch.bfloat16).to(device)

    q, k, v = rnd(c.T, c.H, c.hd), rnd(c.T, c.Hkv, c.hd), rnd(c.T, c.Hkv, c.hd)
    pk, pv = rnd(c.P, c.Hkv, c.hd), rnd(c.P, c.Hkv, c.hd)
    cuts = [0, c.P] if c.split is None else [0, c.split, c.P]
    segs = []
    for a, b in zip(cuts, cuts[1:]):
        if c.kv == "int8":
            (qk, sk), (qv, sv) = quantize_kv(pk[a:b]), quantize_kv(pv[a:b])
            segs.append(KVSegment(qk, qv, sk, sv))
        else:
            segs.append(KVSegment(pk[a:b], pv[a:b]))
    return q, k, v, segs


def _abs_v(segs):
    return [KVSegment(s.k, s.v.abs(), s.k_scale, s.v_scale) for s in segs]


def attention_bound(q, k, v, segs, ref, sm_scale=None, int8_path=None):
    """The per-element bound of the module docstring. `int8_path`: the tile's int8 choice (None:
    the one a launch resolves now, pins included); "dequant" rounds each dequantized int8 K and V
    element to bf16 once more: u relative on V, and on K a score error of at most
    eps = u · scale · max|q| · max|k| (Cauchy-Schwarz), 4 eps relative on the probabilities."""
    T, H, hd = q.shape
    scale = 1.0 / math.sqrt(hd) if sm_scale is None else sm_scale
    keys = [s.dequantized()[0] for s in segs] + [k.float()]
    S = sum(x.shape[0] for x in keys)
    kmax = max(x.norm(dim=-1).max().item() for x in keys if x.numel())
    qmax = q.float().norm(dim=-1).max().item()
    delta = (hd + 2) * U32 * scale * qmax * kmax
    a_absv = chunk_attention_torch(q, k, v.abs(), _abs_v(segs), sm_scale=sm_scale,
                                   out=torch.empty(q.shape, device=q.device))
    if int8_path is None:
        int8_path = resolve_attn_tile(AttnProblem(T * H // k.shape[1], hd)).int8
    rounding = 0.0
    if int8_path == "dequant" and any(s.int8 and s.length for s in segs):
        rounding = U + 4 * U * scale * qmax * kmax
    return (U + 4 * delta + 3 * S * U32 + rounding) * a_absv + U * ref.abs()


def check(c: Case, device, tile: AttnTile | None = None, seed=0, scratch=None):
    q, k, v, segs = make_inputs(c, device, seed)
    out = torch.full_like(q, float("nan"))
    got = chunk_attention(q, k, v, segs, out=out, tile=tile, scratch=scratch)
    assert got is out
    ref = chunk_attention_torch(q, k, v, segs, out=torch.empty(q.shape, device=device))
    assert torch.isfinite(got).all(), "the kernel left rows unwritten (NaN poison survived)"
    err = (got.float() - ref).abs()
    bound = attention_bound(q, k, v, segs, ref,
                            int8_path=resolve_attn_tile(AttnProblem(c.T * c.H // c.Hkv, c.hd),
                                                        tile).int8)
    worst = (err / bound).max().item()
    assert worst <= 1.0, f"{c.id}: error {err.max().item():.3e}, {worst:.2f}x the bound"
    return got


# odd lengths on purpose: a chunk of 1 token, a prefix of 0 / 1 key, lengths that end inside a
# tile (100, 257 with BLOCK_N 64; 63, 129 rows of G with BLOCK_M 128)
LENGTHS = [Case(T, P, 4, 1, kv=kv) for kv in ("bf16", "int8") for T in (1, 7, 63, 129)
           for P in (0, 1, 100, 257)]
# GQA: G = 1, 2, 4, 8 (G = 8 over two kv heads is Qwen3-30B's grouping)
GROUPS = [Case(63, 100, H, Hkv, kv=kv) for kv in ("bf16", "int8")
          for H, Hkv in ((2, 2), (4, 2), (4, 1), (16, 2))]


@pytest.mark.parametrize("c", LENGTHS, ids=lambda c: c.id)
def test_odd_lengths(c, device):
    check(c, device)


@pytest.mark.parametrize("c", GROUPS, ids=lambda c: c.id)
def test_gqa_groups(c, device):
    check(c, device)


# small pinned tiles: several full and diagonal chunk tiles per program, a G that does not
# divide BLOCK_M's token boundary evenly (G = 2 with 16 rows is 8 tokens; T = 21 ends mid-tile)
SMALL = [Case(21, 37, 4, 2, kv="bf16"), Case(21, 37, 4, 2, kv="int8", split=16),
         Case(33, 0, 8, 1, hd=32)]


@pytest.mark.parametrize("c", SMALL, ids=lambda c: c.id)
def test_small_tiles(c, device):
    check(c, device, tile=AttnTile(16, 16, 4, 1))


@pytest.mark.parametrize("kv", ["bf16", "int8"])
def test_two_segments_equal_one(kv, device):
    """The prefix split where the engine splits it (host-streamed + resident, on a multiple of
    BLOCK_N: chunk sizes live on the 256 grid) visits the same key tiles as the concatenated
    prefix: bit-identical. Split mid-tile, the tiles differ: both stay within the bound."""
    whole = Case(40, 160, 4, 2, kv=kv)
    one = check(whole, device)
    assert torch.equal(check(Case(40, 160, 4, 2, kv=kv, split=64), device), one)
    check(Case(40, 160, 4, 2, kv=kv, split=37), device)


def test_int8_and_bf16_segments_mix(device):
    q, k, v, (seg,) = make_inputs(Case(9, 70, 4, 2), device)
    (qk, sk), (qv, sv) = quantize_kv(seg.k[:30]), quantize_kv(seg.v[:30])
    segs = [KVSegment(qk, qv, sk.half(), sv.half()), KVSegment(seg.k[30:], seg.v[30:])]
    got = chunk_attention(q, k, v, segs)
    ref = chunk_attention_torch(q, k, v, segs, out=torch.empty(q.shape, device=device))
    assert ((got.float() - ref).abs() <= attention_bound(q, k, v, segs, ref)).all()


def int8_prefix_bound(q, k, v, seg_bf16, seg_int8, sm_scale=None):
    """|o(int8 prefix) - o(bf16 prefix)| per element, both exact: a key off by at most
    s_k/2 per element moves a score by at most Δ = scale · ||q_t||_1 · max s_k / 2, which moves
    every probability by a factor within e^{±2Δ}: (e^{2Δ} - 1) · (A @ |V|); a value off by at most
    s_v / 2 moves the average by at most max s_v / 2 (kv_int8's round-trip slack included)."""
    hd = q.shape[-1]
    scale = 1.0 / math.sqrt(hd) if sm_scale is None else sm_scale
    slack = 0.5 + 2.0 ** -16
    dk = scale * q.float().abs().sum(-1, keepdim=True) * seg_int8.k_scale.max() * slack  # [T, H, 1]
    a_absv = chunk_attention_torch(q, k, v.abs(), _abs_v([seg_bf16]),
                                   out=torch.empty(q.shape, device=q.device))
    return torch.expm1(2 * dk) * a_absv + seg_int8.v_scale.max() * slack


def test_int8_prefix_vs_bf16_prefix(device):
    """What int8 KV costs at the attention's output, against a named bound (issue 14's int8 vs
    bf16 logits start here): the kernel on the int8 prefix against the reference on the bf16
    prefix it was quantized from, within int8_prefix_bound plus the kernel's own bound."""
    c = Case(33, 300, 8, 2)
    q, k, v, (seg,) = make_inputs(c, device)
    (qk, sk), (qv, sv) = quantize_kv(seg.k), quantize_kv(seg.v)
    seg8 = KVSegment(qk, qv, sk, sv)
    got = chunk_attention(q, k, v, [seg8])
    ref8 = chunk_attention_torch(q, k, v, [seg8], out=torch.empty(q.shape, device=device))
    ref16 = chunk_attention_torch(q, k, v, [seg], out=torch.empty(q.shape, device=device))
    bound = attention_bound(q, k, v, [seg8], ref8) + int8_prefix_bound(q, k, v, seg, seg8)
    err = (got.float() - ref16).abs()
    assert (err <= bound).all(), f"worst {(err / bound).max().item():.2f}x the bound"
    assert err.max() > 0   # int8 is not bf16: the comparison sees the difference


def test_cache_layout_strides_and_fp32_out(device):
    """A [Hkv, S, hd] cache passed as .transpose(0, 1) views, q/out as views of [T, H·hd]
    buffers, an fp32 out and a non-default scale: same answer as contiguous inputs."""
    c = Case(12, 50, 8, 2)
    q, k, v, (seg,) = make_inputs(c, device)
    ck, cv = seg.k.transpose(0, 1).contiguous(), seg.v.transpose(0, 1).contiguous()
    seg_t = KVSegment(ck.transpose(0, 1), cv.transpose(0, 1))
    out = torch.full((c.T, c.H * c.hd + 8), float("nan"), device=device)[:, :c.H * c.hd]
    out = out.view(c.T, c.H, c.hd)
    got = chunk_attention(q, k, v, [seg_t], sm_scale=0.3, out=out)
    ref = chunk_attention_torch(q, k, v, [seg], sm_scale=0.3,
                                out=torch.empty(q.shape, device=device))
    bound = attention_bound(q, k, v, [seg], ref, sm_scale=0.3) - U * ref.abs()  # fp32 out
    assert ((got - ref).abs() <= bound).all()


def test_the_bound_catches_a_dropped_key(device):
    """The check is not vacuous: a kernel that missed one prefix key fails it."""
    c = Case(7, 100, 4, 1)
    q, k, v, (seg,) = make_inputs(c, device)
    wrong = chunk_attention(q, k, v, [KVSegment(seg.k[1:], seg.v[1:])])
    ref = chunk_attention_torch(q, k, v, [seg], out=torch.empty(q.shape, device=device))
    assert ((wrong.float() - ref).abs() > attention_bound(q, k, v, [seg], ref)).any()


def test_reference_matches_sdpa(device):
    """The reference itself against torch's SDPA (expanded heads, bottom-right causal mask)."""
    c = Case(5, 11, 4, 2)
    q, k, v, (seg,) = make_inputs(c, device)
    K = torch.cat([seg.k, k]).float().repeat_interleave(2, dim=1).transpose(0, 1)
    V = torch.cat([seg.v, v]).float().repeat_interleave(2, dim=1).transpose(0, 1)
    mask = torch.ones(c.T, c.P + c.T, dtype=torch.bool, device=device).tril(c.P)
    want = torch.nn.functional.scaled_dot_product_attention(
        q.float().transpose(0, 1), K, V, attn_mask=mask).transpose(0, 1)
    got = chunk_attention_torch(q, k, v, [seg], out=torch.empty(q.shape, device=device))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_bad_inputs_are_refused(device):
    q, k, v, segs = make_inputs(Case(3, 5, 4, 2), device)
    seg = segs[0]
    bad = [
        dict(prefix=[seg, seg, seg]),                                       # three segments
        dict(prefix=[KVSegment(seg.k[:, :1], seg.v[:, :1])]),               # wrong Hkv
        dict(prefix=[KVSegment(seg.k.to(torch.int8), seg.v.to(torch.int8))]),  # no scales
        dict(prefix=[KVSegment(seg.k, seg.v.float())]),                     # mixed dtypes
        dict(q=q.float()),                                                  # q's dtype not k's
        dict(q=q.half(), k=k.half(), v=v.half()),                           # fp16
        dict(q=q[:, :3]),                                                   # H not k·Hkv
        dict(q=q[..., :12], k=k[..., :12], v=v[..., :12]),                  # hd 12
        dict(out=torch.empty(3, 4, 8, device=device)),
    ]
    for kw in bad:
        a = dict(q=q, k=k, v=v, prefix=segs, out=None) | kw
        for fn in (chunk_attention, chunk_attention_torch):
            with pytest.raises(StrataError):
                fn(a["q"], a["k"], a["v"], a["prefix"], out=a["out"])


# -- the two int8 paths ---------------------------------------------------------------------

def test_expand_codes_exhaustive(device):
    """Every int8 code (the quantizer writes -127..127; -128 too, for any int8 cache) expands
    to the same bf16 as the reference, through strided views, into NaN-poisoned outputs."""
    codes = torch.arange(-128, 128, dtype=torch.int8, device=device).view(8, 2, 16)  # [S, Hkv, hd]
    want = torch.arange(-128, 128, device=device).float().view(8, 2, 16)
    for src in (codes, codes.transpose(0, 1).contiguous().transpose(0, 1), codes[1:7]):
        out = torch.empty(src.shape, dtype=torch.bfloat16, device=device)
        got = expand_codes(src, out)
        assert got is out and torch.equal(got, expand_codes_torch(src))
        assert torch.equal(got.float(), want[1:7] if src.shape[0] == 6 else want)
    with pytest.raises(StrataError):
        expand_codes(codes.float())
    with pytest.raises(StrataError):
        expand_codes(codes, torch.empty(8, 2, 16, device=device))       # fp32 out


def test_dequant_codes_bit_exact(device):
    """bf16(code * scale): the Triton pass and its torch twin agree bit for bit on fresh random
    codes and fp32 / fp16 scales (NaN-poisoned outputs, strided views), and equal one fp32
    product rounded to bf16."""
    gen = torch.Generator().manual_seed(5)
    codes = torch.randint(-127, 128, (37, 3, 32), generator=gen, dtype=torch.int8).to(device)
    for sdt in (torch.float32, torch.float16):
        scale = (torch.rand(37, 3, generator=gen) * 0.05 + 1e-4).to(sdt).to(device)
        for src, sc in ((codes, scale), (codes[5:30], scale[5:30]),
                        (codes.transpose(0, 1).contiguous().transpose(0, 1), scale)):
            out = torch.full(src.shape, float("nan"), dtype=torch.bfloat16, device=device)
            got = expand_codes(src, out, sc)
            want = (src.float() * sc.float()[..., None]).to(torch.bfloat16)
            assert got is out and torch.equal(got, want)
            assert torch.equal(expand_codes_torch(src, scale=sc), want)
    with pytest.raises(StrataError):
        expand_codes(codes, scale=scale[:5])                      # wrong scale shape


@pytest.mark.parametrize("c", [Case(1, 257, 4, 1, kv="int8"), Case(21, 100, 16, 2, kv="int8",
                                                                  split=37),
                               Case(9, 70, 4, 2, kv="int8", split=40)], ids=lambda c: c.id)
def test_dequant_path_is_the_bf16_kernel(c, device):
    """int8 = "dequant" reads the bf16 kernel over the dequantized bf16 K/V: bit for bit the
    same as the bf16 launch on those K/V (also in pieces of a short scratch), and within the
    reference's bound with the extra rounding named in attention_bound."""
    q, k, v, segs = make_inputs(c, device)
    tile = resolve_attn_tile(AttnProblem(c.T * c.H // c.Hkv, c.hd)).with_(int8="dequant")
    bf = [KVSegment(expand_codes_torch(s.k, scale=s.k_scale),
                    expand_codes_torch(s.v, scale=s.v_scale)) for s in segs]
    want = chunk_attention(q, k, v, bf, tile=tile)
    got = check(c, device, tile=tile)
    assert torch.equal(got, want)
    sc = AttnScratch.of(c.Hkv, c.hd, tile.BLOCK_N, device, T=c.T, H=c.H)
    assert torch.equal(check(c, device, tile=tile, scratch=sc), want)


# int8 cases of the edge list for both paths: a chunk of 1 token, a prefix of 1 key, lengths
# ending inside a tile, GQA G = 1 and 8, two segments (the engine's host + resident split)
PATHS = [Case(1, 257, 4, 1, kv="int8"), Case(63, 1, 4, 1, kv="int8"),
         Case(129, 100, 4, 1, kv="int8"), Case(7, 100, 2, 2, kv="int8"),
         Case(21, 100, 16, 2, kv="int8", split=37), Case(5, 0, 4, 1, kv="int8")]


@pytest.mark.parametrize("c", PATHS, ids=lambda c: c.id)
def test_int8_paths_agree(c, device):
    """expand and kernel: each within the bound of the reference (check), and bit for bit the
    same in the interpreter (same operands, same tiles, same order)."""
    expanded = check(c, device, tile=resolve_attn_tile(AttnProblem(c.T * c.H // c.Hkv, c.hd))
                     .with_(int8="expand"))
    with pin_attn_tile(int8="kernel"):
        inkernel = check(c, device)
    if device.type == "cpu":
        assert torch.equal(expanded, inkernel)


# a scratch shorter than the int8 prefix: pieces within one segment, a piece spanning the end
# of segment a and the start of b, a bf16 segment between int8 ones, a scratch of one tile
PIECES = [(Case(21, 300, 4, 2, kv="int8"), 100),
          (Case(21, 300, 4, 2, kv="int8", split=137), 100),
          (Case(1, 300, 8, 1, kv="int8", split=200), 64),
          (Case(9, 70, 4, 2, kv="int8", split=40), 16)]


@pytest.mark.parametrize("c,rows", PIECES, ids=lambda x: x.id if isinstance(x, Case) else f"R{x}")
def test_pieces_equal_one_launch(c, rows, device):
    """A prefix longer than the scratch runs in launches that carry the softmax state (fp32,
    stored and reloaded exactly) and cut segments on BLOCK_N multiples: the same tiles in the
    same order as one launch over the whole prefix, so the same bits, and within the bound. The
    scratch and the state start NaN-poisoned (conftest): a piece left unexpanded or a state
    left unstored shows."""
    tile = AttnTile(16, 16, 4, 1) if rows == 16 else None
    H, hd = c.H, c.hd
    whole = check(c, device, tile=tile)
    sc = AttnScratch.of(c.Hkv, hd, rows, device, T=c.T, H=H)
    pieced = check(c, device, tile=tile, scratch=sc)
    if device.type == "cpu":
        assert torch.equal(pieced, whole)


def test_mixed_segments_in_pieces(device):
    """An int8 segment cut into pieces beside a bf16 one (read where it lies, no scratch)."""
    q, k, v, (seg,) = make_inputs(Case(9, 200, 4, 2), device)
    (qk, sk), (qv, sv) = quantize_kv(seg.k[:150]), quantize_kv(seg.v[:150])
    segs = [KVSegment(qk, qv, sk, sv), KVSegment(seg.k[150:], seg.v[150:])]
    ref = chunk_attention_torch(q, k, v, segs, out=torch.empty(q.shape, device=device))
    whole = chunk_attention(q, k, v, segs)
    got = chunk_attention(q, k, v, segs, scratch=AttnScratch.of(2, 16, 64, device, T=9, H=4))
    assert ((got.float() - ref).abs() <= attention_bound(q, k, v, segs, ref)).all()
    if device.type == "cpu":
        assert torch.equal(got, whole)


def test_scratch_misuse_is_refused(device):
    q, k, v, segs = make_inputs(Case(3, 100, 4, 2, kv="int8"), device)
    with pytest.raises(StrataError, match="state"):       # more than one launch, no state
        chunk_attention(q, k, v, segs, scratch=AttnScratch.of(2, 16, 64, device))
    with pytest.raises(StrataError, match="BLOCK_N"):     # less than a tile of rows
        chunk_attention(q, k, v, segs, scratch=AttnScratch.of(2, 16, 8, device, T=3, H=4))
    with pytest.raises(StrataError, match="scratch"):     # wrong kv heads
        chunk_attention(q, k, v, segs, scratch=AttnScratch.of(1, 16, 128, device))
    with pytest.raises(StrataError):
        AttnTile(16, 16, 4, 1, int8="bogus")


@given(st.lists(st.tuples(st.integers(0, 300), st.booleans()), max_size=2),
       st.integers(16, 256), st.sampled_from([16, 32, 64]))
@example([(300, True), (300, True)], 64, 64)     # both segments cut, scratch one tile
@example([(100, True), (50, False)], 16, 16)     # int8 then bf16
@example([(63, True), (300, True)], 100, 64)     # a's tail and b's head share a launch
@example([], 64, 64)                             # no prefix: one empty launch
def test_plan_pieces_invariants(segments, rows, block_n):
    """The launches cover every segment's tokens exactly once, in key order; at most two pieces
    a launch; the int8 pieces of a launch fit the scratch side by side; a piece that stops
    inside its segment stops on a multiple of BLOCK_N (so the tiles are one launch's)."""
    if rows < block_n and any(n > rows and i8 for n, i8 in segments):
        with pytest.raises(StrataError):
            plan_pieces(segments, rows, block_n)
        return
    launches = plan_pieces(segments, rows, block_n)
    assert launches and all(len(lp) <= 2 for lp in launches)
    flat = [pc for lp in launches for pc in lp]
    want = [(i, n) for i, (n, _) in enumerate(segments) if n]
    got_cover = {}
    for pc in flat:
        assert pc.n > 0
        assert got_cover.get(pc.seg, 0) == pc.start           # in order, no gap, no overlap
        got_cover[pc.seg] = pc.start + pc.n
        if pc.start + pc.n < segments[pc.seg][0]:
            assert (pc.start + pc.n) % block_n == 0
        assert (pc.at is None) == (not segments[pc.seg][1])
    assert sorted(got_cover.items()) == want
    assert [pc.seg for pc in flat] == sorted(pc.seg for pc in flat)
    for lp in launches:
        used = [(pc.at, pc.at + pc.n) for pc in lp if pc.at is not None]
        assert all(0 <= a < b <= rows for a, b in used)
        assert len(used) < 2 or used[0][1] <= used[1][0]


def test_scratch_sizes():
    """The plan's count (strata.planning reads these): rows capped at EXPAND_ROWS, a state only
    past it, acc + m + l per query head."""
    assert expand_rows(100) == 100 and not needs_state(100)
    assert expand_rows(EXPAND_ROWS) == EXPAND_ROWS and not needs_state(EXPAND_ROWS)
    assert expand_rows(EXPAND_ROWS + 1) == EXPAND_ROWS and needs_state(EXPAND_ROWS + 1)
    assert state_floats(32, 128) == 32 * 130
    assert EXPAND_ROWS % 128 == 0      # pieces cut on any BLOCK_N the heuristic picks


def test_tile_heuristic_and_pin():
    assert choose_attn_tile(AttnProblem(2048 * 8, 128)) == AttnTile(128, 64, 8, 3)
    assert choose_attn_tile(AttnProblem(8, 128)) == AttnTile(16, 64, 4, 3)
    assert choose_attn_tile(AttnProblem(4096, 256)).BLOCK_M == 64
    p = AttnProblem(100, 16)
    auto = resolve_attn_tile(p)
    with pin_attn_tile(BLOCK_N=16):
        assert resolve_attn_tile(p) == auto.with_(BLOCK_N=16)
        with pin_attn_tile(AttnTile(16, 16, 2, 1)):
            assert resolve_attn_tile(p) == AttnTile(16, 16, 2, 1)
        assert resolve_attn_tile(p).BLOCK_N == 16
    assert resolve_attn_tile(p) == auto
    with pytest.raises(StrataError):
        AttnTile(24, 64, 4, 3)


def test_causal_pairs():
    assert causal_pairs(1, 0) == 1
    assert causal_pairs(4, 10) == 40 + 10
    # brute force: (t, s) with s <= P + t
    T, P = 7, 5
    assert causal_pairs(T, P) == sum(1 for t in range(T) for s in range(P + T) if s <= P + t)


# compile_attention.py --quick: hd = 128 variants, the expansion kernel (codes, scaled) and the
# packed sequences' launch
N_COMPILED = 7


def test_attention_compiles_for_h200():
    """The kernel compiles for sm_90 with triton's own passes and ptxas (no GPU needed), at the
    H200 tiles for hd = 128, bf16 and int8 segments (both int8 paths, the pieces' store and
    resume branches) and the expansion kernel, in a process without the interpreter: a
    type or layout error the interpreter forgives shows up here. Prints the footprint."""
    lines, out = compile_lines("compile_attention.py", "--quick", "128", timeout=900)
    assert len(lines) == N_COMPILED, out
    for line in lines:   # bf16 segments: no spills (int8 ones: see tiles.py)
        if line.startswith("ok") and "int8" not in line:
            assert "spill 0/0" in line, line


# -- on the GPU, at real shapes (Qwen3-30B-A3B: H 32, Hkv 4, hd 128) -------------------------
REAL = [Case(2048, 8192, 32, 4, hd=128, kv=kv) for kv in ("bf16", "int8")] + [
    Case(2048, 0, 32, 4, hd=128), Case(129, 257, 32, 4, hd=128, kv="int8"),
    Case(1, 8192, 32, 4, hd=128), Case(63, 1000, 16, 2, hd=256),
    Case(1, 8192, 32, 4, hd=128, kv="int8"), Case(63, 1000, 16, 2, hd=256, kv="int8")]


@pytest.mark.gpu
@pytest.mark.parametrize("c", REAL, ids=lambda c: c.id)
def test_real_shapes_gpu(c):
    check(c, torch.device("cuda"))


@pytest.mark.gpu
@pytest.mark.parametrize("kv", ["bf16", "int8"])
def test_two_segments_equal_one_gpu(kv):
    dev = torch.device("cuda")
    one = check(Case(2048, 8192, 32, 4, hd=128, kv=kv), dev)
    assert torch.equal(check(Case(2048, 8192, 32, 4, hd=128, kv=kv, split=4096), dev), one)


@pytest.mark.gpu
@pytest.mark.parametrize("c", [c for c in REAL if c.kv == "int8"] + [
    Case(1, 257, 32, 4, hd=128, kv="int8"), Case(333, 4097, 32, 4, hd=128, kv="int8", split=1025),
    Case(63, 1000, 16, 2, hd=256, kv="int8", split=300)], ids=lambda c: c.id)
def test_int8_paths_agree_gpu(c):
    """Both int8 paths within the bound at real shapes; prints whether they agree bit for bit
    (the two compiled dots may order the fp32 accumulation differently)."""
    dev = torch.device("cuda")
    expanded = check(c, dev)
    with pin_attn_tile(int8="kernel"):
        inkernel = check(c, dev)
    print(f"{c.id}: expand == kernel bit for bit: {torch.equal(expanded, inkernel)}")


@pytest.mark.gpu
@pytest.mark.parametrize("split", [None, 5000])
def test_pieces_equal_one_launch_gpu(split):
    """A 12,000-token int8 prefix through a 4096-row scratch (3-4 launches, the state carried)
    against one launch: the same tiles in the same order, so the same bits on the same GPU."""
    dev = torch.device("cuda")
    c = Case(1024, 12000, 32, 4, hd=128, kv="int8", split=split)
    whole = check(c, dev)
    pieced = check(c, dev, scratch=AttnScratch.of(4, 128, 4096, dev, T=c.T, H=c.H))
    assert torch.equal(pieced, whole)
