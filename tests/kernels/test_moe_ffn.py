"""moe_ffn (Triton) against moe_ffn_torch (plain torch) on fresh random data.

Error measure: normalized error ||y - ref|| / ||ref|| over the whole [T, D] output.
Bounds, per compute dtype (never loosened to pass; a miss is a bug to find):
- BF16_REL: BF16 weights. The kernel rounds h = silu(gate x) * up x to bf16 (the down GEMM's
  tensor-core input) and y to bf16; each rounding is <= 2^-9 relative (rms ~1.1e-3), and the
  reference keeps h in fp32. Observed ~2.3e-3 on the tiny shapes.
- DECODED_REL: any decoded block format (decode-only formats such as Q4_K / IQ3_S get random
  valid blocks from strata.kernels.moe.random_experts.random_blocks). Decoded weights (an fp16 scale
  times a small integer, up to 18 significant bits) are rounded to bf16 for the tensor cores: one
  more 2^-9 rounding per weight on top of the BF16 case. Observed ~4e-3.
"""
from __future__ import annotations

from dataclasses import dataclass

import zlib

import pytest
import torch

from strata.errors import StrataError
from strata.kernels import last_launch, moe_ffn, moe_ffn_torch, pin_tile, topk_route
from strata.kernels.moe._ffn_kernel import dot_plan
from strata.kernels.moe.tiles import DOT_VARIANTS
from strata.kernels.moe.random_experts import random_expert_set

BF16_REL = 1e-2
DECODED_REL = 1.5e-2


def rel_err(y, ref):
    return ((y.float() - ref.float()).norm() / ref.float().norm()).item()


def bound(experts):
    return BF16_REL if all(m.fmt.name == "BF16" for m in experts.layout.matrices) else DECODED_REL


@dataclass(frozen=True)
class Case:
    id: str
    T: int
    E: int
    K: int
    D: int = 64
    F: int = 32
    fmts: tuple = ("BF16",)
    route: str = "random"        # "random" | "one" (every token on expert 0) | "skip" (expert 1 idle)
    schedule: str = "dp"
    programs: int = 4
    BN: int = 16
    BK: int = 32


CASES = [
    Case("T3-lt-tile", T=3, E=4, K=2),                                  # T < BLOCK_M
    Case("idle-expert", T=9, E=5, K=2, route="skip"),                  # expert 1 gets no tokens
    Case("all-on-one", T=20, E=4, K=1, route="one"),                    # one expert, two blocks
    Case("K1", T=7, E=3, K=1),
    Case("K-eq-E", T=5, E=3, K=3),
    Case("E7-prime", T=11, E=7, K=2),
    Case("sk-fewer-tiles-than-programs", T=3, E=2, K=1, schedule="stream_k", programs=13),
    Case("sk-more-tiles-than-programs", T=9, E=5, K=2, schedule="stream_k", programs=3),
    Case("sk-one-program", T=5, E=3, K=2, schedule="stream_k", programs=1),
    Case("sk-idle-expert", T=9, E=5, K=2, route="skip", schedule="stream_k", programs=5),
    Case("mixed-q8-q4-bf16", T=6, E=3, K=2, fmts=("Q8_0", "Q4_0", "BF16")),
    Case("mixed-bf16-q4-q8-sk", T=6, E=3, K=2, fmts=("BF16", "Q4_0", "Q8_0"),
         schedule="stream_k", programs=5),
    Case("q8-all", T=4, E=2, K=1, fmts=("Q8_0",)),
    Case("q4-bk16-generic-decoder", T=4, E=2, K=1, fmts=("Q4_0",), BK=16),  # BK < a Q4_0 block
    Case("f16-all", T=4, E=2, K=1, fmts=("F16",)),
    Case("kquant-iquant-mixed-q4k-iq3s-q2", T=4, E=3, K=2, D=256, F=256,   # 256-weight blocks
         fmts=("Q4_K", "IQ3_S", "Q2_0"), BN=32, BK=64),
    Case("q6k-sk", T=3, E=2, K=1, D=256, F=256, fmts=("Q6_K",), schedule="stream_k",
         programs=3, BN=32, BK=64),
    Case("D-not-multiple-of-BN", T=4, E=3, K=2, D=96, F=64, BN=64, BK=64),
    # the stock mixes' types, three to a blob (the GEMM reads any mix of formats per matrix);
    # BN 64 (four column tiles of 256, half BN 32's interpreted programs: the format is the case)
    Case("mix-q4_1-q5_1-q5_k", T=4, E=3, K=2, D=256, F=256, fmts=("Q4_1", "Q5_1", "Q5_K"),
         BN=64, BK=64),
    Case("mix-q2k-q3k-iq4xs", T=4, E=3, K=2, D=256, F=256, fmts=("Q2_K", "Q3_K", "IQ4_XS"),
         BN=64, BK=64),
    Case("mix-iq2xxs-iq2xs-iq2s", T=4, E=3, K=2, D=256, F=256,
         fmts=("IQ2_XXS", "IQ2_XS", "IQ2_S"), BN=64, BK=64),
    Case("mix-iq3xxs-iq1s-iq1m-sk", T=4, E=3, K=2, D=256, F=256,
         fmts=("IQ3_XXS", "IQ1_S", "IQ1_M"), schedule="stream_k", programs=3, BN=64, BK=64),
]


