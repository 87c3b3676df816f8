"""Triton decode helpers: ggml blocks -> exact fp32 values in registers.

A format is one traits bundle (strata.kernels.decode.bundle.FormatTraits): its scale, code and
apply functions, and where it has them its super-block and raw-word layouts, declared beside its
decoders in the family module that mirrors strata.formats (plain, legacy, kquants, iquants, iq2,
iq1, mxfp4). A kernel takes the bundle as a constexpr argument (`FMT: tl.constexpr`, launched
with `format_traits(name)`) and the helpers below read it, so no kernel names a format. What a
format supports is stated once, in its row of strata.formats.table (`triton`, `tile_run`,
`scaled_code`, `code_words`); the bundle carries those constants and the name tuples below are
read from the table.

Every helper is element-addressed, so any tile shape works (the expert GEMM's inner loop):

    decode_tile(FMT, w_ptr, row_bytes, offs_n, offs_k, mask, tab_ptr=None) -> fp32 [BN, BK]
        FMT       the format's bundle (formats whose row says `triton`)
        w_ptr     uint8 pointer at the matrix's first byte (a GGUF [N, K] matrix, rows contiguous),
                  2-byte aligned (blob offsets are 256-aligned, GGUF tensor data 32-aligned)
        row_bytes bytes per row (K / block blocks of block_bytes; `Format.row_bytes(K)`)
        offs_n    [BN] row indices (output features)
        offs_k    [BK] weight indices along the row
        mask      [BN, BK] bool; masked-off elements return 0
        tab_ptr   the grid i-quants (IQ3_S, IQ3_XXS, IQ2_XXS/XS/S, IQ1_S/M; bundles with GRID):
                  the one int32 i-quant table on the device, `strata.formats.tables.device_table(
                  "iq", device)` (IQ3_S's grid words first, so the older "iq3s" table serves
                  IQ3_S alone)
    decode_tile_runs(same arguments): the same values, for tiles whose offs_k are whole aligned
        runs of the format's `tile_run` weights (32; 16 where a scale covers 16 weights: Q6_K, Q2_K,
        Q3_K, IQ2_XS, IQ2_S, IQ1_M): block scales are loaded once
        per (row, run) and broadcast instead of once per weight. Which is faster on a given tile
        is for the GEMM's benchmark to say (the broadcast is a reshape Triton may lay out through
        shared memory).

Split helpers, for GEMMs that scale partial sums instead of weights (SCALED_CODE_FORMATS, rows
with `scaled_code`: one multiplicative scale per block times an exact small-integer code, w = s*c):
    decode_codes(FMT, w_ptr, row_bytes, offs_n, offs_k, mask) -> fp32 [BN, BK] codes c
    decode_run_scale(FMT, w_ptr, row_bytes, offs_n, k_run, n_mask) -> fp32 [BN] scale s of the
        block holding weight k_run (a scalar)
    load_code_bytes / codes_from_bytes (FAST_CODE_FORMATS, rows with `code_words`: Q8_0, Q4_0):
        a block's raw code words as a load that can be issued ahead of its use, and the codes
        (two 16-wide halves) from them; pair_tile: a pair of blocks as aligned int32 words.
    s * c equals decode_tile bit for bit (tests/test_decode_codes.py).

Values equal `strata.formats.dequantize` (and gguf-py) bit for bit: each helper forms the same fp32
products in the same order as the torch reference. Every product of scale and code is exact in
fp32 (an fp16 significand times small integers), so FMA contraction cannot change a result.

Type ids, block sizes and block bytes come from the format table (strata.formats.table); the
offsets of fields inside a block are the layout each helper's docstring spells out.

Speed notes. Addresses are int64 (N * row_bytes passes 2**31 on big experts). Block sizes are
constexpr powers of two, so block/lane splits are shifts and masks. fp16 scales are read with one
16-bit load: every block with an fp16 field has an even size (34, 18, 22, 144, 210, 110 bytes), so
with an even w_ptr each field is 2-byte aligned. IQ4_NL and MXFP4 look their 16 levels up in
registers (packed constants built from `strata.formats.tables`), not in memory.

Adding a format: its row (with the capability fields) in strata.formats.table, its torch
reference in strata.formats.<family>, and its traits module: the _scale/_code functions and one
`traits(...)` bundle in a family module here (a new family module is listed in FAMILIES).
"""
import triton
import triton.language as tl

