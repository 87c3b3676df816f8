"""Attention of one prefill chunk over the keys before it and its own, causal inside the chunk.

Legend: T chunk tokens, P prefix tokens (P = Pa + Pb over up to two segments), S = P + T,
H query heads, Hkv key/value heads, G = H / Hkv, hd head width.

    o[t, h] = sum_s softmax_s(scale · q[t, h] . k[s, h // G]) · v[s, h // G]    over s <= P + t

q [T, H, hd] bf16: the chunk's queries with the model's q-norm and RoPE already applied.
k, v [T, Hkv, hd] bf16: the chunk's own keys/values (k normed and rotated: QK-norm and RoPE are
applied before keys enter the cache, so every key the kernel sees, cached or not, is final).
prefix: 0, 1 or 2 KVSegments, oldest first; their tokens precede the chunk's, in order. The
engine passes (host-streamed older KV in a staging buffer, the resident window) without joining
them in memory. Query t sits at absolute position P + t and sees every prefix key and chunk keys
0..t. Output [T, H, hd] bf16 (or `out`, bf16 or fp32, any strides with a unit last one).
`window` W > 0 (a sliding layer): query t sees only keys at absolute positions j with
P + t - j < W. `sinks` [H] fp32 (learned sink logits, GPT-OSS): each head's sink joins its rows'
softmax denominator, o = sum_j e^{s_j} v_j / (e^{sink} + sum_j e^{s_j}).
`starts` [T] int32 (packed sequences: several independent ones back to back in the chunk, no
prefix): starts[t] is the chunk index of the first token of t's sequence, so query t sees chunk
keys starts[t]..t only (block-diagonal causal); a window and sinks hold within each sequence.
Positions are the caller's (RoPE restarts per sequence before q, k get here).
When the prefix is split over several launches (int8 pieces, below) the window goes by absolute
key position in each launch and the sinks join once, in the last (FINISH) launch.

`chunk_attention` (Triton) and `chunk_attention_torch` (plain torch) share this signature.

Kernel (strata.kernels.attention._kernel): a program owns BLOCK_M rows of (token, query head) of
one kv head — the G query heads of a kv head folded into M, so a K/V tile load serves all of them
— and runs the online softmax (fp32 state, exp2 with log2 e folded into the scale) over segment
a, segment b, then the chunk: the chunk's key tiles that lie wholly at or below the block's first
token run unmasked, the diagonal ones with the causal mask, the ones above are never visited.
int8 segments (strata.kernels.attention.kv_int8) carry per-token-per-head scales. The tile's
`int8` choice says where the codes become bf16, always in pieces of `scratch`
(strata.kernels.attention.scratch; the softmax state carried between launches when the prefix is
longer than it):
- "dequant" (the default): dequantized to plain bf16 K/V (one bf16 rounding of each element) and
  read by the bf16 kernel itself, at its rate;
- "expand": the exact codes as bf16, the scales folded onto the scores and the probabilities in
  the kernel (the same products as "kernel", in the same order);
- "kernel": each int8 tile converted inside the attention loop.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from strata._backend import INTERPRET
from strata.errors import StrataError
from strata.kernels.attention import _kernel as _k
from strata.kernels.attention.expand import expand_codes
from strata.kernels.attention.kv_int8 import dequantize_kv
from strata.kernels.attention.probe import attention_impl, probe_grid
from strata.kernels.attention.scratch import AttnScratch, plan_pieces
from strata.kernels.attention.tiles import AttnProblem, AttnTile, resolve_attn_tile

LOG2E = 1.4426950408889634
MAX_SEGMENTS = 2
HEAD_DIMS = (16, 32, 64, 128, 256)


@dataclass(frozen=True)
class KVSegment:
    """Keys and values of a run of consecutive earlier tokens, for one layer.

    k, v [S, Hkv, hd]: bf16, or int8 with k_scale, v_scale [S, Hkv] (fp32 or fp16). Any strides
    with a unit last one (a [Hkv, S, hd] cache passes `.transpose(0, 1)`); k and v share strides,
    and so do the two scales."""
    k: torch.Tensor
    v: torch.Tensor
    k_scale: torch.Tensor | None = None
    v_scale: torch.Tensor | None = None

    @property
    def length(self) -> int:
        return self.k.shape[0]

    @property
    def int8(self) -> bool:
        return self.k.dtype == torch.int8

    def dequantized(self) -> tuple[torch.Tensor, torch.Tensor]:
        """fp32 (k, v) [S, Hkv, hd]."""
        if self.int8:
            return dequantize_kv(self.k, self.k_scale), dequantize_kv(self.v, self.v_scale)
        return self.k.float(), self.v.float()


def _check_extras(q, window: int, sinks, starts=None, segs=()) -> None:
    if not isinstance(window, int) or isinstance(window, bool) or window < 0:
        raise StrataError(f"window must be a whole number >= 0 (0: no window), got {window!r}")
    if sinks is not None and (sinks.shape != (q.shape[1],) or sinks.device != q.device
                              or not sinks.dtype.is_floating_point):
        raise StrataError(f"sinks must be a float [H={q.shape[1]}] tensor on {q.device}; got "
                          f"{sinks.dtype} {list(sinks.shape)} on {sinks.device}")
    if starts is None:
        return
    if starts.shape != (q.shape[0],) or starts.device != q.device or starts.dtype not in (
            torch.int32, torch.int64):
        raise StrataError(f"starts must be an int32/int64 [T={q.shape[0]}] tensor on "
                          f"{q.device}; got {starts.dtype} {list(starts.shape)} on "
                          f"{starts.device}")
    if any(s.length for s in segs):
        raise StrataError("packed sequences (starts) read a chunk with no keys before it; got "
                          "a prefix")


def _check(q, k, v, prefix, out, floats=(torch.bfloat16,)
           ) -> tuple[int, int, int, int, list[KVSegment]]:
    """Shapes, dtypes and devices of one call -> (T, H, Hkv, hd, segments). `floats`: the float
    dtypes q, k, v and a float segment may have (the kernel: bf16; its torch twin: fp32 too, the
    CPU's fp32 KV)."""
    if q.ndim != 3 or k.ndim != 3 or v.ndim != 3:
        raise StrataError(f"q, k, v must be [T, H, hd], [T, Hkv, hd], [T, Hkv, hd]; got "
                          f"{list(q.shape)}, {list(k.shape)}, {list(v.shape)}")
    T, H, hd = q.shape
    Hkv = k.shape[1]
    if k.shape != v.shape or k.shape[0] != T or k.shape[2] != hd:
        raise StrataError(f"k and v must be [T={T}, Hkv, hd={hd}]; got {list(k.shape)}, "
                          f"{list(v.shape)}")
    if T == 0 or Hkv == 0 or H % Hkv:
        raise StrataError(f"need T >= 1 and H a multiple of Hkv; got T={T}, H={H}, Hkv={Hkv}")
    if hd not in HEAD_DIMS:
        raise StrataError(f"head width {hd} is not one of {HEAD_DIMS}")
    names = "/".join(str(f).removeprefix("torch.") for f in floats)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dtype not in floats:
            raise StrataError(f"{name} must be {names}, got {t.dtype}")
    if not q.dtype == k.dtype == v.dtype:
        raise StrataError(f"q, k, v must share a dtype; got {q.dtype}, {k.dtype}, {v.dtype}")
    segs = list(prefix)
    if len(segs) > MAX_SEGMENTS:
        raise StrataError(f"at most {MAX_SEGMENTS} prefix segments, got {len(segs)}")
    for i, s in enumerate(segs):
        if not isinstance(s, KVSegment):
            raise StrataError(f"prefix[{i}] must be a KVSegment, got {type(s).__name__}")
        if s.k.ndim != 3 or s.k.shape != s.v.shape or s.k.shape[1:] != (Hkv, hd):
            raise StrataError(f"prefix[{i}]: k and v must be [S, Hkv={Hkv}, hd={hd}]; got "
                              f"{list(s.k.shape)}, {list(s.v.shape)}")
        if s.k.dtype != s.v.dtype or s.k.dtype not in (*floats, torch.int8):
            raise StrataError(f"prefix[{i}]: k and v must both be {names} or both int8; got "
                              f"{s.k.dtype}, {s.v.dtype}")
        if s.int8:
            for name, sc in (("k_scale", s.k_scale), ("v_scale", s.v_scale)):
                if sc is None or sc.shape != s.k.shape[:2] or sc.dtype not in (torch.float32,
                                                                                torch.float16):
                    raise StrataError(f"prefix[{i}]: an int8 segment needs {name} [S, Hkv] fp32 "
                                      f"or fp16; got {None if sc is None else (sc.dtype, list(sc.shape))}")
        elif s.k_scale is not None or s.v_scale is not None:
            raise StrataError(f"prefix[{i}]: a bf16 segment takes no scales")
        devs = {t.device for t in (s.k, s.v, s.k_scale, s.v_scale) if t is not None}
        if devs != {q.device}:
            raise StrataError(f"prefix[{i}] is on {sorted(map(str, devs))}, q on {q.device}")
    if k.device != q.device or v.device != q.device:
        raise StrataError(f"q, k, v must share a device; got {q.device}, {k.device}, {v.device}")
    if out is not None and (out.shape != q.shape or out.dtype not in (torch.bfloat16,
                                                                       torch.float32)
                            or out.device != q.device):
        raise StrataError(f"out must be bf16 or fp32 {list(q.shape)} on {q.device}; got "
                          f"{out.dtype} {list(out.shape)} on {out.device}")
    return T, H, Hkv, hd, segs


def chunk_attention_torch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                          prefix: tuple[KVSegment, ...] | list[KVSegment] = (), *,
                          sm_scale: float | None = None, out: torch.Tensor | None = None,
                          tile: AttnTile | None = None,
                          scratch: AttnScratch | None = None, window: int = 0,
                          sinks: torch.Tensor | None = None,
                          starts: torch.Tensor | None = None) -> torch.Tensor:
    """The reference: dequantize, concatenate, repeat kv heads for GQA, explicit causal (and
    window, and packed sequences') mask over [T, P + T], the sink column, softmax in fp32; o in
    q's dtype. `tile` and
    `scratch` are accepted (and ignored) to keep the signature. Besides the kernel's bf16 it
    takes fp32 q, k, v and segments (the CPU's fp32 KV, `--kv fp32`)."""
    T, H, Hkv, hd, segs = _check(q, k, v, prefix, out, floats=(torch.bfloat16, torch.float32))
    _check_extras(q, window, sinks, starts, segs)
    scale = 1.0 / math.sqrt(hd) if sm_scale is None else sm_scale
    parts = [s.dequantized() for s in segs] + [(k.float(), v.float())]
    K = torch.cat([p[0] for p in parts]).repeat_interleave(H // Hkv, dim=1)   # [S, H, hd]
    V = torch.cat([p[1] for p in parts]).repeat_interleave(H // Hkv, dim=1)
    S = K.shape[0]
    P = S - T
    scores = torch.einsum("thd,shd->hts", q.float(), K) * scale              # [H, T, S]
    pos = torch.arange(S, device=q.device)
    qpos = P + torch.arange(T, device=q.device)[:, None]
    seen = pos[None, :] <= qpos                                              # [T, S]
    if window:
        seen &= qpos - pos[None, :] < window
    if starts is not None:     # no prefix: chunk index = position
        seen &= pos[None, :] >= starts.to(pos.dtype)[:, None]
    scores = scores.masked_fill(~seen, float("-inf"))
    if sinks is not None:
        col = sinks.float()[:, None, None].expand(H, T, 1)
        probs = torch.softmax(torch.cat([scores, col], dim=-1), dim=-1)[..., :-1]
    else:
        probs = torch.softmax(scores, dim=-1)
    o = torch.einsum("hts,shd->thd", probs, V)                               # [T, H, hd] fp32
    if out is None:
        return o.to(q.dtype)
    out.copy_(o)
    return out


def _strides(t: torch.Tensor, what: str) -> tuple[int, int]:
    if t.stride(-1) != 1:
        raise StrataError(f"{what} needs a unit stride in its last dim, got strides {t.stride()}")
    return t.stride(0), t.stride(1)


def chunk_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    prefix: tuple[KVSegment, ...] | list[KVSegment] = (), *,
                    sm_scale: float | None = None, out: torch.Tensor | None = None,
                    tile: AttnTile | None = None,
                    scratch: AttnScratch | None = None, window: int = 0,
                    sinks: torch.Tensor | None = None,
                    starts: torch.Tensor | None = None) -> torch.Tensor:
    """The Triton kernel (see the module docstring). `tile` overrides the heuristic's tile (a pin,
    `pin_attn_tile`, does so for a whole block of code). `scratch`: where int8 segments are
    expanded (tile.int8 = "dequant" or "expand"); without one, a fresh one holds the whole int8 prefix."""
    T, H, Hkv, hd, segs = _check(q, k, v, prefix, out)
    _check_extras(q, window, sinks, starts, segs)
    G = H // Hkv
    scale = 1.0 / math.sqrt(hd) if sm_scale is None else sm_scale
    cfg = resolve_attn_tile(AttnProblem(T * G, hd), tile)
    if out is None:
        out = torch.empty_like(q)
    st_q, st_o = _strides(q, "q"), _strides(out, "out")
    st_c = _strides(k, "k")
    if _strides(v, "v") != st_c:
        raise StrataError(f"the chunk's k and v must share strides; got {k.stride()}, "
                          f"{v.stride()}")
    for i, s in enumerate(segs):
        st = _strides(s.k, f"prefix[{i}].k")
        if _strides(s.v, f"prefix[{i}].v") != st:
            raise StrataError(f"prefix[{i}]: k and v must share strides; got {s.k.stride()}, "
                              f"{s.v.stride()}")
        if s.int8 and s.v_scale.stride() != s.k_scale.stride():
            raise StrataError(f"prefix[{i}]: k_scale and v_scale must share strides; got "
                              f"{s.k_scale.stride()}, {s.v_scale.stride()}")
    # the window, the sinks and packed sequences only when asked for: the plain launch passes
    # their off values (None, 0) and is unchanged
    extra = {}
    if window:
        extra.update(window=window, n_prefix=sum(x.length for x in segs))
    if sinks is not None:
        extra.update(sinks_ptr=sinks.float().contiguous())
    if starts is not None:
        extra.update(starts_ptr=starts.to(torch.int32).contiguous())
    launch = _Launch(q, k, v, out, T, st_q, st_o, st_c, scale * LOG2E, G, hd, cfg, Hkv, extra)
    # absolute position of each segment's first key: the window holds in every launch
    seg_pos = [sum(x.length for x in segs[:i]) for i in range(len(segs))]
    int8_rows = sum(s.length for s in segs if s.int8)
    if cfg.int8 == "kernel" or int8_rows == 0:
        launch([_seg_args(s) for s in segs if s.length],
               [seg_pos[i] for i, s in enumerate(segs) if s.length], resume=False, finish=True)
        return out
    if scratch is None:
        scratch = AttnScratch.of(Hkv, hd, int8_rows, q.device)
    if scratch.k.shape[1:] != (Hkv, hd) or scratch.k.dtype != torch.bfloat16:
        raise StrataError(f"the expansion scratch must be bf16 [R, Hkv={Hkv}, hd={hd}]; got "
                          f"{scratch.k.dtype} {list(scratch.k.shape)}")
    pieces = plan_pieces([(s.length, s.int8) for s in segs], scratch.rows, cfg.BLOCK_N)
    state = scratch.carried(T, H, hd) if len(pieces) > 1 else None
    for n, launch_pieces in enumerate(pieces):
        args = []
        for pc in launch_pieces:
            s = segs[pc.seg]
            cut = slice(pc.start, pc.start + pc.n)
            if pc.at is None:
                args.append(_seg_args(KVSegment(s.k[cut], s.v[cut])))
                continue
            if cfg.int8 == "dequant":     # plain bf16 K/V: the bf16 kernel, at its rate
                kx = expand_codes(s.k[cut], scratch.k[pc.at:pc.at + pc.n], s.k_scale[cut])
                vx = expand_codes(s.v[cut], scratch.v[pc.at:pc.at + pc.n], s.v_scale[cut])
                args.append(_seg_args(KVSegment(kx, vx)))
                continue
            kx = expand_codes(s.k[cut], scratch.k[pc.at:pc.at + pc.n])
            vx = expand_codes(s.v[cut], scratch.v[pc.at:pc.at + pc.n])
            args.append(_seg_args(s, kx, vx, cut))
        launch(args, [seg_pos[pc.seg] + pc.start for pc in launch_pieces], resume=n > 0,
               finish=n == len(pieces) - 1, state=state)
    return out


def _seg_args(s: KVSegment, k=None, v=None, cut=slice(None)) -> tuple[tuple, bool]:
    """(kernel args, scaled) of one segment: its own k, v, or (k, v) its expanded codes with
    the scales of its tokens `cut`."""
    k = s.k if k is None else k
    v = s.v if v is None else v
    if s.int8:
        ks, vs = s.k_scale[cut], s.v_scale[cut]
        return (k, v, ks, vs, k.shape[0], *k.stride()[:2], *ks.stride()), True
    return (k, v, k, k, k.shape[0], *k.stride()[:2], 0, 0), False


@dataclass(frozen=True)
class _Launch:
    """One chunk's fixed launch arguments; a call launches the kernel over up to two segments."""
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    out: torch.Tensor
    T: int
    st_q: tuple
    st_o: tuple
    st_c: tuple
    qk_scale: float
    G: int
    hd: int
    cfg: AttnTile
    Hkv: int
    extra: dict   # window / n_prefix, sinks_ptr, starts_ptr (empty: the plain launch)

    def __call__(self, segs: list[tuple[tuple, bool]], pos: list[int], *, resume: bool,
                 finish: bool, state: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
        """pos: each segment's first key's absolute position (read only under a window)."""
        # an absent segment: length 0, never read; a bf16 one's scale pointers: never read
        empty = ((self.k, self.v, self.k, self.k, 0, 0, 0, 0, 0), False)
        (a, a_sc), (b, b_sc) = (list(segs) + [empty] * MAX_SEGMENTS)[:MAX_SEGMENTS]
        x = self.extra
        pa, pb = (list(pos) + [0] * MAX_SEGMENTS)[:MAX_SEGMENTS] if "window" in x else (0, 0)
        acc, ml = state if state is not None else (self.q, self.q)
        cfg = self.cfg
        grid = probe_grid((triton_cdiv(self.T * self.G, cfg.BLOCK_M), self.Hkv))
        _k._chunk_attn_fwd_kernel[grid](
            (self.q, self.k, self.v, self.out, self.T, *self.st_q, *self.st_o, *self.st_c), a, b,
            self.qk_scale, (acc, ml, ml.stride(0)),
            (x.get("sinks_ptr"), x.get("window", 0), pa, pb, x.get("n_prefix", 0),
             x.get("starts_ptr")),
            S=_k.AttnSpec(G=self.G, HD=self.hd, BM=cfg.BLOCK_M, BN=cfg.BLOCK_N, A_SCALED=a_sc,
                          B_SCALED=b_sc, RESUME=resume, FINISH=finish, INTERP=INTERPRET,
                          WIN="window" in x, SINKS="sinks_ptr" in x, SEQ="starts_ptr" in x),
            num_warps=cfg.num_warps, num_stages=cfg.num_stages)


def chunk_attention_for(device):
    """chunk_attention (the Triton kernel) on CUDA, chunk_attention_torch elsewhere, unless
    pinned (strata.kernels.attention.probe.pin_attention): one signature, the caller's device."""
    return chunk_attention if attention_impl(device) == "triton" else chunk_attention_torch


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


def causal_pairs(T: int, P: int) -> int:
    """Visible (query, key) pairs of one head: T·P prefix pairs + T(T+1)/2 inside the chunk. The
    attention's FLOPs are 4·hd·H per pair (q.k and p.v, a multiply and an add each)."""
    return T * P + T * (T + 1) // 2
