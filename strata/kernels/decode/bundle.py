"""A format's traits bundle: the @triton.jit functions that decode it, and the constants of its
row in strata.formats.table, as one value a kernel takes as a constexpr argument (as llama.cpp's
mmq_type_traits<type> and triton_kernels' FnSpecs).

A kernel declares `FMT: tl.constexpr` and is launched with `format_traits(name)`; it calls
`FMT.code(...)`, `FMT.scale(...)`, reads `FMT.RUN`, and the compiler inlines this format's
functions as if they were named in the source (an attribute of a constexpr is resolved at compile
time). The interpreter takes the same value. Field names avoid `value` and `type`, which
tl.constexpr keeps for itself.

Element-addressed decoders (shapes: offs_n [BN] rows, offs_k [BK] weights, mask [BN, BK]):
    code(w_ptr, row_bytes, offs_n, offs_k, mask, tab_ptr) -> fp32 [BN, BK] codes (plain formats:
        the weights); GRID formats return (magnitude, sign bit) and read the i-quant table tab_ptr
    scale(w_ptr, row_bytes, offs_n, offs_k, mask) -> fp32 [BN, BK] scale of each weight's block
        (or of a run's first weight, [BN, R]); PAIR formats return (scale, min)
    apply(s, c) -> fp32 weights from scale(s) and code(s), the torch reference's products in its
        order (s and c as scale and code return them, broadcast to the same shape)
Super-block word path (strata.kernels.decode.superblocks; None elsewhere):
    sb_head(p32, base, mask_n, ALIGNED) -> 5 x int32 [BN] header words
    sb_words(p32, base, mask_n, ALIGNED) -> 8 x int32 [BN, 8] code words
    sb_run(words, head, RUN) -> fp32 [BN, 32] weights of 32-weight run RUN
Raw code words (strata.kernels.decode.words; WORDS formats, else None):
    word_bytes(w_ptr, row_bytes, offs_n, k_run, mask_n, WIDE) -> (lo, hi) raw code words
    word_codes(lo, hi, WIDE, MAGIC) -> (c_lo, c_hi) fp32 [BN, 16] codes
    pair_codes(words, s, MAGIC) -> fp32 [BN, 64] weights of a block pair's int32 code words
Block stream (strata.kernels.decode.streams; None elsewhere):
    stream_block(p32, base, mask_b) -> (lo, hi) fp32 [BN, 16] weights of whole blocks at
        any byte offset, from aligned int32 words
Plane layout (strata.planes, strata.kernels.decode.plane_codes; PLANE_PACK > 0, else None):
    plane_codes(b, MAGIC, BIASED, INTERP) -> fp32 [BN, BK] codes from code bytes b [BN, BK / PACK]
    plane_scales(s_ptr, n_in, offs_n, n_mask, k0, BK) -> (s, m) fp32 [BN, BK / 32] a step's factors
"""
from __future__ import annotations

from typing import NamedTuple

from strata.formats.table import FORMATS


class FormatTraits(NamedTuple):
    name: str
    code: object
    scale: object = None
    apply: object = None
    PAIR: bool = False        # scale returns (scale, min)
    GRID: bool = False        # code reads the i-quant grid table (tab_ptr)
    NATIVE: bool = False      # stored as bf16: a GEMM loads it as its dot's operand
    RUN: int = 0              # the table's tile_run: weights a run's scale load covers (0: none)
    SCALED: bool = False      # the table's scaled_code: w = scale * exact small-integer code
    WORDS: bool = False       # the table's code_words: raw code words, block pairs of words
    BLOCK: int = 1            # weights a block
    BYTES: int = 2            # bytes a block
    sb_head: object = None
    sb_words: object = None
    sb_run: object = None
    word_bytes: object = None
    word_codes: object = None
    pair_codes: object = None
    stream_block: object = None
    PLANE_PACK: int = 0       # plane layout: weights a code byte (0: no plane layout)
    PLANE_FMA: bool = False   # plane codes come biased: a weight is one fused multiply-add
    plane_codes: object = None
    plane_scales: object = None

    @property
    def cache_key(self) -> str:
        """What Triton's on-disk cache keys a kernel specialised on this bundle by: every
        function's own key (its source and what it calls), so an edited decoder recompiles."""
        return "|".join(str(getattr(v, "cache_key", v)) for v in self)


def traits(name: str, code, scale=None, apply=None, **fields) -> FormatTraits:
    """`name`'s bundle: its functions, and the constants its row of the format table states."""
    f = FORMATS[name]
    run = f.tile_run
    assert run == 0 or (run & (run - 1) == 0 and (run % f.block == 0 or f.block % run == 0)), name
    return FormatTraits(name, code, scale, apply, RUN=run, SCALED=f.scaled_code,
                        WORDS=f.code_words, BLOCK=f.block, BYTES=f.block_bytes, **fields)
