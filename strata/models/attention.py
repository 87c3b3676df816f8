"""Causal GQA self-attention of one chunk against the KV cache (chunked prefill).

Legend: T tokens of the chunk, P tokens already in the cache, D hidden, H query heads,
Hkv kv heads, hd head dim.

    q = Wq x + bq, k = Wk x + bk, v = Wv x + bv  # [T, H, hd], [T, Hkv, hd], [T, Hkv, hd]
    q, k = qnorm(q), knorm(k)                    # per-head RMSNorm, when the weights carry one
    q, k = rope(q), rope(k)                      # cos/sin from the caller (strata.models.layers;
                                                 # norm and rope one fused kernel on CUDA)
    o = softmax(q k^T / sqrt(hd) + mask, sink) v # keys: the P cached + this chunk's T
                                                 # (a PromptKV: chunk_attention over its
                                                 # [host-staged, resident] segments, bf16)
    y = Wo o + bo                                # [T, D]

mask: causal, and with a `window` W > 0 (a sliding layer) query i sees only keys j with
i - W < j <= i. sink: a learned logit per query head (GPT-OSS) that joins every row's softmax
denominator and is then dropped: o = sum_j e^{s_j} v_j / (e^{sink} + sum_j e^{s_j}).

Packed sequences (the cache's `packed`, strata.models.packed): the chunk holds several
independent sequences back to back and the cache nothing before it; query i sees only keys of
its own sequence (starts[i] <= j <= i), the window and sinks holding within each, and the
positions the caller's RoPE used restart per sequence.

The optional pieces are fields of `AttentionWeights` (Qwen3 has q/k norms, Mixtral none, GPT-OSS
biases and sinks) and the `window` argument, so the wirings that lack them stay as they are.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from strata.kernels.attention.flash import causal, head_groups
from strata.kernels.attention.probe import attention_impl
from strata.models.kv import KVCache, PromptKV
from strata.models.layers import buf_view, into_view, norm_out, norm_rope, rms_norm


@dataclass
class AttentionWeights:
    wq: torch.Tensor                     # [H*hd, D]
    wk: torch.Tensor                     # [Hkv*hd, D]
    wv: torch.Tensor                     # [Hkv*hd, D]
    wo: torch.Tensor                     # [D, H*hd]
    q_norm: torch.Tensor | None = None   # [hd] per-head RMSNorm of q before RoPE (None: none),
    #                                      or [H*hd]: one over all heads (MiniMax-M2)
    k_norm: torch.Tensor | None = None   # [hd] the same for k ([Hkv*hd] with a [H*hd] q_norm)
    bq: torch.Tensor | None = None       # [H*hd] projection biases (None: none)
    bk: torch.Tensor | None = None       # [Hkv*hd]
    bv: torch.Tensor | None = None       # [Hkv*hd]
    bo: torch.Tensor | None = None       # [D]
    sinks: torch.Tensor | None = None    # [H] learned sink logits (None: none)

    def map(self, fn) -> "AttentionWeights":
        """The same weights with `fn` applied to every tensor (dtype or device moves)."""
        return AttentionWeights(**{k: None if t is None else fn(t) for k, t in vars(self).items()})


@dataclass(frozen=True)
class AttentionShape:
    n_head: int          # H
    n_kv_head: int       # Hkv (H % Hkv == 0: query head h reads kv head h // (H / Hkv))
    head_dim: int        # hd
    norm_eps: float      # eps of the q/k norms


def project(x: torch.Tensor, wt: torch.Tensor, b: torch.Tensor | None,
            out: torch.Tensor | None = None) -> torch.Tensor:
    """x [T, n] @ wt^T (+ b): a projection of the attention (into `out` when given: a carve's
    view), the bias added in place."""
    y = torch.matmul(x, wt.t(), out=out)
    if b is None:
        return y
    # the bias in place where it keeps y's dtype (the same bits): no second [T, n] beside y
    return y.add_(b) if torch.promote_types(y.dtype, b.dtype) == y.dtype else y + b


def carve_proj(cache, layer: int) -> dict:
    """The engine's carve views a layer projects into (cache.proj, set by strata.engine.session:
    q, k, v, attn, flat), or {} (a CPU read's or the model's own cache: none)."""
    return getattr(cache, "proj", {}).get(layer, {})


def one_layout(k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """k, v [S, Hkv, hd] with one set of strides, as chunk_attention reads them: a k that is not
    the [T, Hkv, hd] rows norm_rope leaves (a wiring's own rotation, a transposed view beside a
    contiguous v) is copied with v, else both pass as they are."""
    if k.stride() != v.stride():
        return k.contiguous(), v.contiguous()
    return k, v


def masked_attention(q: torch.Tensor, k_all: torch.Tensor, v_all: torch.Tensor, P: int,
                     window: int = 0, sinks: torch.Tensor | None = None,
                     starts: torch.Tensor | None = None,
                     out: torch.Tensor | None = None) -> torch.Tensor:
    """q [H, T, hd] at positions P.., k_all, v_all [Hkv, P+T, hd] -> o [H, T, hd] in q's dtype
    (positions counted from k_all's first key: a sliding layer's cache passes only its kept
    tail as the P), with the sliding window and the sink logits: what SDPA cannot express
    (sinks). `starts` [T] (packed sequences, P = 0): query i sees keys starts[i]..i only.
    bf16 on CUDA runs strata's chunk_attention over the cache in place (flash-style,
    no [H, T, S] scores), its output into `out` [T, H, hd] where given (the carve's attn);
    otherwise an explicit mask and sink column in the model's own dtype (the fp32 reference)."""
    H, T, hd = q.shape
    if q.is_cuda and q.dtype == torch.bfloat16:
        from strata.kernels.attention import KVSegment, chunk_attention
        kt, vt = one_layout(k_all.transpose(0, 1), v_all.transpose(0, 1))  # [P+T, Hkv, hd]
        prefix = [KVSegment(kt[:P], vt[:P])] if P else []
        o = chunk_attention(q.transpose(0, 1), kt[P:], vt[P:], prefix, window=window,
                            sinks=None if sinks is None else sinks.float(), starts=starts,
                            out=out)
        return o.transpose(0, 1)
    G = H // k_all.shape[0]
    K = k_all.repeat_interleave(G, 0)                                # [H, S, hd]
    V = v_all.repeat_interleave(G, 0)
    scores = (q @ K.transpose(1, 2)) * hd ** -0.5                    # [H, T, S]
    qpos = P + torch.arange(T, device=q.device)[:, None]
    kpos = torch.arange(K.shape[1], device=q.device)[None, :]
    seen = kpos <= qpos
    if window > 0:
        seen &= qpos - kpos < window
    if starts is not None:
        seen &= kpos >= P + starts.to(kpos.dtype)[:, None]
    scores = scores.masked_fill(~seen, float("-inf"))
    if sinks is not None:
        col = sinks.to(scores.dtype)[:, None, None].expand(H, T, 1)
        probs = torch.softmax(torch.cat([scores, col], dim=-1), dim=-1)[..., :-1]
    else:
        probs = torch.softmax(scores, dim=-1)
    return probs @ V


def attention(x: torch.Tensor, w: AttentionWeights, s: AttentionShape, cos: torch.Tensor,
              sin: torch.Tensor, cache: KVCache | PromptKV, layer: int, *,
              window: int = 0, out: torch.Tensor | None = None) -> torch.Tensor:
    """x [T, D] (already normed) at positions P..P+T-1 -> [T, D]; appends k, v to `cache`.
    `window` > 0: this layer slides (each query sees its last `window` keys). `out`: where the
    output goes when it takes it (layers.into_view; a decoder passes x itself, its normed
    input, dead once q, k and v are projected)."""
    T, H, Hkv, hd = x.shape[0], s.n_head, s.n_kv_head, s.head_dim
    # the engine's carve holds the chunk's q, k, v (cache.proj: the plan counted them), the raw
    # q in attn (free until the attention's output) and the raw k in v (free until v is
    # projected, after k is normed); each view is None where there is none (a CPU read in
    # fp32, the model's own cache)
    bufs = carve_proj(cache, layer)
    dt = torch.promote_types(x.dtype, w.wv.dtype)
    q = project(x, w.wq, w.bq, buf_view(bufs.get("attn"), (T, H * hd), dt, x.device)
                ).view(T, H, hd)                                     # [T, H, hd]
    k = project(x, w.wk, w.bk, buf_view(bufs.get("v"), (T, Hkv * hd), dt, x.device)
                ).view(T, Hkv, hd)                                   # [T, Hkv, hd]
    qw, kw = w.q_norm, w.k_norm
    if qw is not None and qw.numel() != hd:   # one norm over all heads (MiniMax-M2), then rope:
        # each over its own raw projection (a row-wise norm reads its row before writing it)
        q2, k2 = q.view(T, H * hd), k.view(T, Hkv * hd)
        q = rms_norm(q2, qw, s.norm_eps, norm_out(q2, q2, qw)).view(T, H, hd)
        k = rms_norm(k2, kw, s.norm_eps, norm_out(k2, k2, kw)).view(T, Hkv, hd)
        qw = kw = None
    # the optional per-head norm, then NEOX RoPE: one fused pass each on CUDA (layers.norm_rope)
    q = norm_rope(q, qw, cos, sin, s.norm_eps, norm_out(bufs.get("q"), q, qw))
    k = norm_rope(k, kw, cos, sin, s.norm_eps, norm_out(bufs.get("k"), k, kw))
    v = project(x, w.wv, w.bv, buf_view(bufs.get("v"), (T, Hkv * hd), dt, x.device)
                ).view(T, Hkv, hd)                                   # the raw k read
    # the output into attn (the raw q's, dead once q is rotated) where the route takes it
    o = attend(q, k, v, cache, layer, window=window, sinks=w.sinks,
               into=bufs.get("attn"))                                # [T, H, hd]
    return project(o.reshape(T, s.n_head * s.head_dim), w.wo, w.bo,
                   into_view(out, (T, w.wo.shape[0]), dt, x.device))  # [T, D]


def lower_right_causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """SDPA of q [1, H, T, hd] against k, v [1, Hkv, S, hd] (S >= T, GQA) with the causal mask
    aligned to the bottom right (query i sees keys 0..S-T+i) -> [1, H, T, hd].

    torch's own route (torch.nn.attention.bias.causal_lower_right) imports torch._dynamo: 2 s of
    import, 5 s beside the pinning threads, inside the time to a first token. Where flash
    attention takes the inputs, that route ends in the flash op with is_causal=True (which for
    S != T means bottom-right), so that op is called here directly; elsewhere (the CPU, other
    dtypes or head widths) torch's route is taken. A GPU test holds the two equal."""
    hd = q.shape[-1]
    if q.is_cuda and q.dtype in (torch.bfloat16, torch.float16) and hd % 8 == 0 and hd <= 256:
        return torch.ops.aten._scaled_dot_product_flash_attention(
            q, k, v, 0.0, is_causal=True, return_debug_mask=False)[0]
    from torch.nn.attention.bias import causal_lower_right
    return F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(q.shape[2],
                                                                                k.shape[2]),
                                          enable_gqa=True)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: KVCache | PromptKV,
           layer: int, *, window: int = 0, sinks: torch.Tensor | None = None,
           into: torch.Tensor | None = None) -> torch.Tensor:
    """q [H, T, hd], k [Hkv, T, hd] (normed, rotated), v [T, Hkv, hd] of the chunk at positions
    P..P+T-1 -> o [T, H, hd] in q's dtype; k, v join `cache` (the attention every GQA wiring
    shares once its projections are done). `window` > 0: a sliding layer; `sinks` [H]: the
    heads' sink logits. The cache's `packed` sequences mask block-diagonally. `into` (flat: the
    engine's carve attn): PromptKV.attend's."""
    T = q.shape[1]
    packed = getattr(cache, "packed", None)
    starts = None if packed is None else packed.starts(q.device)
    if isinstance(cache, PromptKV):   # the engine's KV: bf16/fp32 or int8, resident + host-held
        # the Triton kernel reads bf16 (CUDA, or pinned); its torch twin computes in the dense
        # dtype. The chunk's keys are attended as the cache keeps them, as KVCache does below:
        # a float KV dtype's rounding here, int8's inside cache.attend (it quantizes once and
        # attends the codes' values).
        at = torch.bfloat16 if attention_impl(q.device) == "triton" else q.dtype
        kd = at if cache.kv == "int8" else cache.code
        extra = {}
        if window or sinks is not None:   # only then: the plain call stays as it was
            extra = dict(window=window, sinks=sinks)
        if starts is not None:
            extra["starts"] = starts
        kc, vc = one_layout(k.transpose(0, 1).to(kd).to(at), v.to(kd).to(at))   # [T, Hkv, hd]
        o = cache.attend(layer, q.transpose(0, 1).to(at), kc, vc, into=into,
                         **extra)                                             # [T, H, hd]
        return o.to(q.dtype)
    k_all, v_all = cache.extend(layer, k, v.transpose(0, 1))         # [Hkv, n+T, hd]
    # the KV dtype (--kv) may be narrower than the dense math (bf16 KV beside fp32 on the CPU)
    k_all, v_all = k_all.to(q.dtype), v_all.to(q.dtype)
    P = k_all.shape[1] - T   # the keys kept before the chunk: P, a sliding layer's last W - 1
    out = buf_view(into, (T, q.shape[0], v_all.shape[-1]), q.dtype, q.device)
    if window or sinks is not None or starts is not None:
        return masked_attention(q, k_all, v_all, P, window, sinks, starts,
                                out).transpose(0, 1)                              # [T, H, hd]
    # GQA without copying K/V per query head (enable_gqa: query head h reads kv head
    # h // (H / Hkv)). A later chunk's query i sits at P+i and sees keys 0..P+i: the causal
    # mask aligned to the bottom right, which flash attention runs without materializing it.
    # torch's op allocates its output: it goes into `into` (the carve's attn), over groups of
    # heads past flash.OUT_BYTES a launch, instead of a [T, H, hd] beside the plan
    return head_groups(causal if P == 0 else lower_right_causal, q, k_all, v_all,
                       out=out)                                               # [T, H, hd]