def _routing(c: Case, gen):
    logits = torch.randn(c.T, c.E, generator=gen)
    if c.route == "one":
        logits[:, 0] += 100.0
    if c.route == "skip":
        logits[:, 1] -= 100.0
    return topk_route(logits, c.K)


def _inputs(c: Case):
    """(experts, x, ids, w, reference y) of a case, seeded by its id."""
    seed = zlib.crc32(c.id.encode())  # fixed per case, different across cases
    gen = torch.Generator().manual_seed(seed)
    experts = random_expert_set(c.E, c.D, c.F, *c.fmts, seed=seed)
    x = torch.randn(c.T, c.D, generator=gen).bfloat16()
    ids, w = _routing(c, gen)
    return experts, x, ids, w, moe_ffn_torch(x, ids, w, experts)


@pytest.mark.parametrize("c", CASES, ids=lambda c: c.id)
def test_moe_ffn_matches_reference(c: Case):
    experts, x, ids, w, ref = _inputs(c)
    with pin_tile(schedule=c.schedule, programs=c.programs, BLOCK_N=c.BN, BLOCK_K=c.BK):
        y = moe_ffn(x, ids, w, experts)
    assert y.shape == (c.T, c.D) and y.dtype == torch.bfloat16
    assert not torch.isnan(y).any(), "output not fully written (NaN poison survived)"
    err = rel_err(y, ref)
    assert err < bound(experts), f"normalized error {err:.2e}"
    rec = last_launch()
    counts = torch.bincount(ids.reshape(-1), minlength=c.E)
    bm = rec.tile.BLOCK_M
    # experts with no tokens cost nothing: blocks only for routed experts
    assert rec.n_blocks == int(((counts + bm - 1) // bm).sum())
    if c.schedule == "stream_k":
        assert rec.scratch_bytes == 2 * c.programs * 2 * bm * c.BN * 4
        with pin_tile(schedule=c.schedule, programs=c.programs, BLOCK_N=c.BN, BLOCK_K=c.BK):
            y2 = moe_ffn(x, ids, w, experts)
        assert torch.equal(y, y2), "stream-k fixup must be deterministic"


def test_stream_k_splits_tiles_and_matches_dp():
    """Programs that do not divide the iterations: every tile boundary pattern (a program inside
    one tile, spanning two, ending on a boundary) across P = 2..7."""
    gen = torch.Generator().manual_seed(7)
    experts = random_expert_set(3, 64, 32, "BF16", seed=7)
    x = torch.randn(6, 64, generator=gen).bfloat16()
    ids, w = topk_route(torch.randn(6, 3, generator=gen), 2)
    ref = moe_ffn_torch(x, ids, w, experts)
    with pin_tile(schedule="dp", BLOCK_N=16, BLOCK_K=16):
        y_dp = moe_ffn(x, ids, w, experts)
    for p in (2, 5, 7):
        with pin_tile(schedule="stream_k", programs=p, BLOCK_N=16, BLOCK_K=16):
            y = moe_ffn(x, ids, w, experts)
        assert rel_err(y, ref) < BF16_REL
        assert rel_err(y, y_dp) < BF16_REL


def test_scratch_comes_from_the_allocator_hook():
    calls = []

    def alloc(nbytes):
        calls.append(nbytes)
        return torch.zeros(nbytes + 512, dtype=torch.uint8)   # a pool may hand out more

    experts = random_expert_set(3, 64, 32, "BF16", seed=1)
    x = torch.randn(4, 64).bfloat16()
    ids, w = topk_route(torch.randn(4, 3), 2)
    with pin_tile(schedule="stream_k", programs=3, BLOCK_N=16, BLOCK_K=32):
        moe_ffn(x, ids, w, experts, scratch_alloc=alloc)
    assert calls == [last_launch().scratch_bytes] and calls[0] > 0
    with pytest.raises(StrataError, match="scratch_alloc must return"):
        with pin_tile(schedule="stream_k", programs=3, BLOCK_N=16, BLOCK_K=32):
            moe_ffn(x, ids, w, experts, scratch_alloc=lambda n: torch.zeros(8, dtype=torch.uint8))


def test_absent_expert_is_a_clear_error():
    experts = random_expert_set(4, 64, 32, "BF16", absent=(2,))
    x = torch.randn(3, 64).bfloat16()
    ids = torch.tensor([[0, 2], [1, 3], [0, 1]])
    w = torch.full((3, 2), 0.5)
    with pytest.raises(StrataError, match=r"experts \[2\] are routed to but not resident"):
        moe_ffn(x, ids, w, experts)
    with pytest.raises(StrataError, match="expert 2 is not resident"):
        moe_ffn_torch(x, ids, w, experts)
    ok = torch.tensor([[0, 1], [1, 3], [0, 3]])     # absent but not routed to: fine
    y = moe_ffn(x, ok, w, experts)
    assert rel_err(y, moe_ffn_torch(x, ok, w, experts)) < BF16_REL


def test_misaligned_blobs_are_refused():
    """The kernel tells the compiler blobs are 256-byte aligned (vector loads); a slot table or an
    arena that breaks that must be an error, not silently wrong loads on the GPU."""
    experts = random_expert_set(2, 64, 32, "BF16")
    x = torch.randn(2, 64).bfloat16()
    ids, w = torch.tensor([[0], [1]]), torch.ones(2, 1)
    shifted = type(experts)(experts.arena, experts.slot_offset + 2, experts.layout)
    with pytest.raises(StrataError, match="not a multiple of 256"):
        moe_ffn(x, ids, w, shifted)
    if not torch.cuda.is_available():
        return  # the arena's own address matters only to compiled kernels
    experts = random_expert_set(2, 64, 32, "BF16", device="cuda")
    x, ids, w = x.cuda(), ids.cuda(), w.cuda()
    buf = torch.zeros(experts.arena.numel() + 256, dtype=torch.uint8, device="cuda")
    view = buf[2:2 + experts.arena.numel()]
    with pytest.raises(StrataError, match="arena must start 256-byte aligned"):
        moe_ffn(x, ids, w, type(experts)(view, experts.slot_offset, experts.layout))


def test_bad_inputs_are_clear():
    experts = random_expert_set(2, 64, 32, "BF16")
    ids = torch.zeros(3, 1, dtype=torch.int64)
    w = torch.ones(3, 1)
    with pytest.raises(StrataError, match="bf16"):
        moe_ffn(torch.randn(3, 64), ids, w, experts)
    with pytest.raises(StrataError, match=r"\[T, D=64\]"):
        moe_ffn(torch.randn(3, 32).bfloat16(), ids, w, experts)
    with pytest.raises(StrataError, match="topk_weights"):
        moe_ffn(torch.randn(3, 64).bfloat16(), ids, torch.ones(3, 2), experts)


def test_empty_batch():
    experts = random_expert_set(2, 64, 32, "BF16")
    y = moe_ffn(torch.zeros(0, 64).bfloat16(), torch.zeros(0, 2, dtype=torch.int64),
                torch.zeros(0, 2), experts)
    assert y.shape == (0, 64)


# ---------------------------------------------------------------- layer-sized, on the GPU

GPU_SHAPES = [
    pytest.param(128, 8, 2048, 768, id="qwen3-30b-a3b"),
    pytest.param(512, 10, 2560, 640, id="seed-512e"),
]


# qwen3's shape (one compile a format and schedule: the H100 took 109 s for Q8_0 at T 37 alone;
# the CPU tests run the other shapes): each format in dp, a partial block (T 37) on Q4_0,
# stream_k once
# (a format x schedule is one compile; T and the shape only move the grid)
GPU_LAYER_CASES = (
    [pytest.param(*GPU_SHAPES[0].values, T, fmt, "dp", id=f"dp-{fmt}-T{T}-qwen3-30b-a3b")
     for fmt, T in (("BF16", 2048), ("Q8_0", 2048), ("Q4_0", 37), ("Q4_0", 2048))]
    + [pytest.param(*GPU_SHAPES[0].values, 2048, "Q8_0", "stream_k",
                    id="stream_k-Q8_0-T2048-qwen3-30b-a3b")])


@pytest.mark.gpu
@pytest.mark.parametrize("E,K,D,F,T,fmt,schedule", GPU_LAYER_CASES)
def test_moe_ffn_layer_shapes_gpu(E, K, D, F, T, fmt, schedule):
    dev = torch.device("cuda")
    gen = torch.Generator().manual_seed(T + E)
    experts = random_expert_set(E, D, F, fmt, device=dev, seed=E)
    x = torch.randn(T, D, generator=gen).bfloat16().to(dev)
    ids, w = topk_route(torch.randn(T, E, generator=gen).to(dev), K)
    ref = moe_ffn_torch(x, ids, w, experts)
    y = moe_ffn(x, ids, w, experts, schedule=schedule)
    assert not torch.isnan(y).any()
    assert rel_err(y, ref) < bound(experts)


# Q4_K_M's expert types (the stock mix most read); the other formats' decoders (the same traits
# functions the fused GEMM inlines) run compiled on the device in test_decode's every-code sweep
# and test_expert_dequant, and every mix runs fused on the CPU interpreter
MIX_FMTS = [("Q4_K", "Q4_K", "Q6_K")]


@pytest.mark.gpu
@pytest.mark.parametrize("fmts", MIX_FMTS, ids="-".join)
def test_moe_ffn_new_formats_gpu(fmts):
    """qwen3-30b-a3b's layer shape in the stock mixes' types (and the rest of the new formats),
    compiled for the GPU: within the decoded bound of the torch reference."""
    dev = torch.device("cuda")
    E, K, D, F, T = 128, 8, 2048, 768, 512
    gen = torch.Generator().manual_seed(T + E)
    experts = random_expert_set(E, D, F, *fmts, device=dev, seed=E)
    x = torch.randn(T, D, generator=gen).bfloat16().to(dev)
    ids, w = topk_route(torch.randn(T, E, generator=gen).to(dev), K)
    ref = moe_ffn_torch(x, ids, w, experts)
    y = moe_ffn(x, ids, w, experts)
    assert not torch.isnan(y).any()
    assert rel_err(y, ref) < bound(experts)


VARIANT_CASES = [
    Case("fast-q8-q4-sk", T=7, E=3, K=2, D=96, F=64, fmts=("Q8_0", "Q4_0", "Q4_0"),
         schedule="stream_k", programs=5, BN=16, BK=64),
    Case("scaled-q5-beside-q4", T=5, E=3, K=2, D=64, F=64, fmts=("Q5_0", "Q4_0", "Q5_0"),
         BN=32, BK=64),
    Case("runs-differ-q2-beside-q8", T=5, E=2, K=1, D=128, F=64, fmts=("Q8_0", "Q2_0", "Q8_0"),
         BN=32, BK=64),       # gate scaled (run 32), up falls back to decoding (run 64)
    # rows of whole block pairs (D, F multiples of 64), as the decode-once word path reads them;
    # every GEMM of both still takes two or more reduction steps (so the PF variants prefetch
    # across a step) and several column tiles, and stream-k's 5 programs split the gate/up
    # launch's (tiles x 2 steps) iterations mid-tile. BN=16 stays covered by fast-q8-q4-sk; a
    # wider BN halves the interpreter's programs.
    Case("pairs-q8-q4-dp", T=9, E=3, K=2, D=128, F=128, fmts=("Q8_0", "Q4_0", "Q8_0"),
         BN=32, BK=64),
    Case("pairs-q4-q8-sk-bk128", T=6, E=3, K=2, D=256, F=128, fmts=("Q4_0", "Q8_0", "Q4_0"),
         schedule="stream_k", programs=5, BN=64, BK=128),
]


@pytest.mark.parametrize("variant", DOT_VARIANTS)
@pytest.mark.parametrize("c", VARIANT_CASES, ids=lambda c: c.id)
def test_every_decoded_dot_variant_matches_reference(c: Case, variant):
    """The tile's `dot` picks how decoded weights meet the MMA; every variant (not only the
    default) stays within DECODED_REL, and stream-k (its split tiles summed through the fixup
    scratch) gives the same bits twice under each (data-parallel has no such step)."""
    experts, x, ids, w, ref = _inputs(c)
    with pin_tile(schedule=c.schedule, programs=c.programs, BLOCK_N=c.BN, BLOCK_K=c.BK,
                  dot=variant):
        y = moe_ffn(x, ids, w, experts)
        y2 = moe_ffn(x, ids, w, experts) if c.schedule == "stream_k" else y
    assert not torch.isnan(y).any()
    assert rel_err(y, ref) < DECODED_REL, f"{variant}: normalized error {rel_err(y, ref):.2e}"
    assert torch.equal(y, y2)


def test_dot_plan():
    assert dot_plan("Q8_0", "Q4_0", 64, "swap_fast_pf") == dict(
        SC1=True, SC2=True, RUN=32, SW=True, FAST=True, PF=True, W16=False, MAGIC=False)
    assert dot_plan("Q8_0", "Q8_0", 64, "decode")["SC1"] is False
    # BK smaller than a run: decode; Q2_0's 64-run beside a 32-run: matrix 2 decodes
    assert dot_plan("Q4_0", "Q4_0", 16, "scaled")["SC1"] is False
    p = dot_plan("Q8_0", "Q2_0", 64, "scaled_swap")
    assert (p["SC1"], p["SC2"], p["FAST"]) == (True, False, False)
    # swap_fast* outside Q8_0/Q4_0 decodes (the generic scaled path measured slower)
    p = dot_plan("Q8_0", "Q5_0", 64, "swap_fast_pf_w16_magic")
    assert (p["SC1"], p["SC2"], p["SW"], p["FAST"]) == (False, False, False, False)
    assert dot_plan("Q4_K", "BF16", 64, "scaled_swap")["SC1"] is False
