"""The MoE decoder every wiring composes: embeddings, a stack of layers (attention, then an FFN
block over routed experts), the output norm and LM head, on one device or a layer split.

Legend: T tokens in the chunk, P tokens already in the KV cache, D hidden, E experts, K top-k,
H query heads, Hkv kv heads, hd head dim, V vocabulary, L layers.

Per layer l:
    h = x + attend(rms(x))              # the wiring's attention (default: the shared GQA,
                                        # strata.models.attention, with its window)
    x = h + mlp(rms(h))                 # default: the routed experts (router, then the expert
                                        # FFN over each pass the provider yields: moe_block.py)
then logits = W_out rms(x).

A wiring is a small subclass that says what differs: `Layer` (its layer weights,
`from_tensors(get, l)` and `map(fn)`) or `layer_weights(shape, get, l)`, and where needed
`attend`, `mlp`, `router`, `rope` and `new_cache`. `forward_chunk` runs T tokens at positions
P..P+T-1 against a cache holding the P earlier ones; `prefill` (strata.models.decoder) cuts a
prompt into chunks.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import torch

from strata.errors import StrataError
from strata.kernels.attention.kv_int8 import cache_dtype
from strata.models.attention import AttentionShape, AttentionWeights, attention
from strata.models.block_weight import decode_phase, matmul_t, phase_split
from strata.models.decoder import Decoder
from strata.models.kv import KVCache, kv_windows
from strata.models.layers import (add_rounded_, buf_view, norm_out, on_device, rms_norm,
                                  shape_cos_sin)
from strata.models.moe import ExpertFFN, expert_ffn, moe_ffn_ref
from strata.models.moe_block import moe_block, softmax_topk
from strata.models.packed import packed_head
from strata.models.provider import ExpertProvider
from strata.shapes import ModelShape


@dataclass
class GqaLayer:
    """A layer's dense weights around the shared GQA attention and a softmax router."""
    attn_norm: torch.Tensor    # [D]
    attn: AttentionWeights     # q, k, v, o and the q/k norms
    ffn_norm: torch.Tensor     # [D]
    router: torch.Tensor       # [E, D]

    QK_NORM = True   # per-head q and k norms (Qwen3); a wiring without them says False

    @classmethod
    def from_tensors(cls, get, l: int) -> "GqaLayer":
        """`get(name)`: the tensor named (llama.cpp's names, the record's name map)."""
        def w(n):
            return get(f"blk.{l}.{n}.weight")
        norms = (dict(q_norm=w("attn_q_norm"), k_norm=w("attn_k_norm")) if cls.QK_NORM
                 else {})
        return cls(w("attn_norm"),
                   AttentionWeights(w("attn_q"), w("attn_k"), w("attn_v"), w("attn_output"),
                                    **norms),
                   w("ffn_norm"), w("ffn_gate_inp"))

    def map(self, fn) -> "GqaLayer":
        return type(self)(fn(self.attn_norm), self.attn.map(fn), fn(self.ffn_norm),
                          fn(self.router))


