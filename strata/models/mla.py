"""Multi-head latent attention (DeepSeek-V2/V3, Kimi-K2; GGUF `deepseek2`) for chunked prefill.

Legend: T tokens of the chunk, P tokens already cached, S = P + T keys, D hidden, H heads,
N no-rope dims of a q/k head, R rope dims (hd = N + R), Hv value head dim, Lq q_lora,
Lkv kv_lora (the latent).

    q = Wqb rms(Wqa x)  (or Wq x)           [T, H, N + R]      q_nope | q_pe
    c, k_pe = split(Wkva x)                 [T, Lkv], [T, R]   c = rms(c): the cached latent
    q_pe, k_pe = rope_pairs(q_pe), rope_pairs(k_pe)            k_pe shared by every head
    cache += (c, k_pe)                      (Lkv + R) values per token per layer: the KV the
                                            plan counts (strata.shapes.mla_token_bytes, bf16)
    Wkvb = [Wuk | Wuv] per head             [H, N + Hv, Lkv]
    o = causal softmax([q_nope, q_pe] . [c Wuk^T, k_pe] / sqrt(hd)) (c Wuv^T)   [T, H, Hv]
    y = Wo o                                [T, D]

Two forms of the same attention, one signature (`mla_chunk_attention`):
- expanded (what the model runs): decompress K_nope = c Wuk^T and V = c Wuv^T and attend with
  the heads' full q: off CUDA a block of keys at a time, merging blocks by their log-sum-exp
  (a transient of one block however long the prompt); on CUDA all keys at once through torch's
  fused SDPA (a transient of S keys' expanded K/V, not carved from the loan);
- absorbed (`mla_chunk_attention_absorbed`, the reference, in fp64): fold Wuk into the query
  (q_lat = q_nope Wuk, [T, H, Lkv]) and attend in the latent space, then Wuv on the output.

Why expanded for prefill, per layer per chunk at DeepSeek-V3's widths (H 128, N 128, R 64,
Hv 128, Lkv 512), counting multiply-adds x2:
    expanded:  attention 2·T·S·H·(N+R+Hv) = 81,920·T·S  +  decompression 2·S·Lkv·H·(N+Hv)
               = 33.5M·S
    absorbed:  2·T·S·H·(Lkv+R+Lkv) = 278,528·T·S  +  2·T·H·N·Lkv·2 (q in, o out) = 33.5M·T
so expanded costs less once 196,608·T·S > 33.5M·(S - T), i.e. for any chunk T >~ 171 tokens:
at T = 4096, S = 32768 the expanded form is 11.0 + 1.1 = 12.1 TFLOP against 37.4 + 0.1 =
37.5 TFLOP absorbed (3.1x). Absorbed reads only the latent (1,152 B a token) instead of
H·(N+R+Hv)·2 = 81,920 B, which is why decode (T = 1) uses it. benchmarks/mla_bench.py measures
both on the GPU (a gpu_session.sh step).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from strata.errors import StrataError
from strata.models.layers import apply_rope_pairs, rms_norm

KEY_BLOCK = 4096   # keys decompressed at a time by the expanded form


@dataclass
class MLAWeights:
    wkva: torch.Tensor                  # [Lkv + R, D]
    kv_norm: torch.Tensor               # [Lkv]
    wkvb: torch.Tensor                  # [H*(N + Hv), Lkv]
    wo: torch.Tensor                    # [D, H*Hv]
    wq: torch.Tensor | None = None      # [H*hd, D] (q_lora = 0)
    wqa: torch.Tensor | None = None     # [Lq, D]
    q_norm: torch.Tensor | None = None  # [Lq]
    wqb: torch.Tensor | None = None     # [H*hd, Lq]

    def map(self, fn) -> "MLAWeights":
        return MLAWeights(**{k: None if t is None else fn(t) for k, t in vars(self).items()})


class MLACache:
    """Per layer the normed latent c [P, Lkv] and the rotated rope key k_pe [P, R] of the tokens
    read so far (the model's dtype; `capacity` preallocates, else it grows). `length` is P."""

    def __init__(self, n_layer: int, kv_lora: int, rope: int, *, capacity: int | None = None,
                 dtype: torch.dtype = torch.float32, device="cpu"):
        self.capacity, self.length = capacity, 0
        devs = list(device) if isinstance(device, (list, tuple)) else [device] * n_layer
        n = capacity or 0
        self.c = [torch.zeros(n, kv_lora, dtype=dtype, device=d) for d in devs]
        self.k_pe = [torch.zeros(n, rope, dtype=dtype, device=d) for d in devs]

    def extend(self, layer: int, c: torch.Tensor, k_pe: torch.Tensor):
        """Add the chunk's c [T, Lkv], k_pe [T, R]; returns all [P+T, Lkv], [P+T, R]."""
        P, T = self.length, c.shape[0]
        if self.capacity is None:
            self.c[layer] = torch.cat([self.c[layer], c])
            self.k_pe[layer] = torch.cat([self.k_pe[layer], k_pe])
            return self.c[layer], self.k_pe[layer]
        if P + T > self.capacity:
            raise StrataError(f"MLA cache holds {self.capacity} tokens; a chunk of {T} at "
                              f"position {P} does not fit")
        self.c[layer][P:P + T] = c
        self.k_pe[layer][P:P + T] = k_pe
        return self.c[layer][:P + T], self.k_pe[layer][:P + T]

    def commit(self, n_tokens: int) -> None:
        self.length += n_tokens


def _split_kvb(wkvb: torch.Tensor, n_head: int, nope: int, v_dim: int):
    w = wkvb.view(n_head, nope + v_dim, -1)
    return w[:, :nope], w[:, nope:]                       # [H, N, Lkv], [H, Hv, Lkv]


def mla_chunk_attention(q_nope: torch.Tensor, q_pe: torch.Tensor, c: torch.Tensor,
                        k_pe: torch.Tensor, wkvb: torch.Tensor, *, v_head_dim: int,
                        scale: float, block: int = KEY_BLOCK, sdpa: bool | None = None
                        ) -> torch.Tensor:
    """Expanded form. q_nope [H, T, N], q_pe [H, T, R] (rotated) of the chunk's T tokens, the
    last T of the S keys c [S, Lkv], k_pe [S, R] (rotated); wkvb [H*(N+Hv), Lkv] -> o [T, H, Hv]
    in q's dtype. Query t (position S-T+t) sees keys 0..S-T+t.

    sdpa=False (the default off CUDA): blocks of `block` queries x `block` keys, scores and sums
    in fp32, blocks merged by log-sum-exp (a transient of one block's expanded keys and scores).
    sdpa=True (the default on CUDA): all S keys decompressed in q's dtype, then torch's fused
    scaled_dot_product_attention (bottom-right causal mask): S·H·(hd + Hv) elements of
    transient K/V (DeepSeek-V3 at S = 32K: 2.7 GB bf16), outside the planned carve."""
    H, T, N = q_nope.shape
    sdpa = q_nope.is_cuda if sdpa is None else sdpa
    if sdpa:
        return _expanded_sdpa(q_nope, q_pe, c, k_pe, wkvb, v_head_dim, scale)
    return torch.cat([_expanded_blocks(q_nope[:, a:a + block], q_pe[:, a:a + block],
                                       c[:c.shape[0] - T + a + q_nope[:, a:a + block].shape[1]],
                                       k_pe, wkvb, v_head_dim, scale, block)
                      for a in range(0, T, block)])


def _expanded_sdpa(q_nope, q_pe, c, k_pe, wkvb, v_head_dim, scale):
    import torch.nn.functional as F
    from torch.nn.attention.bias import causal_lower_right
    H, T, N = q_nope.shape
    S = c.shape[0]
    w_uk, w_uv = _split_kvb(wkvb.to(q_nope.dtype), H, N, v_head_dim)
    cd = c.to(q_nope.dtype)
    k = torch.cat([torch.einsum("sl,hnl->hsn", cd, w_uk),
                   k_pe.to(q_nope.dtype)[None].expand(H, S, -1)], dim=-1)     # [H, S, hd]
    v = torch.einsum("sl,hvl->hsv", cd, w_uv)                                  # [H, S, Hv]
    q = torch.cat([q_nope, q_pe.to(q_nope.dtype)], dim=-1)                     # [H, T, hd]
    mask = None if S == T else causal_lower_right(T, S)
    o = F.scaled_dot_product_attention(q[None], k[None], v[None], attn_mask=mask,
                                       is_causal=S == T, scale=scale)[0]       # [H, T, Hv]
    return o.transpose(0, 1)


def _expanded_blocks(q_nope, q_pe, c, k_pe, wkvb, v_head_dim, scale, block):
    """The queries are the last T of the S keys c (k_pe may be longer: its first S rows)."""
    H, T, N = q_nope.shape
    S = c.shape[0]
    P = S - T
    w_uk, w_uv = _split_kvb(wkvb.float(), H, N, v_head_dim)
    qn, qp = q_nope.float(), q_pe.float()
    qpos = P + torch.arange(T, device=c.device)
    m = torch.full((H, T, 1), float("-inf"), device=c.device)
    l = torch.zeros(H, T, 1, device=c.device)
    o = torch.zeros(H, T, v_head_dim, device=c.device)
    for a in range(0, S, block):
        b = min(S, a + block)
        cb = c[a:b].float()
        k_nope = torch.einsum("sl,hnl->hsn", cb, w_uk)                     # [H, Sb, N]
        v = torch.einsum("sl,hvl->hsv", cb, w_uv)                          # [H, Sb, Hv]
        sc = (qn @ k_nope.transpose(1, 2) + qp @ k_pe[a:b].float().t()) * scale   # [H, T, Sb]
        sc = sc.masked_fill(torch.arange(a, b, device=c.device)[None, :] > qpos[:, None],
                            float("-inf"))
        m_new = torch.maximum(m, sc.amax(-1, keepdim=True))
        alpha = torch.exp(m - m_new).nan_to_num(0.0)      # a block before any visible key: 0
        p = torch.exp(sc - m_new).nan_to_num(0.0)
        l = l * alpha + p.sum(-1, keepdim=True)
        o = o * alpha + p @ v
        m = m_new
    return (o / l).transpose(0, 1).to(q_nope.dtype)                         # [T, H, Hv]


def mla_chunk_attention_absorbed(q_nope: torch.Tensor, q_pe: torch.Tensor, c: torch.Tensor,
                                 k_pe: torch.Tensor, wkvb: torch.Tensor, *, v_head_dim: int,
                                 scale: float, block: int = KEY_BLOCK, sdpa: bool | None = None
                                 ) -> torch.Tensor:
    """Absorbed form, fp64, all keys at once (the reference; `block`, `sdpa` accepted and
    unused)."""
    H, T, N = q_nope.shape
    S = c.shape[0]
    w_uk, w_uv = _split_kvb(wkvb.double(), H, N, v_head_dim)
    cd = c.double()
    q_lat = torch.einsum("htn,hnl->htl", q_nope.double(), w_uk)              # [H, T, Lkv]
    sc = (q_lat @ cd.t() + q_pe.double() @ k_pe.double().t()) * scale        # [H, T, S]
    causal = torch.arange(S)[None, :] > (S - T + torch.arange(T))[:, None]
    p = torch.softmax(sc.masked_fill(causal.to(c.device), float("-inf")), dim=-1)
    o_lat = p @ cd                                                           # [H, T, Lkv]
    return torch.einsum("htl,hvl->thv", o_lat, w_uv).to(q_nope.dtype)        # [T, H, Hv]


def mla_attention(x: torch.Tensor, w: MLAWeights, shape, cos: torch.Tensor, sin: torch.Tensor,
                  cache: MLACache, layer: int, *, eps: float) -> torch.Tensor:
    """x [T, D] (normed) at positions P..P+T-1 -> [T, D]; appends (c, k_pe) to `cache`."""
    s = shape
    T, H, R = x.shape[0], s.n_head, s.qk_rope
    N = s.head_dim - R
    if w.wqa is not None:
        q = rms_norm(x @ w.wqa.t(), w.q_norm, eps) @ w.wqb.t()
    else:
        q = x @ w.wq.t()
    q = q.view(T, H, s.head_dim).transpose(0, 1)                             # [H, T, hd]
    q_nope, q_pe = q[..., :N], apply_rope_pairs(q[..., N:], cos, sin)
    kv = x @ w.wkva.t()                                                      # [T, Lkv + R]
    c = rms_norm(kv[:, :s.kv_lora], w.kv_norm, eps)
    k_pe = apply_rope_pairs(kv[:, s.kv_lora:], cos, sin)                     # [T, R]
    c_all, kpe_all = cache.extend(layer, c, k_pe)
    o = mla_chunk_attention(q_nope, q_pe, c_all, kpe_all, w.wkvb, v_head_dim=s.v_head_dim,
                            scale=s.head_dim ** -0.5)
    return o.reshape(T, H * s.v_head_dim) @ w.wo.t()
