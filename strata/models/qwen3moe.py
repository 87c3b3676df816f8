"""Qwen3-MoE forward over chunks of a prompt, experts from an expert provider.

Legend: T tokens in the chunk, P tokens already in the KV cache, D hidden, F expert width,
E experts, K top-k, H query heads, Hkv kv heads, hd head dim, V vocabulary, L layers.

Per layer (all sparse, as Qwen3-MoE ships):
    h = x + Wo . attn(rope(qnorm(Wq rms(x))), rope(knorm(Wk rms(x))), Wv rms(x))   # GQA, causal
    x = h + moe(rms(h))                                                           # strata.models.moe
then logits = W_out rms(x). RoPE is NEOX style (rotate halves), as HF Qwen3 and llama.cpp qwen3moe.

Streaming: `forward_chunk` runs T tokens at positions P..P+T-1 against a KVCache holding the P
earlier ones (causal inside the chunk, full attention to the cache) and asks the provider for each
layer's experts after routing; `prefill` cuts a prompt into chunks. Dense weights use llama.cpp's
GGUF tensor names (strata.packs.names).
"""
from __future__ import annotations

import contextlib

from dataclasses import dataclass
from typing import Mapping

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

from strata.errors import StrataError
from strata.models.moe import ExpertFFN, expert_ffn, moe_ffn_ref, route
from strata.models.provider import ExpertProvider
from strata.models.registry import register
from strata.packs.names import check_dense
from strata.shapes import ModelShape

# Per-layer dense tensors in LayerWeights order (names: strata.packs.names, llama.cpp's).
LAYER_NAMES = ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "attn_q_norm",
               "attn_k_norm", "ffn_norm", "ffn_gate_inp")


@dataclass
class LayerWeights:
    attn_norm: torch.Tensor    # [D]
    wq: torch.Tensor           # [H*hd, D]
    wk: torch.Tensor           # [Hkv*hd, D]
    wv: torch.Tensor           # [Hkv*hd, D]
    wo: torch.Tensor           # [D, H*hd]
    q_norm: torch.Tensor       # [hd]
    k_norm: torch.Tensor       # [hd]
    ffn_norm: torch.Tensor     # [D]
    router: torch.Tensor       # [E, D]


