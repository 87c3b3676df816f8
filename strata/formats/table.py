"""The block formats strata reads, each described once.

A matrix of shape [N, K] (N output features, K inputs) is stored row-major by output feature,
each row ceil-free: K must be a multiple of the format's block size, a row is K / block weights
blocks of `block_bytes` each, exactly as a GGUF file stores it.
"""
from __future__ import annotations

from dataclasses import dataclass

from strata.errors import StrataError


@dataclass(frozen=True)
class Format:
    name: str          # ggml's name, e.g. "Q4_K"
    ggml_type: int     # GGMLQuantizationType value
    block: int         # weights per block
    block_bytes: int   # bytes per block
    layout: str        # field layout, for humans
    fp16_fields: tuple[int, ...] = ()  # byte offsets of the fp16 scales in a block (bf16 for BF16)
    family: str = "legacy"  # plain | legacy (32-weight) | kquant | iquant (grid/level tables) | mx
    # IQ1_M only: byte offset of four little-endian u16 words whose top nibbles (word 0 lowest)
    # are the bits of its one fp16 scale; None for every other format
    f16_nibbles: int | None = None
    # What strata.kernels.decode can do with the format, stated here once (its dispatch, tests and
    # the expert GEMM's variant choice read these; a new format sets them with its decoder):
    triton: bool = False       # decode_tile / decode_tile_runs decode it (the GEMM and dequantize)
    tile_run: int = 0          # weights sharing one scale load in decode_tile_runs (0: no scales)
    scaled_code: bool = False  # w = s * c, one multiplicative scale per block times an exact small
    #                            integer code: decode_codes / decode_run_scale (code run = block)
    code_words: bool = False   # raw code words: load_code_bytes / codes_from_bytes and the aligned
    #                            word-pair path (pair_tile), for 32-weight blocks with an fp16 head

    def row_bytes(self, k: int) -> int:
        """Bytes of one row of `k` weights; a clear error if `k` is not whole blocks."""
        if k % self.block:
            raise StrataError(f"a {self.name} row must hold a multiple of {self.block} weights, "
                              f"got {k}; pick another format or pad the matrix")
        return k // self.block * self.block_bytes

    def nbytes(self, n: int, k: int) -> int:
        """Bytes of an [n, k] matrix."""
        return n * self.row_bytes(k)

    @property
    def bits_per_weight(self) -> float:
        return 8.0 * self.block_bytes / self.block


