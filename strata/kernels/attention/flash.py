"""torch's FlashAttention-2 forward as one key block's attention with its log-sum-exp: what MLA's
blocked attention (strata.models.mla_attend) and a later chunk's bf16 prefix at a wide head
(strata.kernels.attention.flash_prefix) both merge by their log-sum-exp; and cuDNN's attention
the same way (cudnn_forward), for that prefix (its default on Hopper: flash_prefix.blocks_kernel);
and a chunk with no prefix, causal over its own keys by torch's SDPA (first_chunk_attention:
the engine's first chunk, strata.models.kv.PromptKV.attend).

Legend: H query heads, Hkv key heads (H a multiple: GQA as FlashAttention-2 takes it), n queries,
m keys, hd head width, T a chunk's tokens.

torch's attention ops take no output buffer: each allocates its own beside the engine's carve,
out of the plan's reserve (strata.memory.rig.RESERVE). OUT_BYTES bounds one launch's: a launch
that would pass it goes over groups of heads (launch_groups), each group's output copied into
the caller's buffer (the carve's) as it comes.
"""
from __future__ import annotations

import torch

OUT_BYTES = 128 << 20   # the most one attention launch's output takes beside the carve


def launch_groups(H: int, Hkv: int, rows: int, width: int, itemsize: int,
                  out_bytes: int | None = None) -> list[slice]:
    """The query heads of each launch over `rows` queries whose output is [heads, rows, width]
    of `itemsize` bytes: all H in one launch while that fits `out_bytes`, else groups of the
    most whole GQA groups (H / Hkv query heads a key head) that fit, at least one (None:
    OUT_BYTES, read now)."""
    out_bytes = OUT_BYTES if out_bytes is None else out_bytes
    G = H // Hkv
    per = rows * width * itemsize * G                     # one key head's query heads
    n = max(1, min(Hkv, out_bytes // max(1, per))) * G
    return [slice(h, min(H, h + n)) for h in range(0, H, n)]


def attend_block_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, masked: bool,
                     scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """q [H, n, hd], k [Hkv, m, hd], v [Hkv, m, Hv] (H a multiple of Hkv: GQA, query head h
    reading kv head h // (H / Hkv)) -> (o [H, n, Hv] in q's dtype, lse fp32 [H, n]), scores and
    sums in fp32; masked: query i sees keys 0..i + m - n (bottom-right). The plain-torch twin
    of flash_forward (and cudnn_forward) off CUDA."""
    n, m = q.shape[1], k.shape[1]
    G = q.shape[0] // k.shape[0]
    kf, vf = k.float(), v.float()
    if G > 1:
        kf, vf = kf.repeat_interleave(G, dim=0), vf.repeat_interleave(G, dim=0)
    s = (q.float() @ kf.transpose(1, 2)) * scale                              # [H, n, m]
    if masked:
        hide = torch.arange(m, device=q.device)[None, :] > \
            torch.arange(n, device=q.device)[:, None] + (m - n)
        s = s.masked_fill(hide, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    return (torch.exp(s - lse[..., None]) @ vf).to(q.dtype), lse


def flash_fits(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether torch's flash forward takes these operands: CUDA, bf16 or fp16 alike, one head
    width hd for q, k and (padded) v, a multiple of 8 and at most 256 (FlashAttention-2's
    checks in mha_fwd)."""
    hd = q.shape[-1]
    return (q.is_cuda and q.dtype in (torch.bfloat16, torch.float16) and
            k.dtype == v.dtype == q.dtype and k.shape[-1] == v.shape[-1] == hd and
            hd % 8 == 0 and hd <= 256)


def flash_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, masked: bool,
                  scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """q [H, n, hd], k and v [Hkv, m, hd] (GQA; last dim contiguous, any head stride) -> (o [H, n,
    hd], lse fp32 [H, n]) through torch.ops.aten._flash_attention_forward (FlashAttention-2,
    vendored in aten/src/ATen/native/transformers/cuda/flash_attn), called positionally with the
    fields every torch since 2.1 shares: (query, key, value, cum_seq_q, cum_seq_k, max_q, max_k,
    dropout_p, is_causal, return_debug_mask, *, scale) -> (output, softmax_logsumexp, rng_state,
    unused, debug_attn_mask); the later keywords (window sizes, seqused_k, alibi_slopes,
    block_table, num_splits) keep their defaults. Operands are [batch, seq, heads, hd] with only the
    last dim contiguous (mha_fwd's checks), so the head-major blocks go as transposed views, no
    copy. What the source says (torch's flash_api.cpp and mask.h, read for this call): is_causal
    sets window_size_right = 0, and the mask keeps key j for query i when j < i + 1 + seqlen_k -
    seqlen_q: aligned bottom-right, query i sees keys 0..i + m - n, as attend_block_ref's mask; at
    seqlen_q == 1 is_causal is dropped ("the same as causal=false": true only bottom-right). The lse
    is [batch, heads, seqlen_q] fp32, row_max·scale + log(row_sum): the natural log of the scaled
    scores' sum, the efficient kernel's meaning (a row with no key visible would read +inf;
    key_blocks never makes one)."""
    n, m = q.shape[1], k.shape[1]
    o, lse = torch.ops.aten._flash_attention_forward(
        q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
        None, None, n, m, 0.0, masked, False, scale=scale)[:2]
    return o[0].transpose(0, 1), lse[0, :, :n]                               # [H, n, hd], [H, n]


def cudnn_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, masked: bool,
                  scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """flash_forward's meaning through cuDNN's attention (torch.ops.aten.
    _scaled_dot_product_cudnn_attention: (query, key, value, attn_bias, compute_log_sumexp,
    dropout_p, is_causal, return_debug_mask, *, scale) -> (output, logsumexp, ...), operands
    [batch, heads, seq, hd]), the kernel torch's SDPA picks for a first chunk on the H100 (~570
    TFLOP/s at hd 256 against FlashAttention-2's ~300). `masked` only for a square block (n ==
    m): where the two alignments of a causal mask agree, so what cuDNN aligns to does not
    matter. The lse is read as [heads, n] whatever trailing unit dims it carries
    (tests/kernels/test_flash_prefix.py's GPU test holds it to the reference)."""
    n, m = q.shape[1], k.shape[1]
    if masked and n != m:
        raise ValueError(f"cudnn_forward masks square blocks only, got {n} queries, {m} keys")
    o, lse = torch.ops.aten._scaled_dot_product_cudnn_attention(
        q[None], k[None], v[None], None, True, 0.0, masked, False, scale=scale)[:2]
    return o[0], lse.reshape(lse.shape[0], lse.shape[1], -1)[0, :, :n]     # [H, n, hd], [H, n]


def head_groups(attend, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                out: torch.Tensor | None = None, out_bytes: int | None = None) -> torch.Tensor:
    """attend(q [1, h, n, hd], k [1, hk, m, hd], v [1, hk, m, hv]) -> [1, h, n, hv] (a torch
    attention op, GQA) over q [H, n, hd], k [Hkv, m, hd], v [Hkv, m, hv] (head-major views) ->
    o [n, H, hv]: given `out` [n, H, hv], into it, over groups of heads (launch_groups) where one
    launch's output would pass `out_bytes` (None: OUT_BYTES, read now). The op's output is
    head-major, so o token-major is a copy wherever it lands: into `out` (the carve's attn)
    rather than the [n, H·hv] the output projection's reshape would allocate. Without `out`,
    one launch's own output as it comes (a transposed view)."""
    out_bytes = OUT_BYTES if out_bytes is None else out_bytes
    H, n = q.shape[:2]
    Hkv, hv = k.shape[0], v.shape[-1]
    groups = launch_groups(H, Hkv, n, hv, q.element_size(), out_bytes) if out is not None \
        else [slice(0, H)]
    G = H // Hkv
    for g in groups:
        kv = slice(g.start // G, g.stop // G)
        o = attend(q[None, g], k[None, kv], v[None, kv])[0]                     # [h, n, hv]
        if out is None:
            return o.transpose(0, 1)
        out[:, g].copy_(o.transpose(0, 1))
    return out


def causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """torch's SDPA, causal over a chunk's own keys (GQA): q [1, H, T, hd], k, v [1, Hkv, T, hd]
    -> [1, H, T, hd]."""
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                            enable_gqa=True)


def first_chunk_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                          out: torch.Tensor | None = None,
                          out_bytes: int | None = None) -> torch.Tensor:
    """q [T, H, hd], k, v [T, Hkv, hd] bf16 of a chunk with no keys before it -> o [T, H, hd]:
    causal GQA over its own keys by torch's flash kernel, which runs this 1.2-1.25x faster than
    chunk_attention (attention_bench-NVIDIA_H200-5b184e5.csv, P = 0: 559 vs 455 TFLOP/s at
    T 8,192, 636 vs 512 at 16,384). Under --kv int8 the engine hands it the bf16 values of the
    chunk's int8 codes (strata.models.kv.PromptKV.attend), so both dtypes read the first chunk
    as they store it. `out`, `out_bytes`: head_groups'."""
    return head_groups(causal, q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
                       out=out, out_bytes=out_bytes)
