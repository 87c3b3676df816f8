"""Random expert sets for tests and benchmarks: real blobs in a real arena.

Legend: E experts, D hidden, F expert width. Weights are drawn N(0, 1/sqrt(fan_in)) so the
feed-forward's activations stay O(1) at any width, then stored in each matrix's format.
"""
from __future__ import annotations

import torch

from strata.blob import BlobLayout
from strata.errors import StrataError
from strata.experts import ExpertSet

_PLAIN = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}


def encode_matrix(w: torch.Tensor, fmt) -> torch.Tensor:
    """fp32 [rows, cols] -> the format's bytes (uint8, row-major by output feature)."""
    if fmt.name in _PLAIN:
        return w.to(_PLAIN[fmt.name]).contiguous().view(torch.uint8).reshape(-1)
    from strata.formats.codec import QUANTIZERS, quantize
    if fmt.name not in QUANTIZERS:
        return random_blocks(fmt, w.shape[0], w.shape[1], seed=int(w.flatten()[0].abs() * 1e6))
    return quantize(w.float().cpu(), fmt).reshape(-1)


def random_blocks(fmt, rows: int, cols: int, *, seed: int = 0) -> torch.Tensor:
    """Random but valid blocks for a format strata cannot quantize to (decode-only): random codes,
    fp16 scales (the table's `fp16_fields`, IQ1_M's split `f16_nibbles`) drawn small enough that
    weights stay O(1/sqrt(cols)). For benchmarks and tests of the GEMM, which only needs real
    bytes that the decoder and the reference agree on."""
    if fmt.block == 1 or (not fmt.fp16_fields and fmt.f16_nibbles is None):
        raise StrataError(f"no random-block recipe for {fmt.name}")
    g = torch.Generator().manual_seed(seed)
    n_blk = rows * cols // fmt.block
    raw = torch.randint(0, 256, (n_blk, fmt.block_bytes), generator=g, dtype=torch.uint8)
    for off in fmt.fp16_fields:
        d = (torch.rand(n_blk, generator=g) + 0.5) * 2.0 ** -10 / cols ** 0.5
        raw[:, off:off + 2] = d.to(torch.float16).view(torch.uint8).reshape(n_blk, 2)
    if fmt.f16_nibbles is not None:   # nibble j of d in the top nibble of u16 word j
        d = (torch.rand(n_blk, generator=g) + 0.5) * 2.0 ** -10 / cols ** 0.5
        u = d.to(torch.float16).view(torch.int16).to(torch.int32) & 0xFFFF
        for j in range(4):
            at = fmt.f16_nibbles + 2 * j + 1
            raw[:, at] = (raw[:, at] & 0x0F) | (((u >> (4 * j)) & 0xF) << 4).to(torch.uint8)
    return raw.reshape(-1)


def random_expert_set(n_expert: int, d_model: int, d_expert: int, gate="BF16", up=None,
                      down=None, *, device="cpu", seed: int = 0, absent=(),
                      shuffle: bool = True, bias: bool = False, act=None) -> ExpertSet:
    """E experts with random weights in the given formats. Experts in `absent` get
    slot_offset -1 (and no bytes); with `shuffle` blobs sit in the arena in a permuted order, so
    a kernel that ignores the slot table reads the wrong expert. `bias`: random N(0, 0.5^2)
    fp32 biases in the blob's bias slot; `act`: the experts' ExpertAct (default silu)."""
    lay = BlobLayout.make(d_model, d_expert, gate, up, down, bias=bias, act=act)
    gen = torch.Generator().manual_seed(seed)
    present = [e for e in range(n_expert) if e not in set(absent)]
    order = (torch.randperm(len(present), generator=gen).tolist() if shuffle
             else list(range(len(present))))
    arena = torch.zeros(max(1, len(present)) * lay.size, dtype=torch.uint8)
    slot = torch.full((n_expert,), -1, dtype=torch.int64)
    for pos, e in zip(order, present):
        slot[e] = pos * lay.size
        for mat in lay.matrices:
            w = torch.randn(mat.rows, mat.cols, generator=gen) / mat.cols ** 0.5
            raw = encode_matrix(w, mat.fmt)
            assert raw.numel() == mat.nbytes, (mat, raw.numel())
            start = pos * lay.size + mat.offset
            arena[start:start + mat.nbytes] = raw.cpu()
        if lay.bias is not None:
            b = 0.5 * torch.randn(lay.bias.nbytes // 4, generator=gen)
            start = pos * lay.size + lay.bias.offset
            arena[start:start + lay.bias.nbytes] = b.view(torch.uint8)
    return ExpertSet(arena.to(device), slot.to(device), lay)