_ALL = [
    Format("F32", 0, 1, 4, "plain fp32", family="plain"),
    Format("F16", 1, 1, 2, "plain fp16", (0,), family="plain",
           triton=True),
    Format("BF16", 30, 1, 2, "plain bf16", (0,), family="plain",
           triton=True),
    Format("Q8_0", 8, 32, 34, "fp16 d; int8 qs[32]; w = d*q", (0,),
           triton=True, tile_run=32, scaled_code=True, code_words=True),
    Format("Q4_0", 2, 32, 18, "fp16 d; qs[16] nibbles (low = j, high = j+16); w = d*(q-8)", (0,),
           triton=True, tile_run=32, scaled_code=True, code_words=True),
    Format("Q4_1", 3, 32, 20, "fp16 d, m; qs[16] nibbles (low = j, high = j+16); w = d*q + m",
           (0, 2),
           triton=True, tile_run=32),
    Format("Q5_0", 6, 32, 22, "fp16 d; qh[4] 5th bits; qs[16]; w = d*(q-16)", (0,),
           triton=True, tile_run=32, scaled_code=True),
    Format("Q5_1", 7, 32, 24, "fp16 d, m; qh[4] 5th bits; qs[16]; w = d*q + m", (0, 2),
           triton=True, tile_run=32),
    Format("IQ4_NL", 20, 32, 18, "fp16 d; qs[16] nibbles index kvalues_iq4nl[16]", (0,),
           family="iquant",
           triton=True, tile_run=32, scaled_code=True),
    Format("Q2_0", 42, 64, 18,
           "fp16 d; qs[16]; weight j at byte j/4 bits 2*(j%4); w = d*(q-1)", (0,),
           triton=True, tile_run=32, scaled_code=True),
    Format("Q2_K", 10, 256, 84,
           "scales[16] (4-bit scale | 4-bit min); qs[64] 2-bit; fp16 d, dmin", (80, 82),
           family="kquant",
           triton=True, tile_run=16),
    Format("Q3_K", 11, 256, 110,
           "hmask[32] 3rd bits; qs[64] 2-bit; scales[12] (6-bit, -32); fp16 d", (108,),
           family="kquant",
           triton=True, tile_run=16),
    Format("Q4_K", 12, 256, 144, "fp16 d, dmin; scales[12] (6-bit scales/mins); qs[128]", (0, 2),
           family="kquant",
           triton=True, tile_run=32),
    Format("Q5_K", 13, 256, 176,
           "fp16 d, dmin; scales[12] (6-bit scales/mins); qh[32] 5th bits; qs[128]", (0, 2),
           family="kquant",
           triton=True, tile_run=32),
    Format("Q6_K", 14, 256, 210, "ql[128]; qh[64]; int8 scales[16]; fp16 d", (208,),
           family="kquant",
           triton=True, tile_run=16),
    Format("IQ2_XXS", 16, 256, 66,
           "fp16 d; 8 x (u32 4 grid indices, u32 4x7 sign bits | 4-bit scale); 256 x 8 grid", (0,),
           family="iquant",
           triton=True, tile_run=32),
    Format("IQ2_XS", 17, 256, 74,
           "fp16 d; u16 qs[32] (9-bit grid index | 7-bit signs); scales[8] nibbles; 512 x 8 grid",
           (0,), family="iquant",
           triton=True, tile_run=16),
    Format("IQ3_XXS", 18, 256, 98,
           "fp16 d; qs[64] grid indices; 8 x u32 (4x7 sign bits | 4-bit scale); 256 x 4 grid",
           (0,), family="iquant",
           triton=True, tile_run=32),
    Format("IQ1_S", 19, 256, 50,
           "fp16 d; qs[32]; u16 qh[8] (4x3 index bits | 3-bit scale | delta sign); 2048 x 8 grid",
           (0,), family="iquant",
           triton=True, tile_run=32),
    Format("IQ3_S", 21, 256, 110,
           "fp16 d; qs[64]; qh[8]; signs[32]; scales[4]; 512-entry grid", (0,), family="iquant",
           triton=True, tile_run=32),
    Format("IQ2_S", 22, 256, 82,
           "fp16 d; qs[32]; signs[32]; qh[8] (2-bit index highs); scales[8] nibbles; 1024 x 8 grid",
           (0,), family="iquant",
           triton=True, tile_run=16),
    Format("IQ4_XS", 23, 256, 136,
           "fp16 d; u16 scales_h; scales_l[4]; qs[128] nibbles index kvalues_iq4nl", (0,),
           family="iquant",
           triton=True, tile_run=32),
    Format("IQ1_M", 29, 256, 56,
           "qs[32]; qh[16] (3 index bits | delta sign per nibble); 4 x u16 scales (4x3-bit "
           "scales | fp16 d nibble); 2048 x 8 grid", f16_nibbles=48, family="iquant",
           triton=True, tile_run=16),
    Format("MXFP4", 39, 32, 17, "e8m0 scale; qs[16] e2m1 nibbles", family="mx",
           triton=True, tile_run=32, scaled_code=True),
]

FORMATS: dict[str, Format] = {f.name: f for f in _ALL}
_BY_TYPE: dict[int, Format] = {f.ggml_type: f for f in _ALL}


def get_format(qtype) -> Format:
    """A Format from a name ('q4_k', 'Q4_K'), a ggml type id, a GGMLQuantizationType or a Format."""
    if isinstance(qtype, Format):
        return qtype
    if isinstance(qtype, str):
        fmt = FORMATS.get(qtype.strip().upper())
        if fmt is None:
            raise StrataError(f"unknown block format {qtype!r}; strata reads "
                              f"{', '.join(FORMATS)}")
        return fmt
    try:
        key = int(qtype)  # ints and IntEnums (gguf.GGMLQuantizationType)
    except (TypeError, ValueError):
        raise StrataError(f"cannot read block format {qtype!r}; give a name such as 'Q4_K'") from None
    fmt = _BY_TYPE.get(key)
    if fmt is None:
        name = getattr(qtype, "name", str(key))
        raise StrataError(f"ggml type {name} ({key}) is not a format strata reads; strata reads "
                          f"{', '.join(FORMATS)}")
    return fmt


def row_bytes(qtype, k: int) -> int:
    return get_format(qtype).row_bytes(k)