from strata.errors import StrataError
from strata.formats.table import FORMATS, get_format
from strata.kernels.decode import iq1, iq2, iquants, kquants, legacy, mxfp4, plain
from strata.kernels.decode.bundle import FormatTraits
from strata.kernels.decode.words import (codes_from_bytes, load_code_bytes, pair_tile,
                                         pair_words_fit)

__all__ = ["TRITON_FORMATS", "SCALED_CODE_FORMATS", "FAST_CODE_FORMATS", "TRAITS", "FormatTraits",
           "format_traits", "code_run", "decode_tile", "decode_tile_runs", "decode_codes",
           "decode_run_scale", "load_code_bytes", "codes_from_bytes", "pair_tile",
           "pair_words_fit"]

# the family modules, each declaring the bundles of its formats
FAMILIES = (plain, legacy, kquants, iquants, iq2, iq1, mxfp4)
TRAITS: dict[str, FormatTraits] = {t.name: t for mod in FAMILIES for t in vars(mod).values()
                                   if isinstance(t, FormatTraits)}

# the formats decode_tile decodes; everything else is a compile-time error
TRITON_FORMATS = tuple(f.name for f in FORMATS.values() if f.triton)
# one multiplicative scale per block times an exact small-integer code (decode_codes)
SCALED_CODE_FORMATS = tuple(f.name for f in FORMATS.values() if f.scaled_code)
# raw code words (load_code_bytes / codes_from_bytes / pair_tile)
FAST_CODE_FORMATS = tuple(f.name for f in FORMATS.values() if f.code_words)
assert set(TRAITS) == set(TRITON_FORMATS), sorted(set(TRAITS) ^ set(TRITON_FORMATS))
assert set(SCALED_CODE_FORMATS) <= set(TRITON_FORMATS)
assert set(FAST_CODE_FORMATS) <= set(SCALED_CODE_FORMATS)
assert all(TRAITS[n].word_bytes is not None for n in FAST_CODE_FORMATS)


def format_traits(fmt) -> FormatTraits:
    """The traits bundle a kernel takes for `fmt` (a name, a ggml type id or a Format)."""
    name = get_format(fmt).name
    if name not in TRAITS:
        raise StrataError(f"{name} has no Triton decoder; the kernels read "
                          f"{', '.join(TRITON_FORMATS)}")
    return TRAITS[name]


def code_run(name: str) -> int:
    """Weights sharing one scale in a SCALED_CODE_FORMATS format (the block: 32, Q2_0 64)."""
    assert name in SCALED_CODE_FORMATS, name
    return FORMATS[name].block


# ---------------------------------------------------------------- whole weights

@triton.jit
def decode_tile(FMT: tl.constexpr, w_ptr, row_bytes, offs_n, offs_k, mask, tab_ptr=None):
    """The weights of bundle FMT at (offs_n, offs_k): apply(scale, code), each weight's own block
    scale (plain formats: the code is the weight)."""
    if FMT.GRID:
        tl.static_assert(tab_ptr is not None, "i-quant grids need tab_ptr: device_table('iq')")
    if FMT.RUN == 0:
        v = FMT.code(w_ptr, row_bytes, offs_n, offs_k, mask, tab_ptr)
    else:
        v = FMT.apply(FMT.scale(w_ptr, row_bytes, offs_n, offs_k, mask),
                      FMT.code(w_ptr, row_bytes, offs_n, offs_k, mask, tab_ptr))
    return v


@triton.jit
def _spread(x, RUN: tl.constexpr):
    """[BN, R] -> [BN, R * RUN]: each value repeated over its run of RUN weights."""
    BN: tl.constexpr = x.shape[0]
    R: tl.constexpr = x.shape[1]
    return tl.reshape(tl.broadcast_to(x[:, :, None], (BN, R, RUN)), (BN, R * RUN))


