"""Decode the routed experts' matrices to bf16 (the "decode, then a dense grouped GEMM" baseline).

strata.kernels.dequant decodes one raw matrix; this reads an ExpertSet (arena + slot table) and
skips experts without tokens on the device, so it needs no sync.

Legend: E experts, R rows (output features), C columns (inputs) of one matrix.

    out[e] = bf16(decode(blob_e.matrix))      for every e with counts[e] > 0; others untouched

`dequant_experts` (Triton, no device sync: idle experts exit early on the device) and
`dequant_experts_torch` share one signature.

A biased layout's fp32 biases (strata.blob.BiasSlot) travel beside the decoded matrices as raw
bytes, not decoded: `copy_biases_into` (Triton, no sync) and `copy_biases_into_torch` share one
signature.
"""
from __future__ import annotations

import torch
import triton

from strata._backend import INTERPRET
from strata.experts import ExpertSet
from strata.formats.tables import device_table
from strata.kernels.moe._expert_dequant_kernel import _copy_words_kernel, _dequant_fwd_kernel
from strata.kernels.decode import format_traits, pair_words_fit
from strata.kernels.decode.streams import STREAM_BLOCK, stream_words_fit
from strata.kernels.decode.superblocks import SUPERBLOCK, superblock_words_fit
from strata.kernels.moe.tiles import (DEFAULT_STREAM_BLOCKS, DEFAULT_STREAMS,
                                      DEFAULT_SUPERBLOCK_TILE, DEFAULT_SUPERBLOCKS,
                                      DEFAULT_WORD_TILE, DEFAULT_WORDS, pinned_choice)

# The byte path's program: DECODE_BN rows x DECODE_BK weights (64 x 64 bf16 out, 8 KiB).
DECODE_BN = 64
DECODE_BK = 64
# The bias copy's program: 1024 words (4 KiB); GPT-OSS's 2F + D = 8640 biases take 9 programs.
BIAS_WORDS = 1024


def word_decode() -> bool:
    """Whether Q8_0/Q4_0 rows of whole 4-byte words decode through aligned word loads: the
    active pin_tile's `words` (an A/B turns it off with `pin_tile(words=False)`), else
    DEFAULT_WORDS."""
    words = pinned_choice("words")
    return DEFAULT_WORDS if words is None else bool(words)


def stream_decode() -> bool:
    """Whether word-aligned MXFP4 matrices decode as one stream of aligned words: the active
    pin_tile's `streams` (`pin_tile(streams=True)`), else DEFAULT_STREAMS."""
    on = pinned_choice("streams")
    return DEFAULT_STREAMS if on is None else bool(on)


def superblock_decode() -> tuple[bool, tuple[int, int]]:
    """(on, (rows, super-blocks) a program) of the super-block word path for Q4_K, Q5_K, Q6_K,
    Q2_K, Q3_K and IQ4_XS: the active pin_tile's `superblocks` / `superblock_tile` (an A/B turns
    the path off with `pin_tile(superblocks=False)`), else the defaults in
    strata.kernels.moe.tiles."""
    on = pinned_choice("superblocks")
    tile = pinned_choice("superblock_tile")
    return (DEFAULT_SUPERBLOCKS if on is None else bool(on),
            DEFAULT_SUPERBLOCK_TILE if tile is None else tuple(tile))


def decode_launch(mat) -> dict:
    """The decode-once launch of matrix `mat` (a MatrixSlot) under the active pin: the kernel's
    tile and path constexprs (BN, BK, WORDS, SUPER, ALIGNED, STREAM). Blob slots are
    256-aligned, so the matrix's own offset decides word alignment. STREAM launches view the
    matrix as one block a row (decode_view)."""
    name = mat.fmt.name
    if stream_decode() and stream_words_fit(name, mat.offset):
        blocks = pinned_choice("stream_blocks")
        return dict(BN=DEFAULT_STREAM_BLOCKS if blocks is None else blocks, BK=STREAM_BLOCK,
                    WORDS=False, SUPER=False, ALIGNED=False, STREAM=True)
    aligned = superblock_words_fit(name, mat.row_bytes, mat.offset)
    on, (rows, nsb) = superblock_decode()
    if on and aligned is not None:
        return dict(BN=rows, BK=nsb * SUPERBLOCK, WORDS=False, SUPER=True, ALIGNED=aligned,
                    STREAM=False)
    words = word_decode() and pair_words_fit(name, mat.cols, mat.row_bytes, mat.offset)
    if words:   # BK a multiple of 64: whole pairs of 32-weight blocks (pair_tile)
        tile = pinned_choice("word_tile")
        rows, cols = DEFAULT_WORD_TILE if tile is None else tuple(tile)
        return dict(BN=rows, BK=cols, WORDS=True, SUPER=False, ALIGNED=False, STREAM=False)
    return dict(BN=DECODE_BN, BK=DECODE_BK, WORDS=False, SUPER=False, ALIGNED=False,
                STREAM=False)