class MoeDecoder(Decoder):
    """Dense weights of a MoE decoder on one device (or one per layer), and its forward.

    `forward_chunk(tokens, cache, provider)` -> logits [T, V] fp32 for one chunk;
    `prefill(tokens, provider, chunk=N)` -> logits [T, V] fp32 for a whole prompt."""
    Layer: type = GqaLayer

    def __init__(self, shape: ModelShape, tok_embd: torch.Tensor, layers: list,
                 out_norm: torch.Tensor, lm_head: torch.Tensor, *, ffn: ExpertFFN | None = None):
        self.shape, self.tok_embd, self.layers = shape, tok_embd, layers
        # each layer's decode split, made once (None: no matrix kept as blocks, nothing to do)
        self.splits = [phase_split(lw) for lw in layers]
        self.out_norm, self.lm_head = out_norm, lm_head
        self.ffn: ExpertFFN = ffn if ffn is not None else expert_ffn("kernel")
        self.attn_shape = AttentionShape(shape.n_head, shape.n_kv_head, shape.head_dim,
                                         shape.rms_eps)

    @property
    def device(self) -> torch.device:
        return self.tok_embd.device

    @property
    def layer_devices(self) -> list[torch.device]:
        return [lw.attn_norm.device for lw in self.layers]

    @property
    def dtype(self) -> torch.dtype:
        return self.tok_embd.dtype

    # -- weights -------------------------------------------------------------------------------
    @classmethod
    def layer_weights(cls, shape: ModelShape, get, l: int):
        """Layer l's weights from `get(name)` (a wiring with more than `Layer` overrides it)."""
        return cls.Layer.from_tensors(get, l)

    @classmethod
    def from_tensors(cls, shape: ModelShape, tensors: Mapping[str, torch.Tensor], *,
                     device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
                     ffn: ExpertFFN | None = None, device_map=None):
        """From dense tensors named and shaped as the architecture's record says (llama.cpp
        names; strata.archs, whose `build` checks them first); `output.weight` may be absent
        (tied embeddings). `device_map` (one device per layer) splits the layers over GPUs:
        embeddings sit with the first layer, the output norm and LM head with the last; the
        hidden state moves between GPUs once per boundary."""
        devs = list(device_map) if device_map is not None else [device] * shape.n_layer
        if len(devs) != shape.n_layer:
            raise StrataError(f"device_map names {len(devs)} devices for {shape.n_layer} layers")

        def put(name, dev):
            return tensors[name].to(device=dev, dtype=dtype)
        layers = [cls.layer_weights(shape, lambda n, d=devs[l]: put(n, d), l)
                  for l in range(shape.n_layer)]
        head = "output.weight" if "output.weight" in tensors else "token_embd.weight"
        return cls(shape, put("token_embd.weight", devs[0]), layers,
                   put("output_norm.weight", devs[-1]), put(head, devs[-1]), ffn=ffn)

    def new_cache(self, capacity: int | None = None, kv: str | None = None):
        """The KV cache in the KV dtype `kv` (bf16 | fp32; None: the model's dtype); a sliding
        layer keeps only its window (kv_windows)."""
        s = self.shape
        return KVCache(s.n_layer, s.n_kv_head, s.head_dim, capacity=capacity,
                       dtype=cache_dtype(kv, self.dtype), device=self.layer_devices,
                       windows=kv_windows(s))

    # -- forward -------------------------------------------------------------------------------
    def forward_chunk(self, tokens: torch.Tensor, cache, provider: ExpertProvider,
                      *, logits: str = "all", observer=None) -> torch.Tensor | None:
        """Logits fp32 of `tokens` [T] at positions cache.length...; extends the cache.
        logits: "all" -> [T, V], "last" -> [1, V] (packed sequences: [n, V], each one's last
        token), "none" -> None (skips the LM head).
        The caller brackets it with provider.begin_chunk / end_chunk (see `prefill`)."""
        T = tokens.shape[0]
        # the hidden states in the engine's carve x where it planned one (cache.hidden): x is
        # the chunk's own and dead once its head has read it (a pipeline's stages embed apart)
        x = self.embed(tokens, into=getattr(cache, "hidden", {}).get("x"))
        x = self.forward_layers(x, cache, provider, range(self.shape.n_layer), observer=observer)
        cache.commit(T)
        return self.head(*packed_head(x, logits, cache))

    def embed(self, tokens: torch.Tensor, into: torch.Tensor | None = None) -> torch.Tensor:
        """The hidden states [T, D] of `tokens` [T] (the first stage of a pipeline); embeddings
        kept as blocks (strata.models.block_weight) decode the rows of these tokens. `into`
        (flat: the engine's carve x) holds them where it fits (layers.buf_view), the same bits."""
        e = self.tok_embd
        out = buf_view(into, (tokens.shape[0], e.shape[1]), e.dtype, e.device)
        if out is None:
            return e[tokens]
        if isinstance(e, torch.Tensor):
            return torch.index_select(e, 0, tokens, out=out)
        return out.copy_(e[tokens])

    def forward_layers(self, x: torch.Tensor, cache, provider: ExpertProvider, layers: range,
                       *, observer=None) -> torch.Tensor:
        """Hidden states [T, D] through `layers` (a contiguous range) at positions cache.length...;
        appends their KV but does not commit (the caller commits once per chunk). A pipeline
        stage (strata.engine.distributed) runs its own range; forward_chunk runs them all."""
        T, P = x.shape[0], cache.length
        packed = getattr(cache, "packed", None)   # packed sequences: positions restart in each
        pos = (torch.arange(P, P + T, device=x.device) if packed is None
               else packed.positions(x.device))
        rope = {x.device: self.rope(pos)}
        for l in layers:
            provider.begin_layer(l)
            dev = self.layers[l].attn_norm.device
            if x.device != dev:  # a layer split: hand the hidden state to the next GPU
                x = x.to(dev)
                if x.device not in rope:
                    rope[x.device] = tuple(t.to(x.device) for t in rope[pos.device])
            with on_device(x.device):
                x = self.layer(x, l, rope[x.device], cache, provider, observer)
            if observer is not None:
                observer.layer_done(l, x)
            provider.end_layer(l)
        return x

    def layer(self, x: torch.Tensor, l: int, cos_sin, cache, provider: ExpertProvider,
              observer) -> torch.Tensor:
        """Layer l on hidden states x [T, D]: attention, then the FFN block, each residual. Its
        matrices kept as blocks are decoded for one phase at a time (decode_phase: the
        attention's for attend, the rest for mlp) and dropped when that phase returns."""
        s, lw, split = self.shape, self.layers[l], self.splits[l]
        cos, sin = cos_sin
        # the residual adds in place (the same bits as x + a): a new [T, D] beside the old one at
        # each add was 2 x 470 MB a layer at a 32K chunk of DeepSeek-V3, beside the plan. x is
        # the chunk's own (embed's rows, a hand-off's buffer), never a caller's kept tensor
        # both norms write the carve's xn where the engine planned one (each dead when its
        # phase returns: attend keeps nothing of its input, the FFN's h ends with the layer);
        # the attention's output takes its normed input's bytes once that is projected (into)
        xn = provider.workspace(l).xn
        a = rms_norm(x, lw.attn_norm, s.rms_eps, norm_out(xn, x, lw.attn_norm))
        x.add_(self.attend(a, decode_phase(lw, "attn", split), cos, sin, cache, l, into=a))
        h = rms_norm(x, lw.ffn_norm, s.rms_eps, norm_out(xn, x, lw.ffn_norm))
        return add_rounded_(x, self.mlp(h, decode_phase(lw, "ffn", split), l, provider,
                                        observer))

    def rope(self, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [T, rot_dim] of positions `pos` (plain or YaRN, as the shape says)."""
        return shape_cos_sin(pos, self.shape)

    def attend(self, xn, lw, cos, sin, cache, l: int, into=None) -> torch.Tensor:
        """Layer l's attention output [T, D] of normed hidden states `xn` [T, D], written into
        `into` where it takes it (layers.into_view: layer passes xn itself, dead once
        projected)."""
        return attention(xn, lw.attn, self.attn_shape, cos, sin, cache, l,
                         window=self.shape.layer_window(l), out=into)

    def mlp(self, h, lw, l: int, provider: ExpertProvider, observer) -> torch.Tensor:
        """Layer l's FFN block [T, D] of normed hidden states `h` [T, D]: the routed experts (fp32
        where the passes accumulate: the layer adds it rounded to x's dtype, add_rounded_)."""
        return moe_block(h, l, self.router(lw), self.ffn, provider, observer)

    def router(self, lw):
        """Layer `lw`'s router, h [T, D] -> (ids, w) [T, K] (a wiring with another overrides it)."""
        return softmax_topk(lw.router, self.shape.top_k, self.shape.norm_topk_prob)

    def head(self, x: torch.Tensor, logits: str = "all") -> torch.Tensor | None:
        """Logits fp32 of hidden states [T, D]: "all" -> [T, V], "last" -> [1, V], "none" -> None."""
        if logits == "none":
            return None
        if logits == "last":
            x = x[-1:]
        x = x.to(self.lm_head.device)
        return matmul_t(rms_norm(x, self.out_norm, self.shape.rms_eps), self.lm_head).float()

    def with_ffn(self, ffn: ExpertFFN):
        return type(self)(self.shape, self.tok_embd, self.layers, self.out_norm, self.lm_head,
                          ffn=ffn)

    def reference(self):
        """The reference twin: dense weights in fp32, experts through `moe_ffn_ref`."""
        return type(self)(self.shape, self.tok_embd.float(),
                          [lw.map(lambda t: t.float()) for lw in self.layers],
                          self.out_norm.float(), self.lm_head.float(), ffn=moe_ffn_ref)
