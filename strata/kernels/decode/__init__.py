"""Triton decode helpers: ggml blocks -> exact fp32 values in registers.

One module per format family, mirroring strata.formats (plain, legacy, kquants, iquants, iq2,
iq1, mxfp4),
the shared loads in _common, the raw code-word paths of Q8_0/Q4_0 in words, the super-block
formats (Q4_K, Q5_K, Q6_K, Q2_K, Q3_K, IQ4_XS) read a super-block at a time as int32 words in
superblocks (the decode-once path's; whole super-blocks, not element-addressed); this module holds
the one dispatch. What each format supports is stated once, in its row of strata.formats.table
(`triton`, `tile_run`, `scaled_code`, `code_words`); the name tuples below are read from there.

Every helper is element-addressed, so any tile shape works (the expert GEMM's inner loop):

    decode_<fmt>(w_ptr, row_bytes, offs_n, offs_k, mask) -> fp32 [BN, BK]
        w_ptr     uint8 pointer at the matrix's first byte (a GGUF [N, K] matrix, rows contiguous),
                  2-byte aligned (blob offsets are 256-aligned, GGUF tensor data 32-aligned)
        row_bytes bytes per row (K / block blocks of block_bytes; `Format.row_bytes(K)`)
        offs_n    [BN] row indices (output features)
        offs_k    [BK] weight indices along the row
        mask      [BN, BK] bool; masked-off elements return 0
    the grid i-quants (IQ3_S, IQ3_XXS, IQ2_XXS/XS/S, IQ1_S/M) take one more argument, tab_ptr:
        the one int32 i-quant table on the device, `strata.formats.tables.device_table("iq",
        device)` (IQ3_S's grid words first, so the older "iq3s" table serves IQ3_S alone).
    decode_tile(FMT, w_ptr, row_bytes, offs_n, offs_k, mask, tab_ptr=None) dispatches at compile
        time on FMT = `Format.ggml_type` (formats whose row says `triton`); the grid i-quants need
        tab_ptr.
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

Adding a format: its torch reference in strata.formats.<family>, its row (with the capability
fields) in strata.formats.table, its _scale/_code/decode_<fmt> in the family module here, and one
branch in each dispatch below that its capabilities name.
"""
import triton
import triton.language as tl

from strata.formats.table import FORMATS
from strata.kernels.decode._common import _scale_first
from strata.kernels.decode.iq1 import (GGML_IQ1_M, GGML_IQ1_S, _iq1_m_code, _iq1_m_scale,
                                       _iq1_s_code, _iq1_s_scale, decode_iq1_m, decode_iq1_s)
from strata.kernels.decode.iq2 import (GGML_IQ2_S, GGML_IQ2_XS, GGML_IQ2_XXS, _iq2_s_code,
                                       _iq2_s_scale, _iq2_xs_code, _iq2_xs_scale, _iq2_xxs_code,
                                       _iq2_xxs_scale, decode_iq2_s, decode_iq2_xs, decode_iq2_xxs)
from strata.kernels.decode.iquants import (GGML_IQ3_S, GGML_IQ3_XXS, GGML_IQ4_NL, GGML_IQ4_XS,
                                           _iq3_s_code, _iq3_s_scale, _iq3_s_value,
                                           _iq3_xxs_code, _iq3_xxs_scale, _iq4_nl_code,
                                           _iq4_nl_scale, _iq4_xs_code, _iq4_xs_scale,
                                           decode_iq3_s, decode_iq3_xxs, decode_iq4_nl,
                                           decode_iq4_xs)
from strata.kernels.decode.kquants import (GGML_Q2_K, GGML_Q3_K, GGML_Q4_K, GGML_Q5_K, GGML_Q6_K,
                                           _q2_k_code, _q2_k_scale, _q3_k_code, _q3_k_scale,
                                           _q4_k_code, _q4_k_scale, _q4_k_value, _q5_k_code,
                                           _q5_k_scale, _q6_k_code, _q6_k_scale, decode_q2_k,
                                           decode_q3_k, decode_q4_k, decode_q5_k, decode_q6_k)
