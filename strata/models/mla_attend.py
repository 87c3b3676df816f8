"""One key block of MLA's blocked attention (strata.models.mla): which blocks a query block
attends, one launch per block with its log-sum-exp, and the fp32 merge of the blocks.

Legend: H heads, n queries of the block, m keys of the block, hd = N + R the q/k head width,
Hv the value head width, W = max(hd, Hv) the flash backend's padded value width.

    key_blocks(kv_end, n, B)     the (start, end, masked) key blocks of a query block (square:
                                 the masked one n x n, for cuDNN's mask)
    attend_block_ref             plain torch, fp32 scores: the twin of the two below
    attend_block                 CUDA "efficient": torch's memory-efficient kernel, v [H, m, Hv]
    attend_block_flash           CUDA "flash": torch's flash forward, v [H, m, W] zero-padded
    attend_block_cudnn           CUDA "cudnn": cuDNN's attention, q/k and v at their own widths
                                 (a masked block that is not square: attend_block)
    attend_block_triton          "triton": strata's block kernel (strata.kernels.attention.
                                 mla_block), q/k and v at their own widths
    attend_carried               "triton" as the blocked attention runs it: the softmax state
                                 carried from block to block by the launches, no merge
    merge_block                  fold one block's (o, lse) into the fp32 state (acc, lse):
                                 strata.kernels.attention.merge's twin; lse_merge its kernel

Every backend takes q [H, n, hd], k [H, m, hd] and returns (o [H, n, Hv] in q's dtype,
lse fp32 [H, n]): the natural log of the sum of exp(scale · q.k) over the keys a query sees;
masked: query i sees keys 0..i + m - n (bottom-right, the block that ends at the queries' own
keys). strata.models.mla_launch picks the backend (`attend_for`) and the merge (`merge_for`).
"""
from __future__ import annotations

import functools

import torch

from strata.kernels.attention.flash import (attend_block_ref, cudnn_forward, flash_fits,
                                           flash_forward)
from strata.kernels.attention.merge import lse_merge, lse_merge_torch
from strata.kernels.attention.mla_block import attend_block_triton, mla_block_attention

# the plain-torch merge, by the name the blocked attention and its tests know
merge_block = lse_merge_torch


def key_blocks(kv_end: int, n: int, block: int,
               square: bool = False) -> list[tuple[int, int, bool]]:
    """The key blocks a query block of n tokens whose last query sees keys 0..kv_end-1 attends:
    (start, end, masked), ending with the one of min(block, kv_end) keys that ends at kv_end,
    masked bottom-right (its query i sees its first i + size - n + 1 keys); the ones before it
    are seen whole. Needs n <= min(block, kv_end). `square`: the masked block is the n keys that
    end at kv_end (a square one, where a top-left causal mask is the bottom-right one: cuDNN's),
    the keys before it in blocks of `block` from the first; one block more at most."""
    lo = kv_end - n if square else max(0, kv_end - block)
    return [(a, min(a + block, lo), False) for a in range(0, lo, block)] + [(lo, kv_end, True)]


_NO_MASK, _BOTTOM_RIGHT = 0, 2   # the memory-efficient kernel's custom_mask_type values


def attend_block(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, masked: bool,
                 scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """attend_block_ref's signature on CUDA: torch's memory-efficient attention kernel (what
    scaled_dot_product_attention runs for q/k heads of 192 and values of 128, flash needing
    equal widths), asked for its log-sum-exp (natural log of the scaled scores, rows padded).
    Head widths not multiples of 8 or other dtypes go to attend_block_ref."""
    n, hd, Hv = q.shape[1], q.shape[-1], v.shape[-1]
    if not q.is_cuda or hd % 8 or Hv % 8 or q.dtype not in (torch.bfloat16, torch.float16):
        return attend_block_ref(q, k, v, masked, scale)
    # the call torch.nn.attention.bias.CausalBias makes for a bottom-right mask, asking for lse
    o, lse = torch.ops.aten._efficient_attention_forward(
        q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None], bias=None,
        cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None,
        dropout_p=0.0, custom_mask_type=_BOTTOM_RIGHT if masked else _NO_MASK,
        compute_log_sumexp=True, scale=scale)[:2]
    return o[0].transpose(0, 1), lse[0, :, :n]                               # [H, n, Hv], [H, n]