class KVCache:
    """Keys and values of the tokens read so far, per layer: [Hkv, P, hd] each (post-RoPE keys).

    `capacity` (tokens) preallocates; without it the cache grows by concatenation. `length` is P,
    the absolute position of the next chunk's first token; it advances in `commit` once every layer
    has appended the chunk."""

    def __init__(self, shape: ModelShape, *, capacity: int | None = None,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"):
        """`device`: one device, or one per layer (a layer split over GPUs keeps each layer's
        KV on that layer's GPU)."""
        self.shape, self.capacity, self.length = shape, capacity, 0
        L, Hkv, hd = shape.n_layer, shape.n_kv_head, shape.head_dim
        devs = list(device) if isinstance(device, (list, tuple)) else [device] * L
        n = capacity if capacity is not None else 0
        self.k = [torch.zeros(Hkv, n, hd, dtype=dtype, device=d) for d in devs]
        self.v = [torch.zeros(Hkv, n, hd, dtype=dtype, device=d) for d in devs]

    def extend(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Add this chunk's k, v [Hkv, T, hd] to `layer`; returns all keys/values [Hkv, P+T, hd]."""
        P, T = self.length, k.shape[1]
        if self.capacity is None:
            self.k[layer] = torch.cat([self.k[layer], k], dim=1)
            self.v[layer] = torch.cat([self.v[layer], v], dim=1)
            return self.k[layer], self.v[layer]
        if P + T > self.capacity:
            raise StrataError(f"KV cache holds {self.capacity} tokens; a chunk of {T} at position "
                              f"{P} does not fit")
        self.k[layer][:, P:P + T] = k
        self.v[layer][:, P:P + T] = v
        return self.k[layer][:, :P + T], self.v[layer][:, :P + T]

    def commit(self, n_tokens: int) -> None:
        self.length += n_tokens


def _on(device: torch.device):
    """The device context of a CUDA device (a no-op elsewhere)."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim, computed in fp32 (as HF does), result in x's dtype."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return w * xf.to(x.dtype)


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [T, hd] (fp32) for NEOX RoPE: frequency i on dims i and i + hd/2."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32,
                                            device=positions.device) / head_dim)   # [hd/2]
    ang = positions.float()[:, None] * inv_freq[None, :]                           # [T, hd/2]
    ang = torch.cat([ang, ang], dim=-1)                                            # [T, hd]
    return ang.cos(), ang.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [h, T, hd]: x*cos + rotate_half(x)*sin, rotate_half(a, b) = (-b, a)."""
    half = x.shape[-1] // 2
    rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return (x.float() * cos + rot.float() * sin).to(x.dtype)


@register("qwen3moe")
class Qwen3Moe:
    """Dense weights of a Qwen3-MoE model on one device, and its forward.

    `forward_chunk(tokens, cache, provider)` -> logits [T, V] fp32 for one chunk;
    `prefill(tokens, provider, chunk=N)` -> logits [T, V] fp32 for a whole prompt."""

    def __init__(self, shape: ModelShape, tok_embd: torch.Tensor, layers: list[LayerWeights],
                 out_norm: torch.Tensor, lm_head: torch.Tensor, *, ffn: ExpertFFN | None = None):
        self.shape, self.tok_embd, self.layers = shape, tok_embd, layers
        self.out_norm, self.lm_head = out_norm, lm_head
        self.ffn: ExpertFFN = ffn if ffn is not None else expert_ffn("kernel")

    @property
    def device(self) -> torch.device:
        return self.tok_embd.device

    @property
    def layer_devices(self) -> list[torch.device]:
        return [lw.wq.device for lw in self.layers]

    @property
    def dtype(self) -> torch.dtype:
        return self.tok_embd.dtype

    @classmethod
    def from_tensors(cls, shape: ModelShape, tensors: Mapping[str, torch.Tensor], *,
                     device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
                     ffn: ExpertFFN | None = None, device_map=None) -> "Qwen3Moe":
        """From dense tensors named and shaped as strata.packs.names says (llama.cpp names);
        `output.weight` may be absent (tied embeddings). `device_map` (one device per layer)
        splits the layers over GPUs: embeddings sit with the first layer, the output norm and
        LM head with the last; the hidden state moves between GPUs once per boundary."""
        check_dense(shape, {n: tuple(t.shape) for n, t in tensors.items()}, "model weights")
        devs = list(device_map) if device_map is not None else [device] * shape.n_layer
        if len(devs) != shape.n_layer:
            raise StrataError(f"device_map names {len(devs)} devices for {shape.n_layer} layers")

        def put(name, dev):
            return tensors[name].to(device=dev, dtype=dtype)
        layers = [LayerWeights(*(put(f"blk.{l}.{n}.weight", devs[l]) for n in LAYER_NAMES))
                  for l in range(shape.n_layer)]
        head = "output.weight" if "output.weight" in tensors else "token_embd.weight"
        return cls(shape, put("token_embd.weight", devs[0]), layers,
                   put("output_norm.weight", devs[-1]), put(head, devs[-1]), ffn=ffn)

    def new_cache(self, capacity: int | None = None) -> KVCache:
        return KVCache(self.shape, capacity=capacity, dtype=self.dtype, device=self.layer_devices)

    def check_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        tokens = torch.as_tensor(tokens, dtype=torch.int64)
        if tokens.ndim != 1 or tokens.numel() == 0:
            raise StrataError(f"tokens must be a non-empty 1-D list of ids, got shape "
                              f"{list(tokens.shape)}")
        bad = (tokens < 0) | (tokens >= self.shape.vocab)
        if bool(bad.any()):
            i = int(torch.nonzero(bad)[0])
            raise StrataError(f"token id {int(tokens[i])} at position {i} is outside the "
                              f"vocabulary [0, {self.shape.vocab})")
        return tokens.to(self.device)

    # -- one chunk ---------------------------------------------------------------------------
    def _attention(self, l: int, lw: LayerWeights, x: torch.Tensor, cos, sin,
                   cache: KVCache) -> torch.Tensor:
        s = self.shape
        T, P = x.shape[0], cache.length
        q = (x @ lw.wq.t()).view(T, s.n_head, s.head_dim)                 # [T, H, hd]
        k = (x @ lw.wk.t()).view(T, s.n_kv_head, s.head_dim)              # [T, Hkv, hd]
        v = (x @ lw.wv.t()).view(T, s.n_kv_head, s.head_dim)
        q = apply_rope(rms_norm(q, lw.q_norm, s.rms_eps).transpose(0, 1), cos, sin)  # [H, T, hd]
        k = apply_rope(rms_norm(k, lw.k_norm, s.rms_eps).transpose(0, 1), cos, sin)  # [Hkv, T, hd]
        k_all, v_all = cache.extend(l, k, v.transpose(0, 1))               # [Hkv, P+T, hd]
        # GQA without copying K/V per query head (enable_gqa: query head h reads kv head
        # h // (H / Hkv)). A later chunk's query i sits at P+i and sees keys 0..P+i: the causal
        # mask aligned to the bottom right, which flash attention runs without materializing it.
        mask = None if P == 0 else causal_lower_right(T, P + T)
        o = F.scaled_dot_product_attention(q[None], k_all[None], v_all[None], attn_mask=mask,
                                           is_causal=P == 0, enable_gqa=True)[0]  # [H, T, hd]
        return o.transpose(0, 1).reshape(T, s.n_head * s.head_dim) @ lw.wo.t()    # [T, D]

    def _experts(self, l: int, h: torch.Tensor, topk_ids: torch.Tensor, topk_w: torch.Tensor,
                 provider: ExpertProvider) -> torch.Tensor:
        """The layer's expert FFN. A provider with `expert_batches` (the streaming engine) serves
        the layer in batches of experts (ids outside a batch read -1); their outputs add up in
        fp32 and are rounded once."""
        batches = getattr(provider, "expert_batches", None)
        if batches is None:
            return self.ffn(h, topk_ids, topk_w, provider.experts(l, topk_ids))
        # what the provider lends the FFN for this layer: the carve's workspace and fp32
        # accumulator, its participant's stream-k scratch allocator (strata.engine)
        lend = getattr(provider, "ffn_kwargs", None)
        kw = dict(lend(l)) if lend is not None else {}
        y = kw.pop("accumulator", None)                                   # fp32 [>= T, D]
        y = y[:h.shape[0]].zero_() if y is not None else torch.zeros(
            h.shape, dtype=torch.float32, device=h.device)
        for experts, ids in batches(l, topk_ids):
            self.ffn(h, ids, topk_w, experts, out=y, **kw)
        return y

    def forward_chunk(self, tokens: torch.Tensor, cache: KVCache, provider: ExpertProvider,
                      *, logits: str = "all") -> torch.Tensor | None:
        """Logits fp32 of `tokens` [T] at positions cache.length...; extends the cache.
        logits: "all" -> [T, V], "last" -> [1, V], "none" -> None (skips the LM head).
        The caller brackets it with provider.begin_chunk / end_chunk (see `prefill`)."""
        s = self.shape
        T, P = tokens.shape[0], cache.length
        x = self.tok_embd[tokens]                                           # [T, D]
        pos = torch.arange(P, P + T, device=x.device)
        rope = {x.device: rope_cos_sin(pos, s.head_dim, s.rope_theta)}
        for l, lw in enumerate(self.layers):
            provider.begin_layer(l)
            if x.device != lw.wq.device:  # a layer split: hand the hidden state to the next GPU
                x = x.to(lw.wq.device)
                if x.device not in rope:
                    rope[x.device] = tuple(t.to(x.device) for t in rope[pos.device])
            cos, sin = rope[x.device]
            # Triton launches on the current device's stream: make it this layer's GPU
            with _on(x.device):
                x = x + self._attention(l, lw, rms_norm(x, lw.attn_norm, s.rms_eps), cos, sin,
                                        cache)
                h = rms_norm(x, lw.ffn_norm, s.rms_eps)
                topk_ids, topk_w = route(h, lw.router, s.top_k, s.norm_topk_prob)  # [T, K]
                x = x + self._experts(l, h, topk_ids, topk_w, provider).to(x.dtype)
            provider.end_layer(l)
        cache.commit(T)
        if logits == "none":
            return None
        if logits == "last":
            x = x[-1:]
        x = x.to(self.lm_head.device)
        return (rms_norm(x, self.out_norm, s.rms_eps) @ self.lm_head.t()).float()   # [T|1, V]

    # -- a whole prompt ----------------------------------------------------------------------
    def prefill(self, tokens, provider: ExpertProvider, *, chunk: int | None = None,
                cache: KVCache | None = None, progress=None, logits: str = "all") -> torch.Tensor | None:
        """Logits fp32 of a prompt read in chunks of `chunk` tokens (all at once if None):
        logits="all" -> [T, V]; "last" -> [1, V] (the next-token logits; a 32K prompt's [T, V]
        would not fit in memory at V = 151936); "none" -> None (a timed read skips the LM head).
        `progress(n_tokens_done)` after each chunk."""
        if logits not in ("all", "last", "none"):
            raise StrataError(f"logits must be 'all', 'last' or 'none', got {logits!r}")
        tokens = self.check_tokens(tokens)
        T = tokens.numel()
        chunk = T if chunk is None else int(chunk)
        if chunk < 1:
            raise StrataError(f"chunk must be at least 1 token, got {chunk}")
        cache = cache if cache is not None else self.new_cache(capacity=T)
        out = (torch.zeros(T if logits == "all" else 1, self.shape.vocab, dtype=torch.float32,
                           device=self.lm_head.device) if logits != "none" else None)
        provider.begin_prompt(T, min(chunk, T))
        ok = False
        try:
            for start in range(0, T, chunk):
                part = tokens[start:start + chunk]
                last = start + part.numel() == T
                mode = logits if logits != "last" else ("last" if last else "none")
                provider.begin_chunk(cache.length, part.numel())
                y = self.forward_chunk(part, cache, provider, logits=mode)
                provider.end_chunk()
                if mode == "all":
                    out[start:start + part.numel()] = y
                elif mode == "last":
                    out[:] = y
                if progress is not None:
                    progress(start + part.numel())
            ok = True
        finally:
            provider.end_prompt(ok)
        return out

    def with_ffn(self, ffn: ExpertFFN) -> "Qwen3Moe":
        return Qwen3Moe(self.shape, self.tok_embd, self.layers, self.out_norm, self.lm_head, ffn=ffn)


def forward_torch(model: Qwen3Moe, provider: ExpertProvider, tokens) -> torch.Tensor:
    """Reference: the whole prompt as one chunk, dense weights and decoded experts in fp32,
    experts through `moe_ffn_ref`. Logits fp32 [T, V]."""
    f32 = Qwen3Moe(model.shape, model.tok_embd.float(),
                   [LayerWeights(*(t.float() for t in vars(lw).values())) for lw in model.layers],
                   model.out_norm.float(), model.lm_head.float(), ffn=moe_ffn_ref)
    return f32.prefill(tokens, provider, chunk=None)