def decode_view(mat, lc: dict) -> tuple[int, int, int]:
    """(rows, columns, row bytes) the launch `lc` (decode_launch) reads matrix `mat` as: its own
    [R, C], or for STREAM [R C / 32, 32], one block a row (rows are contiguous in the blob and
    in the bf16 output, so the stream is the same bytes)."""
    if lc["STREAM"]:
        return mat.rows * mat.cols // STREAM_BLOCK, STREAM_BLOCK, mat.fmt.block_bytes
    return mat.rows, mat.cols, mat.row_bytes


def decode_matrix_into(experts: ExpertSet, mat, dst_slot: torch.Tensor, dst: torch.Tensor,
                       dst_off: int) -> None:
    """Matrix `mat` (a MatrixSlot of the layout) of every expert e with dst_slot[e] >= 0, as bf16
    rows at byte dst_slot[e] + dst_off of the uint8 buffer `dst`. One launch (decode_launch).

    The word paths take what strata.blob guarantees as given, unchecked (a check would need a
    sync): blob slots (experts.slot_offset) are multiples of 256 bytes, and dst_slot[e] and
    dst_off multiples of 16 (bf16 blobs are 256-aligned; dequant_experts' [R, C] steps are
    too, C being a multiple of 64 there)."""
    lc = decode_launch(mat)
    rows, cols, row_bytes = decode_view(mat, lc)
    grid = (experts.n_expert, triton.cdiv(rows, lc["BN"]), triton.cdiv(cols, lc["BK"]))
    _dequant_fwd_kernel[grid](experts.arena, experts.slot_offset, dst_slot, mat.offset,
                              row_bytes, dst, dst_off, device_table("iq", experts.device),
                              rows, cols, FMT=format_traits(mat.fmt), INTERP=INTERPRET, **lc)


def copy_biases_into(experts: ExpertSet, dst_slot: torch.Tensor, dst: torch.Tensor,
                     dst_off: int) -> None:
    """The bias slot (strata.blob.BiasSlot: gate, up, down fp32) of every expert e with
    dst_slot[e] >= 0, copied bit for bit to byte dst_slot[e] + dst_off of the uint8 buffer `dst`.
    One launch, no host sync: experts with dst_slot -1 exit on the device. The layout must carry
    biases; dst_slot[e] and dst_off are multiples of 4 (bf16 blobs and bias slots are 256-aligned,
    unchecked: a check would need a sync)."""
    bias = experts.layout.bias
    n = bias.nbytes // 4
    grid = (experts.n_expert, triton.cdiv(n, BIAS_WORDS))
    _copy_words_kernel[grid](experts.arena, experts.slot_offset, bias.offset, dst_slot, dst,
                             dst_off, n, BW=BIAS_WORDS)


def copy_biases_into_torch(experts: ExpertSet, dst_slot: torch.Tensor, dst: torch.Tensor,
                           dst_off: int) -> None:
    """Plain-torch reference of `copy_biases_into` (same signature; reads dst_slot on the host)."""
    bias = experts.layout.bias
    for e, at in enumerate(dst_slot.tolist()):
        if at >= 0:
            src = int(experts.slot_offset[e]) + bias.offset
            dst[at + dst_off:at + dst_off + bias.nbytes] = experts.arena[src:src + bias.nbytes]


def dequant_experts(experts: ExpertSet, name: str, counts: torch.Tensor, *,
                    out: torch.Tensor | None = None) -> torch.Tensor:
    """Matrix `name` of every expert with counts[e] > 0, as bf16 [E, R, C] (see module doc)."""
    mat = getattr(experts.layout, name)
    E = experts.n_expert
    if out is None:
        out = torch.empty(E, mat.rows, mat.cols, dtype=torch.bfloat16, device=experts.device)
    step = mat.rows * mat.cols * 2
    dst_slot = torch.where(counts[:E] > 0,
                           torch.arange(E, device=counts.device, dtype=torch.int64) * step, -1)
    decode_matrix_into(experts, mat, dst_slot, out.view(torch.uint8).view(-1), 0)
    return out


def dequant_experts_torch(experts: ExpertSet, name: str, counts: torch.Tensor, *,
                          out: torch.Tensor | None = None) -> torch.Tensor:
    from strata.kernels.moe.ffn import dequantize_matrix
    mat = getattr(experts.layout, name)
    if out is None:
        out = torch.empty(experts.n_expert, mat.rows, mat.cols, dtype=torch.bfloat16,
                          device=experts.device)
    for e in torch.nonzero(counts > 0).flatten().tolist():
        out[e] = dequantize_matrix(experts, e, name).to(torch.bfloat16)
    return out