from strata.kernels.decode.legacy import (GGML_Q2_0, GGML_Q4_0, GGML_Q4_1, GGML_Q5_0, GGML_Q5_1,
                                          GGML_Q8_0, _affine_value, _q2_0_code, _q2_0_scale,
                                          _q4_0_code, _q4_0_scale, _q4_1_code, _q4_1_scale,
                                          _q5_0_code, _q5_0_scale, _q5_1_code, _q5_1_scale,
                                          _q8_0_code, _q8_0_scale, _q8_0_value, decode_q2_0,
                                          decode_q4_0, decode_q4_1, decode_q5_0, decode_q5_1,
                                          decode_q8_0)
from strata.kernels.decode.mxfp4 import GGML_MXFP4, _mxfp4_code, _mxfp4_scale, decode_mxfp4
from strata.kernels.decode.plain import GGML_BF16, GGML_F16, decode_bf16, decode_f16
from strata.kernels.decode.words import (codes_from_bytes, load_code_bytes, pair_tile,
                                         pair_words_fit)

__all__ = ["TRITON_FORMATS", "SCALED_CODE_FORMATS", "FAST_CODE_FORMATS", "code_run",
           "decode_tile", "decode_tile_runs", "decode_codes", "decode_run_scale",
           "load_code_bytes", "codes_from_bytes", "pair_tile", "pair_words_fit",
           "decode_bf16", "decode_f16", "decode_q8_0", "decode_q4_0", "decode_q5_0",
           "decode_q2_0", "decode_iq4_nl", "decode_iq3_s", "decode_q4_k", "decode_q6_k",
           "decode_mxfp4", "decode_q4_1", "decode_q5_1", "decode_q2_k", "decode_q3_k",
           "decode_q5_k", "decode_iq4_xs", "decode_iq3_xxs", "decode_iq2_xxs", "decode_iq2_xs",
           "decode_iq2_s", "decode_iq1_s", "decode_iq1_m"]

# the formats decode_tile decodes (ggml type ids above); everything else is a compile-time error
TRITON_FORMATS = tuple(f.name for f in FORMATS.values() if f.triton)
# one multiplicative scale per block times an exact small-integer code (decode_codes)
SCALED_CODE_FORMATS = tuple(f.name for f in FORMATS.values() if f.scaled_code)
# raw code words (load_code_bytes / codes_from_bytes / pair_tile)
FAST_CODE_FORMATS = tuple(f.name for f in FORMATS.values() if f.code_words)
assert set(SCALED_CODE_FORMATS) <= set(TRITON_FORMATS)
assert set(FAST_CODE_FORMATS) <= set(SCALED_CODE_FORMATS)


def code_run(name: str) -> int:
    """Weights sharing one scale in a SCALED_CODE_FORMATS format (the block: 32, Q2_0 64)."""
    assert name in SCALED_CODE_FORMATS, name
    return FORMATS[name].block


def _tile_run(name: str):
    """decode_tile_runs' run of `name` (its table row's tile_run) as a constexpr."""
    f = FORMATS[name]
    assert f.tile_run > 0 and (f.tile_run & (f.tile_run - 1)) == 0, name
    assert f.tile_run % f.block == 0 or f.block % f.tile_run == 0, name
    return tl.constexpr(f.tile_run)


RUN_Q8_0 = _tile_run("Q8_0")
RUN_Q4_0 = _tile_run("Q4_0")
RUN_Q5_0 = _tile_run("Q5_0")
RUN_IQ4_NL = _tile_run("IQ4_NL")
RUN_Q2_0 = _tile_run("Q2_0")
RUN_MXFP4 = _tile_run("MXFP4")
RUN_Q4_K = _tile_run("Q4_K")
RUN_Q6_K = _tile_run("Q6_K")
RUN_IQ3_S = _tile_run("IQ3_S")
RUN_Q4_1 = _tile_run("Q4_1")
RUN_Q5_1 = _tile_run("Q5_1")
RUN_Q2_K = _tile_run("Q2_K")
RUN_Q3_K = _tile_run("Q3_K")
RUN_Q5_K = _tile_run("Q5_K")
RUN_IQ4_XS = _tile_run("IQ4_XS")
RUN_IQ3_XXS = _tile_run("IQ3_XXS")
RUN_IQ2_XXS = _tile_run("IQ2_XXS")
RUN_IQ2_XS = _tile_run("IQ2_XS")
RUN_IQ2_S = _tile_run("IQ2_S")
RUN_IQ1_S = _tile_run("IQ1_S")
RUN_IQ1_M = _tile_run("IQ1_M")


