"""The KV cache of a chunked prefill: keys and values of the tokens read so far, per layer.

- KVCache: the model's own (growing or preallocated, bf16 or fp32, one device per layer)
- PromptKV: the streaming engine's (bf16, fp32 or int8, a resident window in VRAM, the older
  tokens in pinned host memory streamed back through a staging buffer for each later chunk's
  attention; GQA's keys and values per kv head, or MLA's latent and rope key as one "head")
- layer_kv_tokens / kv_windows: how many tokens each layer keeps and where, the one count the
  plan (strata.planning.model_sizes), PromptKV and KVCache all allocate by

Sliding layers (window W > 0, GPT-OSS's even layers: ModelShape.layer_window) keep only the
last W - 1 tokens before the chunk, in VRAM: a query at position p sees keys p-W+1..p, so a
chunk starting at P needs the prefix tokens P-W+1..P-1 (its own keys come with the chunk), at
most W - 1 whatever the chunk's length. Such a layer never holds host KV and is never staged;
only full layers split at the resident window.

A layer that keeps no KV at all (NO_KV: a linear-attention layer, ModelShape.layer_kind, whose
recurrent state a cache holds as `states`, strata.models.layer_state) keeps 0 tokens; the
caches' vram_bytes count the states with the KV.

Legend: P tokens already cached, T tokens of the chunk, Hkv kv heads, hd head dim, L layers,
W a sliding layer's window, R the tokens a layer keeps in VRAM.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from strata.errors import StrataError
from strata.kernels.attention.flash import first_chunk_attention
from strata.models.layers import buf_view


NO_KV = -1     # the "window" of a layer that keeps no KV (a linear-attention layer)


def layer_kv_tokens(n_tokens: int, window: int = 0,
                    resident: int | None = None) -> tuple[int, int]:
    """(VRAM, host) tokens of KV one layer keeps for a prompt of n_tokens. NO_KV: none. A sliding layer
    (window W > 0): its last min(n_tokens, W - 1), all in VRAM (`resident` does not apply: it
    is never staged). A full layer: the newest min(n_tokens, resident) in VRAM (all when
    resident is None), the older rest in host memory."""
    if window == NO_KV:
        return 0, 0
    if window > 0:
        return min(n_tokens, window - 1), 0
    res = n_tokens if resident is None else min(n_tokens, resident)
    return res, n_tokens - res


def kv_windows(shape) -> tuple[int, ...]:
    """Each layer's sliding window, 0 for full attention (ModelShape.layer_window), NO_KV for a
    linear-attention layer (ModelShape.layer_kind): the model's KV description the plan, the
    engine's PromptKV and the model's KVCache read."""
    return tuple(NO_KV if shape.layer_kind(l) == "linear" else shape.layer_window(l)
                 for l in range(shape.n_layer))


def _windows(windows: Sequence[int] | None, n_layer: int) -> tuple[int, ...]:
    out = tuple(windows) if windows is not None else (0,) * n_layer
    if len(out) != n_layer or any(not isinstance(w, int) or w < NO_KV for w in out):
        raise StrataError(f"windows must give {n_layer} whole numbers >= 0 (0: a full layer; "
                          f"{NO_KV}: no KV), got {windows!r}")
    return out


class KVCache:
    """Keys and values of the tokens read so far, per layer: [Hkv, P, hd] each (post-RoPE keys).

    `capacity` (tokens) preallocates; without it the cache grows by concatenation. `length` is P,
    the absolute position of the next chunk's first token; it advances in `commit` once every layer
    has appended the chunk. `windows` (one per layer, 0: full; default all full): a sliding
    layer holds only its last R = W - 1 tokens, in order ([Hkv, R, hd], at most `capacity`), and
    `extend` returns those joined with the chunk (a temporary of R + T tokens)."""

    # the chunk's packed sequences (strata.models.packed.Packed; Decoder.prefill's); None: one
    packed = None
    # linear-attention layers' recurrent state (strata.models.layer_state); None: none
    states = None

    def __init__(self, n_layer: int, n_kv_head: int, head_dim: int, *,
                 capacity: int | None = None, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu", windows: Sequence[int] | None = None):
        """`device`: one device, or one per layer (a layer split over GPUs keeps each layer's
        KV on that layer's GPU)."""
        self.capacity, self.length = capacity, 0
        self.windows = _windows(windows, n_layer)
        devs = list(device) if isinstance(device, (list, tuple)) else [device] * n_layer
        n = capacity if capacity is not None else 0
        sizes = [layer_kv_tokens(n, w)[0] for w in self.windows]
        self.k = [torch.zeros(n_kv_head, r, head_dim, dtype=dtype, device=d)
                  for r, d in zip(sizes, devs)]
        self.v = [torch.zeros(n_kv_head, r, head_dim, dtype=dtype, device=d)
                  for r, d in zip(sizes, devs)]

    def extend(self, layer: int, k: torch.Tensor, v: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Add this chunk's k, v [Hkv, T, hd] to `layer`; returns the keys/values the chunk
        attends [Hkv, n + T, hd]: the n = P kept tokens before it (a sliding layer: its last
        n = min(P, W - 1)), then the chunk's, in position order."""
        P, T = self.length, k.shape[1]
        if self.capacity is not None and P + T > self.capacity:
            raise StrataError(f"KV cache holds {self.capacity} tokens; a chunk of {T} at position "
                              f"{P} does not fit")
        if self.windows[layer]:
            return self._extend_window(layer, k, v, self.windows[layer] - 1)
        if self.capacity is None:
            self.k[layer] = torch.cat([self.k[layer], k], dim=1)
            self.v[layer] = torch.cat([self.v[layer], v], dim=1)
            return self.k[layer], self.v[layer]
        self.k[layer][:, P:P + T] = k
        self.v[layer][:, P:P + T] = v
        return self.k[layer][:, :P + T], self.v[layer][:, :P + T]

    def _extend_window(self, layer: int, k: torch.Tensor, v: torch.Tensor, keep: int
                       ) -> tuple[torch.Tensor, torch.Tensor]:
        n, T = min(self.length, keep), k.shape[1]
        k_all = torch.cat([self.k[layer][:, :n], k], dim=1)               # [Hkv, n + T, hd]
        v_all = torch.cat([self.v[layer][:, :n], v], dim=1)
        m = min(keep, n + T)                 # the tokens the next chunk needs: the last m
        if self.capacity is None:
            self.k[layer] = k_all[:, n + T - m:].clone()
            self.v[layer] = v_all[:, n + T - m:].clone()
        elif m:
            self.k[layer][:, :m] = k_all[:, n + T - m:]
            self.v[layer][:, :m] = v_all[:, n + T - m:]
        return k_all, v_all

    def commit(self, n_tokens: int) -> None:
        self.length += n_tokens

    @property
    def vram_bytes(self) -> int:
        """Bytes the cache holds on the layers' devices, recurrent states included (what the
        plan's kv_vram counts)."""
        return (sum(t.numel() * t.element_size() for t in (*self.k, *self.v))
                + (self.states.nbytes if self.states is not None else 0))

    host_bytes = 0      # the model's cache keeps nothing in host memory


class PromptKV:
    """One prompt's KV in a fixed placement, per layer as layer_kv_tokens says: a full layer's
    oldest `host` = n_tokens - R tokens live in host memory (pinned on CUDA), its newest
    R = min(n_tokens, resident) in VRAM; a sliding layer (`windows`, one per layer, 0: full;
    default all full) keeps its last R = min(n_tokens, W - 1) tokens in VRAM as a ring (the
    token at position j in slot j mod R), never in host memory. bf16 (fp32 on the CPU, where
    the dense math is fp32: `--kv fp32`), or int8 codes with one fp32 scale per token per kv
    head (strata.kernels.attention.kv_int8). Keys join the cache normed and rotated. A chunk
    attends its own keys and values as they are kept (int8: the values of their codes), as
    every later chunk and a resumed read do, so where a prompt is cut into chunks moves only
    the order of the softmax's sums.

    Per full layer per chunk at position P: the host-held tokens 0..min(P, host) stream back
    into that layer's staging buffer (`stages[layer]`: a uint8 view of KS·KVB bytes carved from
    the loan, strata.planning.KV_STAGE_BUF) on the copy lane, ordered after the compute that last
    read it by an event, and the attention waits for the copy's event (no host sync). The
    attention runs over [staged host tokens, resident tokens] + the chunk's own keys:
    `chunk_attention` on CUDA, `chunk_attention_torch` on the CPU (one signature). The next
    staged layer's copy is issued as soon as this layer's attention has read the stage, so it
    lands while this layer's experts run. A sliding layer's attention runs over its ring in
    position order (at most two segments: slots P mod R..R-1, then 0..) + the chunk: the
    kernel's window and causal masks go by position counted from the first segment's first key,
    which shifts every position alike. int8 segments are expanded to bf16 codes for the
    kernel's bf16 tile path in `scratch[layer]` (an AttnScratch over the layout's kv_expand_k /
    kv_expand_v / attn_state buffers, strata.planning.KV_EXPAND_BUFS; absent: the launcher
    allocates its own). A bf16 prefix where attention blocks beat chunk_attention (cuDNN's from
    hd 128 on Hopper, FlashAttention-2's past hd 128 elsewhere: strata.kernels.attention.
    flash_prefix.prefix_route) goes to those blocks merged by their log-sum-exp (a full
    layer's sinks folded in after the merge, its first chunk too), `flash_state[layer]` then
    the layout's attn_flash buffer (apart from `scratch`: a chunk of such a layer that goes to
    chunk_attention after all, packed sequences or a window, runs with the launcher's own
    buffers, which a bf16 prefix does not need).

    MLA (DeepSeek-V3, Kimi-K2: `attend_latent`): one "head" whose key is the normed latent c
    (head_dim = Lkv) and whose value is the rotated rope key (value_dim = R), the format of the
    model's own MLACache (bf16, or int8 codes with one fp32 scale per token each), staged the
    same way; the chunk's latent joins the cache before its attention, which runs over the
    staged tokens as a prefix and the rest as one run (strata.models.mla.mla_chunk_attention).
    `scratch[layer]` is then the layer's MLAScratch (the layout's mla_* buffers).

    `host_arena` (strata.engine.host_kv.HostKVArena): the host-held part as views of the
    engine's pinned arena, held by this KV until `release`; None: tensors of its own.

    Legend: S tokens, Hkv kv heads, hd head dim, Hv value dim (hd unless value_dim); storage
    per layer is [S, Hkv, hd] and [S, Hkv, Hv] (+ [S, Hkv] scales each), the layout KVSegment
    reads: kv_token_parts, the tensors kv_token_bytes counts for the plan."""

    # the chunk's packed sequences (strata.models.packed.Packed; Decoder.prefill's); None: one
    packed = None
    # linear-attention layers' recurrent state (strata.models.layer_state); None: none
    states = None

    def __init__(self, n_layer: int, n_kv_head: int, head_dim: int, n_tokens: int, *,
                 kv: str = "bf16", resident: int | None = None, devices, stages=None,
                 lanes=None, pin: bool = False, scratch=None,
                 windows: Sequence[int] | None = None, value_dim: int | None = None,
                 layers: Sequence[int] | None = None, host_arena=None):
        from strata.kernels.attention.kv_int8 import KV_DTYPES, kv_token_parts
        if kv not in KV_DTYPES:
            raise StrataError(f"kv dtype must be one of {KV_DTYPES}, got {kv!r}")
        self.parts = kv_token_parts(kv, n_kv_head, head_dim, value_dim)
        self.kv, self.length, self.n_tokens = kv, 0, n_tokens
        self.windows = _windows(windows, n_layer)
        self.res, self.host = layer_kv_tokens(n_tokens, 0, resident)    # a full layer's split
        split = [layer_kv_tokens(n_tokens, w, resident) for w in self.windows]
        self.kept = [r for r, _ in split]      # per layer: tokens in VRAM (a sliding one's ring)
        self.held = [h for _, h in split]      # per layer: tokens in host memory
        self.Hkv, self.hd = n_kv_head, head_dim
        self.devices = list(devices)
        self.lanes = lanes or {}
        self.scratch = scratch or {}   # layer -> AttnScratch (int8 on CUDA)
        self.flash_state: dict = {}    # layer -> the flash blocks' attn_flash buffer (bf16)
        from strata.kernels.attention.kv_int8 import KV_FLOATS
        self.code = KV_FLOATS.get(kv, torch.int8)
        if kv == "fp32":
            from strata.kernels.attention.probe import attention_impl
            if any(torch.device(d).type != "meta" and attention_impl(torch.device(d)) == "triton"
                   for d in self.devices):
                raise StrataError("--kv fp32 beside the Triton attention kernel (CUDA), which "
                                  "reads bf16 or int8 KV: give --kv bf16 or int8 (fp32 KV is "
                                  "the CPU's)")
        self.streamed = 0          # bytes of host KV copied back to the stages
        # `layers`: the ones this KV keeps (default all); the others are another process's (a
        # pipeline stage's) and keep nothing: their stores sit on the meta device
        self.mine = set(range(n_layer)) if layers is None else set(layers)
        meta = torch.device("meta")
        staged = [l for l in range(n_layer) if self.held[l] and l in self.mine]
        if staged and (stages is None or any(l not in stages for l in staged)):
            raise StrataError("a prompt whose KV lives partly in host memory needs staging "
                              "buffers (the layout's kv_stage) for every full layer")
        self.resident = [self._store(r, d if l in self.mine else meta)
                         for l, (r, d) in enumerate(zip(self.kept, self.devices))]
        hostdev = torch.device("cpu")
        # the host-held part: views of the engine's arena (pinned once, strata.engine.host_kv)
        # where it gives one, else this prompt's own tensors
        self.host_arena = None
        self.hosted = [(host_arena.take(l, h) if host_arena is not None else
                        self._store(h, hostdev, pin=pin)) if l in self.mine else
                       self._store(h, meta) for l, h in enumerate(self.held)]
        self.stages = {l: self._view(stages[l], self.held[l]) for l in staged}
        # the copy a staged layer's attention issues next: the next staged layer's
        self._next = dict(zip(staged, staged[1:]))
        self._ready: dict[int, object] = {}    # layer -> event of its staged copy
        # layer -> the Future writing its host-held rows while the read runs (a restore:
        # strata.engine.kv_stores.restore); the layer's first stage waits for it
        self._restoring: dict[int, object] = {}
        # held last, after every allocation: a KV that failed to build holds nothing (one a
        # subclass or its maker drops after this calls release, which lets go)
        if host_arena is not None:
            host_arena.hold(self)
            self.host_arena = host_arena

    # -- storage ---------------------------------------------------------------------------
    def _store(self, n: int, device, pin: bool = False) -> list[torch.Tensor]:
        mk = dict(device=device, pin_memory=pin)
        return [torch.empty(n, *shp, dtype=dt, **mk) for shp, dt in self.parts]

    def _view(self, buf: torch.Tensor, n: int) -> list[torch.Tensor]:
        """k, v (and k_scale, v_scale) views of n tokens over a uint8 stage of n·KVB bytes. The
        widest elements go first (fp32 scales, then the codes), so each view starts on a
        multiple of its element size whatever the widths (an odd latent's int8 codes would
        leave the scales after them unaligned); the views come back in the parts' order."""
        flat = buf.reshape(-1)
        sizes = [(n, *shp) for shp, _ in self.parts]
        need = sum(math.prod(shp) * dt.itemsize for shp, (_, dt) in zip(sizes, self.parts))
        if need > flat.numel():
            raise StrataError(f"the KV stage holds {flat.numel():,} B but {n} tokens need "
                              f"{need:,}")
        out, at = [None] * len(self.parts), 0
        for i in sorted(range(len(self.parts)), key=lambda i: -self.parts[i][1].itemsize):
            dt = self.parts[i][1]
            nb = math.prod(sizes[i]) * dt.itemsize
            out[i] = flat[at:at + nb].view(dt).view(sizes[i])
            at += nb
        return out

    @staticmethod
    def _segment(parts, n: int):
        from strata.kernels.attention import KVSegment
        return KVSegment(*[p[:n] for p in parts])

    def _ring(self, layer: int, P: int) -> list:
        """A sliding layer's kept tokens before position P, oldest first (positions
        max(0, P - R)..P-1, slot j mod R), as one or two segments."""
        R, parts = self.kept[layer], self.resident[layer]
        if min(P, R) == 0:
            return []
        s = P % R
        if P <= R or s == 0:              # not wrapped yet, or the oldest sits in slot 0
            return [self._segment(parts, min(P, R))]
        return [self._segment([p[s:] for p in parts], R - s), self._segment(parts, s)]

    # -- the chunk's protocol -------------------------------------------------------------
    def stage(self, layer: int) -> None:
        """Issue the copy of `layer`'s host-held tokens seen by the current chunk into its stage
        (after everything the compute lane has queued: the stage's last reader, the host writes)."""
        pending = self._restoring.pop(layer, None)
        if pending is not None:
            pending.result()          # its restored rows are written (or its error raised)
        n = min(self.length, self.held[layer])
        if n == 0 or layer in self._ready:
            return
        lane = self.lanes.get(layer)
        after = lane.event() if lane is not None else None
        done = None
        for dst, src in zip(self.stages[layer], self.hosted[layer]):
            if lane is None:
                dst[:n].copy_(src[:n])
            else:
                _, done = lane.copy_into(dst[:n], src[:n], after=after)
            self.streamed += src[:n].numel() * src.element_size()
        self._ready[layer] = done

    def _staged(self, layer: int) -> list[torch.Tensor]:
        """`layer`'s stage views, once its copy is issued and the compute lane waits for it."""
        self.stage(layer)
        lane = self.lanes.get(layer)
        if lane is not None:
            lane.wait(self._ready[layer])
        return self.stages[layer]

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               into: torch.Tensor | None = None, **extra) -> torch.Tensor:
        """q [T, H, hd], k, v [T, Hkv, hd] (normed and rotated; bf16 on CUDA, the dense dtype on
        the CPU) of the chunk at positions length.. -> o [T, H, hd] in q's dtype; then k, v join
        the cache. `extra`: the attention's window / sinks (chunk_attention's keywords), for the
        layers that have them; a layer kept as a sliding one must mask with its window (its
        ring holds no more). `into` (flat: the carve's attn): o's bytes where it fits
        (layers.buf_view), on every route (a first chunk's SDPA over groups of heads where
        one launch would pass flash.OUT_BYTES)."""
        from strata.kernels.attention import chunk_attention_for
        from strata.kernels.attention.flash_prefix import prefix_flash_attention, prefix_route
        from strata.kernels.attention.probe import attention_impl
        P, W = self.length, self.windows[layer]
        if W and extra.get("window") != W:
            raise StrataError(f"layer {layer} keeps the KV of a {W}-token window; its attention "
                              f"must mask with window={W}, got {extra.get('window', 0)}")
        n_host = min(P, self.held[layer])
        vals = self._stored(k, v)
        if self.kv == "int8":   # the chunk attends its keys and values as a later chunk will
            k, v = (x.to(k.dtype) for x in self._segment(vals, k.shape[0]).dequantized())
        if W:
            prefix = self._ring(layer, P)
        else:
            prefix = [self._segment(self._staged(layer), n_host)] if n_host else []
            if P - n_host:
                prefix.append(self._segment(self.resident[layer], P - n_host))
        out = buf_view(into, q.shape, q.dtype, q.device)
        if not prefix and not extra and q.is_cuda and attention_impl(q.device) == "triton":
            o = first_chunk_attention(q, k, v, out=out)
        elif (prefix or extra) and self.flash_prefix(q, extra):
            o = prefix_flash_attention(q, k, v, prefix, state=self.flash_state.get(layer),
                                       route=prefix_route(q.shape[-1], self.kv),
                                       sinks=extra.get("sinks"), out=out)
        else:
            o = chunk_attention_for(q.device)(     # Triton on CUDA, unless pinned
                q, k, v, prefix, scratch=self.scratch.get(layer), **{"out": out, **extra})
        self._append(layer, vals, k.shape[0])
        nxt = self._next.get(layer)
        if n_host and nxt is not None:
            self.stage(nxt)     # the next staged layer's copy overlaps this layer's experts
        return o

    def flash_prefix(self, q: torch.Tensor, extra: dict) -> bool:
        """Whether a later chunk of q's width attends its prefix by flash blocks
        (strata.kernels.attention.flash_prefix.prefix_route: bf16 KV at its widths; CUDA, the
        Triton attention in force, no window or packed sequences). A layer with sinks and no
        window takes them from its first chunk on (the blocks fold its sinks in)."""
        from strata.kernels.attention.flash_prefix import prefix_route
        from strata.kernels.attention.probe import attention_impl
        return (not extra.get("window") and extra.get("starts") is None
                and q.is_cuda and attention_impl(q.device) == "triton"
                and prefix_route(q.shape[-1], self.kv) != "triton")

    def _stored(self, k: torch.Tensor, v: torch.Tensor) -> list[torch.Tensor]:
        """k, v [T, Hkv, hd|Hv] as the cache keeps them: [k, v] (int8: codes, then scales)."""
        if self.kv != "int8":
            return [k, v]
        from strata.kernels.attention.kv_int8 import quantize_kv
        (kq, ks), (vq, vs) = quantize_kv(k, validate=False), quantize_kv(v, validate=False)
        return [kq, vq, ks, vs]

    def _append(self, layer: int, vals: list[torch.Tensor], T: int) -> list[torch.Tensor]:
        """The stored values `vals` (`_stored`) of the chunk's T tokens at positions length..
        into the cache (a full layer's host-held part with a copy queued on the compute lane);
        returns them."""
        P = self.length
        if P + T > self.n_tokens:
            raise StrataError(f"the KV holds {self.n_tokens} tokens; a chunk of {T} at position "
                              f"{P} does not fit")
        if self.windows[layer]:
            self._ring_write(layer, vals, P, T)
            return vals
        host = self.held[layer]
        h = max(0, min(P + T, host) - P)      # this chunk's tokens that go to the host
        for dst, src in zip(self.hosted[layer], vals):
            if h:
                dst[P:P + h].copy_(src[:h], non_blocking=True)
        for dst, src in zip(self.resident[layer], vals):
            if T - h:
                a = P + h - host
                dst[a:a + T - h].copy_(src[h:])
        return vals

    def attend_latent(self, layer: int, c: torch.Tensor, k_pe: torch.Tensor, attend):
        """MLA: the chunk's latent c [T, Lkv] and rope key k_pe [T, R] at positions length..
        join the cache (bf16, or int8 codes and per-token scales, as MLACache stores them);
        then `attend(prefix, c, k_pe, c_scale, k_pe_scale)` runs over keys 0..P+T-1 and its
        result is returned: `prefix` the host-held tokens 0..min(P, host) staged back (a list of
        at most one strata.models.mla.LatentSegment), then one run ending with the chunk — the
        resident tokens after the host part and the chunk (a chunk at P >= host), or the chunk
        alone (P < host: no resident token is before it). Then the next staged layer's copy is
        issued (it lands while this layer's experts run)."""
        from strata.models.mla import LatentSegment
        if self.windows[layer]:
            raise StrataError(f"layer {layer} slides; the latent KV has no sliding layers")
        P, T = self.length, c.shape[0]
        host, n_host = self.held[layer], min(P, self.held[layer])
        prefix = ([LatentSegment(*self._latent(self._staged(layer), 0, n_host))]
                  if n_host else [])
        if self.kv != "int8":    # stored in the cache's dtype: the chunk attends what is kept
            c, k_pe = c.to(self.code), k_pe.to(self.code)
        vals = self._append(layer, self._stored(c[:, None], k_pe[:, None]), T)
        run = (self._latent(self.resident[layer], 0, P + T - host) if P >= host else
               self._latent(vals, 0, T))
        o = attend(prefix, *run)
        nxt = self._next.get(layer)
        if n_host and nxt is not None:
            self.stage(nxt)     # the next staged layer's copy overlaps this layer's experts
        return o

    @staticmethod
    def _latent(parts, a: int, b: int) -> tuple:
        """(c [n, Lkv], k_pe [n, R], c_scale [n, 1] | None, k_pe_scale | None) of rows a..b of a
        one-head store's parts (k [S, 1, Lkv], v [S, 1, R], scales [S, 1])."""
        c, kp = parts[0][a:b, 0], parts[1][a:b, 0]
        if len(parts) == 2:
            return c, kp, None, None
        return c, kp, parts[2][a:b], parts[3][a:b]

    def _ring_write(self, layer: int, vals, P: int, T: int) -> None:
        """The chunk's last min(T, R) tokens into their slots (position mod R), queued after
        the attention that read the ring (the same stream)."""
        R = self.kept[layer]
        m = min(T, R)
        if m == 0:
            return
        a = (P + T - m) % R
        first = min(m, R - a)
        for dst, src in zip(self.resident[layer], vals):
            src = src[T - m:]
            dst[a:a + first].copy_(src[:first])
            if m > first:
                dst[:m - first].copy_(src[first:])

    def commit(self, n_tokens: int) -> None:
        self.length += n_tokens
        self._ready.clear()

    def restoring(self, layer: int, done) -> None:
        """`done` (a Future) is writing `layer`'s host-held rows beside the read: the layer's
        first stage, and settle, wait for it."""
        self._restoring[layer] = done

    def settle(self) -> None:
        """Wait for every restore still writing host-held rows; the first one's error raises."""
        pending, self._restoring = self._restoring, {}
        for done in pending.values():
            done.result()

    def release(self) -> None:
        """Drop every tensor (the resident KV, the pinned host KV, the stage and scratch views),
        after any restore still writing into them has stopped (its error was the prompt's)."""
        for done in self._restoring.values():
            done.exception()
        self._restoring = {}
        self.resident, self.hosted, self.stages, self._ready = [], [], {}, {}
        self.scratch, self.flash_state, self.states = {}, {}, None
        if self.host_arena is not None:
            self.host_arena.let_go(self)

    @property
    def host_bytes(self) -> int:
        """Bytes of the KV this one keeps in host memory (its own layers')."""
        return self._bytes(self.hosted)

    @property
    def vram_bytes(self) -> int:
        """Bytes of the KV kept on the layers' devices (resident windows and rings), recurrent
        states included."""
        return (self._bytes(self.resident)
                + (self.states.nbytes if self.states is not None else 0))

    def _bytes(self, stores) -> int:
        return sum(t.numel() * t.element_size() for l, parts in enumerate(stores)
                   if l in self.mine for t in parts)