def attend_block_cudnn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, masked: bool,
                       scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """attend_block's signature through cuDNN's attention (strata.kernels.attention.flash.
    cudnn_forward), which takes q/k of 192 and values of 128 as they are: on the H100 one causal
    launch over 8,192 tokens of DeepSeek-V3's 128 heads ran in 4.35 ms, 632 TFLOP/s
    (experiments/results/mla_cudnn_probe-NVIDIA_H100-6e3010d.log), and the blocked attention of
    that chunk (its keys decompressed a block at a time) in 6.58 ms against the triton backend's
    7.61 (mla_cudnn_bench-NVIDIA_H100-6e3010d.log). cuDNN's causal mask is aligned
    top-left, which is the bottom-right mask only for a square block: the blocked attention tiles
    the keys so that its masked block is square (key_blocks(square=True)); a masked block with
    more keys than queries, given here all the same, and operands cuDNN does not take go to
    attend_block."""
    n, m, hd, Hv = q.shape[1], k.shape[1], q.shape[-1], v.shape[-1]
    if not q.is_cuda or (masked and n != m) or hd % 8 or Hv % 8 or \
            q.dtype not in (torch.bfloat16, torch.float16):
        return attend_block(q, k, v, masked, scale)
    return cudnn_forward(q, k, v, masked, scale)


def attend_block_flash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, masked: bool,
                       scale: float, *, v_dim: int, kernel=None) -> tuple[torch.Tensor,
                                                                          torch.Tensor]:
    """attend_block_ref's meaning with the values zero-padded: v [H, m, W] (W = max(hd, v_dim),
    its columns v_dim.. zero; any head stride: the scratch's flash layout) -> (o [H, n, v_dim],
    lse fp32 [H, n]). The padded columns leave the softmax alone and give o's columns v_dim..
    as zeros, which are cut off. `kernel` (q, k, v, masked, scale) -> (o [H, n, W], lse):
    flash_forward where flash_fits, else attend_block_ref on the same padded v off CUDA (the
    stand-in the CPU tests hold to the unpadded result); on CUDA with operands flash does not
    take, the efficient backend on the unpadded view."""
    if kernel is None:
        if flash_fits(q, k, v):
            kernel = flash_forward
        elif q.is_cuda:
            return attend_block(q, k, v[..., :v_dim], masked, scale)
        else:
            kernel = attend_block_ref
    o, lse = kernel(q, k, v, masked, scale)
    return o[..., :v_dim], lse


def attend_for(backend: str, v_dim: int):
    """The block launch of `backend` (strata.models.mla_launch.BACKENDS) as attend_block's
    signature; "flash" takes its v padded to W columns (MLAScratch.kv with rows); "triton"
    (attend_block_triton: the block kernel with no state) is the signature's form of the launch
    the blocked attention runs as `attend_carried`."""
    if backend == "flash":
        return functools.partial(attend_block_flash, v_dim=v_dim)
    return {"triton": attend_block_triton, "cudnn": attend_block_cudnn}.get(backend,
                                                                            attend_block)


def attend_carried(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, masked: bool,
                   scale: float, *, acc: torch.Tensor, lse: torch.Tensor, first: bool,
                   out: torch.Tensor | None) -> None:
    """The "triton" backend's key block: folded into the fp32 state (acc [H, n, Hv], lse
    [H, n]) by the launch itself (none to resume from when `first`); with `out` (o [H, n, Hv],
    the last block) the result goes there instead of acc: no merge, no copy out of acc."""
    mla_block_attention(q, k, v, masked, scale, o=acc if out is None else out, lse=lse,
                        acc=None if first else acc)


def merge_for(merge: str):
    """The merge of strata.models.mla_launch.MERGES as merge_block's signature."""
    return lse_merge if merge == "fused" else merge_block


__all__ = ["attend_block", "attend_block_cudnn", "attend_block_flash", "attend_block_ref",
           "attend_block_triton", "attend_carried", "attend_for", "flash_fits", "flash_forward",
           "key_blocks", "merge_block", "merge_for"]