# ---------------------------------------------------------------- whole weights

@triton.jit
def decode_tile(FMT: tl.constexpr, w_ptr, row_bytes, offs_n, offs_k, mask, tab_ptr=None):
    """decode_<fmt> chosen at compile time by FMT = the format's ggml type id."""
    if FMT == GGML_BF16:
        return decode_bf16(w_ptr, row_bytes, offs_n, offs_k, mask)
    elif FMT == GGML_F16:
        return decode_f16(w_ptr, row_bytes, offs_n, offs_k, mask)
    elif FMT == GGML_Q8_0:
        return decode_q8_0(w_ptr, row_bytes, offs_n, offs_k, mask)
    elif FMT == GGML_Q4_0:
        return decode_q4_0(w_ptr, row_bytes, offs_n, offs_k, mask)
    elif FMT == GGML_Q5_0:
        return decode_q5_0(w_ptr, row_bytes, offs_n, offs_k, mask)
    elif FMT == GGML_IQ4_NL:
        return decode_iq4_nl(w_ptr, row_bytes, offs_n, offs_k, mask)
    elif FMT == GGML_Q2_0:
        return decode_q2_0(w_ptr, row_bytes, offs_n, offs_k, mask)
    elif FMT == GGML_MXFP4:
        return decode_mxfp4(w_ptr, row_bytes, offs_n, offs_k, mask)
    elif FMT == GGML_Q4_K:
        return decode_q4_k(w_ptr, row_bytes, offs_n, offs_k, mask)
    elif FMT == GGML_Q6_K:
        return decode_q6_k(w_ptr, row_bytes, offs_n, offs_k, mask)
    elif FMT == GGML_Q4_1:
        return decode_q4_1(w_ptr, row_bytes, offs_n, offs_k, mask)
    elif FMT == GGML_Q5_1:
        return decode_q5_1(w_ptr, row_bytes, offs_n, offs_k, mask)
    elif FMT == GGML_Q2_K:
        return decode_q2_k(w_ptr, row_bytes, offs_n, offs_k, mask)
    elif FMT == GGML_Q3_K:
        return decode_q3_k(w_ptr, row_bytes, offs_n, offs_k, mask)
    elif FMT == GGML_Q5_K:
        return decode_q5_k(w_ptr, row_bytes, offs_n, offs_k, mask)
    elif FMT == GGML_IQ4_XS:
        return decode_iq4_xs(w_ptr, row_bytes, offs_n, offs_k, mask)
    else:
        tl.static_assert(tab_ptr is not None, "i-quant grids need tab_ptr: device_table('iq')")
        if FMT == GGML_IQ3_S:
            return decode_iq3_s(w_ptr, row_bytes, offs_n, offs_k, mask, tab_ptr)
        elif FMT == GGML_IQ3_XXS:
            return decode_iq3_xxs(w_ptr, row_bytes, offs_n, offs_k, mask, tab_ptr)
        elif FMT == GGML_IQ2_XXS:
            return decode_iq2_xxs(w_ptr, row_bytes, offs_n, offs_k, mask, tab_ptr)
        elif FMT == GGML_IQ2_XS:
            return decode_iq2_xs(w_ptr, row_bytes, offs_n, offs_k, mask, tab_ptr)
        elif FMT == GGML_IQ2_S:
            return decode_iq2_s(w_ptr, row_bytes, offs_n, offs_k, mask, tab_ptr)
        elif FMT == GGML_IQ1_S:
            return decode_iq1_s(w_ptr, row_bytes, offs_n, offs_k, mask, tab_ptr)
        else:
            tl.static_assert(FMT == GGML_IQ1_M, "decode_tile: no Triton decoder for this type")
            return decode_iq1_m(w_ptr, row_bytes, offs_n, offs_k, mask, tab_ptr)


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
    32 otherwise (the table's tile_run). BF16/F16 have no
    scales: decode_tile."""
    if (FMT == GGML_BF16) | (FMT == GGML_F16):
        return decode_tile(FMT, w_ptr, row_bytes, offs_n, offs_k, mask, tab_ptr)
    else:
        if FMT == GGML_Q8_0:
            k_run, m_run = _runs(offs_k, mask, RUN_Q8_0)
            d = _spread(_q8_0_scale(w_ptr, row_bytes, offs_n, k_run, m_run), RUN_Q8_0)
            v = _q8_0_value(d, _q8_0_code(w_ptr, row_bytes, offs_n, offs_k, mask))
        elif FMT == GGML_Q4_0:
            k_run, m_run = _runs(offs_k, mask, RUN_Q4_0)
            d = _spread(_q4_0_scale(w_ptr, row_bytes, offs_n, k_run, m_run), RUN_Q4_0)
            v = _scale_first(d, _q4_0_code(w_ptr, row_bytes, offs_n, offs_k, mask))
        elif FMT == GGML_Q5_0:
            k_run, m_run = _runs(offs_k, mask, RUN_Q5_0)
            d = _spread(_q5_0_scale(w_ptr, row_bytes, offs_n, k_run, m_run), RUN_Q5_0)
            v = _scale_first(d, _q5_0_code(w_ptr, row_bytes, offs_n, offs_k, mask))
        elif FMT == GGML_IQ4_NL:
            k_run, m_run = _runs(offs_k, mask, RUN_IQ4_NL)
            d = _spread(_iq4_nl_scale(w_ptr, row_bytes, offs_n, k_run, m_run), RUN_IQ4_NL)
            v = _scale_first(d, _iq4_nl_code(w_ptr, row_bytes, offs_n, offs_k, mask))
        elif FMT == GGML_Q2_0:
            k_run, m_run = _runs(offs_k, mask, RUN_Q2_0)
            d = _spread(_q2_0_scale(w_ptr, row_bytes, offs_n, k_run, m_run), RUN_Q2_0)
            v = _q8_0_value(d, _q2_0_code(w_ptr, row_bytes, offs_n, offs_k, mask))
        elif FMT == GGML_MXFP4:
            k_run, m_run = _runs(offs_k, mask, RUN_MXFP4)
            d = _spread(_mxfp4_scale(w_ptr, row_bytes, offs_n, k_run, m_run), RUN_MXFP4)
            v = _scale_first(d, _mxfp4_code(w_ptr, row_bytes, offs_n, offs_k, mask))
        elif FMT == GGML_Q4_K:
            k_run, m_run = _runs(offs_k, mask, RUN_Q4_K)
            dsc, dm = _q4_k_scale(w_ptr, row_bytes, offs_n, k_run, m_run)
            v = _q4_k_value(_spread(dsc, RUN_Q4_K), _spread(dm, RUN_Q4_K),
                            _q4_k_code(w_ptr, row_bytes, offs_n, offs_k, mask))
        elif FMT == GGML_Q6_K:
            k_run, m_run = _runs(offs_k, mask, RUN_Q6_K)
            d = _spread(_q6_k_scale(w_ptr, row_bytes, offs_n, k_run, m_run), RUN_Q6_K)
            v = _scale_first(d, _q6_k_code(w_ptr, row_bytes, offs_n, offs_k, mask))
        elif FMT == GGML_Q4_1:
            k_run, m_run = _runs(offs_k, mask, RUN_Q4_1)
            d, m = _q4_1_scale(w_ptr, row_bytes, offs_n, k_run, m_run)
            v = _affine_value(_spread(d, RUN_Q4_1), _spread(m, RUN_Q4_1),
                              _q4_1_code(w_ptr, row_bytes, offs_n, offs_k, mask))
        elif FMT == GGML_Q5_1:
            k_run, m_run = _runs(offs_k, mask, RUN_Q5_1)
            d, m = _q5_1_scale(w_ptr, row_bytes, offs_n, k_run, m_run)
            v = _affine_value(_spread(d, RUN_Q5_1), _spread(m, RUN_Q5_1),
                              _q5_1_code(w_ptr, row_bytes, offs_n, offs_k, mask))
        elif FMT == GGML_Q2_K:
            k_run, m_run = _runs(offs_k, mask, RUN_Q2_K)
            dl, ml = _q2_k_scale(w_ptr, row_bytes, offs_n, k_run, m_run)
            v = _q4_k_value(_spread(dl, RUN_Q2_K), _spread(ml, RUN_Q2_K),
                            _q2_k_code(w_ptr, row_bytes, offs_n, offs_k, mask))
        elif FMT == GGML_Q3_K:
            k_run, m_run = _runs(offs_k, mask, RUN_Q3_K)
            d = _spread(_q3_k_scale(w_ptr, row_bytes, offs_n, k_run, m_run), RUN_Q3_K)
            v = _scale_first(d, _q3_k_code(w_ptr, row_bytes, offs_n, offs_k, mask))
        elif FMT == GGML_Q5_K:
            k_run, m_run = _runs(offs_k, mask, RUN_Q5_K)
            dsc, dm = _q5_k_scale(w_ptr, row_bytes, offs_n, k_run, m_run)
            v = _q4_k_value(_spread(dsc, RUN_Q5_K), _spread(dm, RUN_Q5_K),
                            _q5_k_code(w_ptr, row_bytes, offs_n, offs_k, mask))
        elif FMT == GGML_IQ4_XS:
            k_run, m_run = _runs(offs_k, mask, RUN_IQ4_XS)
            d = _spread(_iq4_xs_scale(w_ptr, row_bytes, offs_n, k_run, m_run), RUN_IQ4_XS)
            v = _scale_first(d, _iq4_xs_code(w_ptr, row_bytes, offs_n, offs_k, mask))
        else:
            tl.static_assert(tab_ptr is not None, "i-quant grids need tab_ptr: device_table('iq')")
            if FMT == GGML_IQ3_S:
                k_run, m_run = _runs(offs_k, mask, RUN_IQ3_S)
                mag, neg = _iq3_s_code(w_ptr, row_bytes, offs_n, offs_k, mask, tab_ptr)
                db = _spread(_iq3_s_scale(w_ptr, row_bytes, offs_n, k_run, m_run), RUN_IQ3_S)
                v = _iq3_s_value(db, mag, neg)
            elif FMT == GGML_IQ3_XXS:
                k_run, m_run = _runs(offs_k, mask, RUN_IQ3_XXS)
                mag, neg = _iq3_xxs_code(w_ptr, row_bytes, offs_n, offs_k, mask, tab_ptr)
                db = _spread(_iq3_xxs_scale(w_ptr, row_bytes, offs_n, k_run, m_run), RUN_IQ3_XXS)
                v = _iq3_s_value(db, mag, neg)
            elif FMT == GGML_IQ2_XXS:
                k_run, m_run = _runs(offs_k, mask, RUN_IQ2_XXS)
                mag, neg = _iq2_xxs_code(w_ptr, row_bytes, offs_n, offs_k, mask, tab_ptr)
                db = _spread(_iq2_xxs_scale(w_ptr, row_bytes, offs_n, k_run, m_run), RUN_IQ2_XXS)
                v = _iq3_s_value(db, mag, neg)
            elif FMT == GGML_IQ2_XS:
                k_run, m_run = _runs(offs_k, mask, RUN_IQ2_XS)
                mag, neg = _iq2_xs_code(w_ptr, row_bytes, offs_n, offs_k, mask, tab_ptr)
                db = _spread(_iq2_xs_scale(w_ptr, row_bytes, offs_n, k_run, m_run), RUN_IQ2_XS)
                v = _iq3_s_value(db, mag, neg)
            elif FMT == GGML_IQ2_S:
                k_run, m_run = _runs(offs_k, mask, RUN_IQ2_S)
                mag, neg = _iq2_s_code(w_ptr, row_bytes, offs_n, offs_k, mask, tab_ptr)
                db = _spread(_iq2_s_scale(w_ptr, row_bytes, offs_n, k_run, m_run), RUN_IQ2_S)
                v = _iq3_s_value(db, mag, neg)
            elif FMT == GGML_IQ1_S:
                k_run, m_run = _runs(offs_k, mask, RUN_IQ1_S)
                d = _spread(_iq1_s_scale(w_ptr, row_bytes, offs_n, k_run, m_run), RUN_IQ1_S)
                v = _scale_first(d, _iq1_s_code(w_ptr, row_bytes, offs_n, offs_k, mask, tab_ptr))
            else:
                tl.static_assert(FMT == GGML_IQ1_M, "decode_tile_runs: no decoder for this type")
                k_run, m_run = _runs(offs_k, mask, RUN_IQ1_M)
                d = _spread(_iq1_m_scale(w_ptr, row_bytes, offs_n, k_run, m_run), RUN_IQ1_M)
                v = _scale_first(d, _iq1_m_code(w_ptr, row_bytes, offs_n, offs_k, mask, tab_ptr))
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
    if FMT == GGML_Q8_0:
        c = _q8_0_code(w_ptr, row_bytes, offs_n, offs_k, mask)
    elif FMT == GGML_Q4_0:
        c = _q4_0_code(w_ptr, row_bytes, offs_n, offs_k, mask)
    elif FMT == GGML_Q5_0:
        c = _q5_0_code(w_ptr, row_bytes, offs_n, offs_k, mask)
    elif FMT == GGML_IQ4_NL:
        c = _iq4_nl_code(w_ptr, row_bytes, offs_n, offs_k, mask)
    elif FMT == GGML_Q2_0:
        c = _q2_0_code(w_ptr, row_bytes, offs_n, offs_k, mask)
    else:
        tl.static_assert(FMT == GGML_MXFP4, "decode_codes: not a SCALED_CODE_FORMATS type")
        c = _mxfp4_code(w_ptr, row_bytes, offs_n, offs_k, mask)
    return tl.where(mask, c, 0.0)


@triton.jit
def decode_run_scale(FMT: tl.constexpr, w_ptr, row_bytes, offs_n, k_run, n_mask):
    """fp32 [BN] scale s of the run holding weight k_run (a scalar) in each row offs_n; 0 where
    n_mask is False. decode_tile's value is s * c (see decode_codes)."""
    BN: tl.constexpr = offs_n.shape[0]
    ok = k_run + tl.zeros((1,), tl.int32)                                # [1]
    m = n_mask[:, None]                                                  # [BN, 1]
    if FMT == GGML_Q8_0:
        s = _q8_0_scale(w_ptr, row_bytes, offs_n, ok, m)
    elif FMT == GGML_Q4_0:
        s = _q4_0_scale(w_ptr, row_bytes, offs_n, ok, m)
    elif FMT == GGML_Q5_0:
        s = _q5_0_scale(w_ptr, row_bytes, offs_n, ok, m)
    elif FMT == GGML_IQ4_NL:
        s = _iq4_nl_scale(w_ptr, row_bytes, offs_n, ok, m)
    elif FMT == GGML_Q2_0:
        s = _q2_0_scale(w_ptr, row_bytes, offs_n, ok, m)
    else:
        tl.static_assert(FMT == GGML_MXFP4, "decode_run_scale: not a SCALED_CODE_FORMATS type")
        s = _mxfp4_scale(w_ptr, row_bytes, offs_n, ok, m)
    return tl.reshape(tl.where(m, s, 0.0), (BN,))