@triton.jit
def _runs(offs_k, mask, RUN: tl.constexpr):
    """(k_run [R] first weight of each run of RUN lanes, m_run [BN, R] any lane of it used)."""
    BN: tl.constexpr = mask.shape[0]
    BK: tl.constexpr = offs_k.shape[0]
    R: tl.constexpr = BK // RUN
    tl.static_assert(BK % RUN == 0, "decode_tile_runs: BK must be a multiple of the run")
    k_run = tl.min(tl.reshape(offs_k, (R, RUN)), axis=1)                  # [R] first weight
    m_run = tl.max(tl.reshape(mask, (BN, R, RUN)).to(tl.int32), axis=2) > 0  # [BN, R]
    return k_run, m_run


@triton.jit
def decode_tile_runs(FMT: tl.constexpr, w_ptr, row_bytes, offs_n, offs_k, mask, tab_ptr=None):
    """decode_tile's values, with each (row, sub-block) scale loaded once instead of per weight.

    offs_k must be whole aligned runs of the format's tile_run weights (BK % run == 0 and every
    run of lanes starts at a multiple of it, e.g. offs_k = k0 + tl.arange(0, BK) with k0 % 32 ==
    0); runs are 16 weights where a scale covers 16 (Q6_K, Q2_K, Q3_K, IQ2_XS, IQ2_S, IQ1_M),
    32 otherwise (the table's tile_run). BF16/F16 have no scales: decode_tile."""
    if FMT.RUN == 0:
        return decode_tile(FMT, w_ptr, row_bytes, offs_n, offs_k, mask, tab_ptr)
    else:
        if FMT.GRID:
            tl.static_assert(tab_ptr is not None, "i-quant grids need tab_ptr: device_table('iq')")
        RUN: tl.constexpr = FMT.RUN
        k_run, m_run = _runs(offs_k, mask, RUN)
        if FMT.PAIR:
            d, m = FMT.scale(w_ptr, row_bytes, offs_n, k_run, m_run)
            s = (_spread(d, RUN), _spread(m, RUN))
        else:
            s = _spread(FMT.scale(w_ptr, row_bytes, offs_n, k_run, m_run), RUN)
        v = FMT.apply(s, FMT.code(w_ptr, row_bytes, offs_n, offs_k, mask, tab_ptr))
        # a run's scale is loaded when any of its weights is used: zero the others explicitly
        return tl.where(mask, v, 0.0)


# ---------------------------------------------------------------- codes and run scales, split
#
# For the formats below a weight is one multiplicative scale per run (the block) times an exact
# small-integer code: w = s[n, run] * c[n, k], every c exact in bf16 (|c| <= 128). A GEMM can
# then feed the codes to the tensor cores and scale each run's partial sum once,
#     sum_k x[k] * w[n, k] = sum_runs s[n, run] * (sum_{k in run} x[k] * c[n, k]),
# instead of multiplying and rounding every weight. `s * c` (fp32) equals decode_tile bit for bit.


@triton.jit
def decode_codes(FMT: tl.constexpr, w_ptr, row_bytes, offs_n, offs_k, mask):
    """fp32 [BN, BK] codes c of a SCALED_CODE_FORMATS format (0 where masked); arguments as
    decode_tile. Exact small integers (bf16-exact)."""
    tl.static_assert(FMT.SCALED, "decode_codes: not a SCALED_CODE_FORMATS format")
    return tl.where(mask, FMT.code(w_ptr, row_bytes, offs_n, offs_k, mask), 0.0)


@triton.jit
def decode_run_scale(FMT: tl.constexpr, w_ptr, row_bytes, offs_n, k_run, n_mask):
    """fp32 [BN] scale s of the run holding weight k_run (a scalar) in each row offs_n; 0 where
    n_mask is False. decode_tile's value is s * c (see decode_codes)."""
    tl.static_assert(FMT.SCALED, "decode_run_scale: not a SCALED_CODE_FORMATS format")
    BN: tl.constexpr = offs_n.shape[0]
    ok = k_run + tl.zeros((1,), tl.int32)                                # [1]
    m = n_mask[:, None]                                                  # [BN, 1]
    s = FMT.scale(w_ptr, row_bytes, offs_n, ok, m)
    return tl.reshape(tl.where(m, s, 0.0), (BN,))
