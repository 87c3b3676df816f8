"""Multi-head latent attention (DeepSeek-V2/V3, Kimi-K2; GGUF `deepseek2`) for chunked prefill.

Legend: T tokens of the chunk, P tokens already cached, S = P + T keys, D hidden, H heads,
N no-rope dims of a q/k head, R rope dims (hd = N + R), Hv value head dim, Lq q_lora,
Lkv kv_lora (the latent).

    q = Wqb rms(Wqa x)  (or Wq x)           [T, H, N + R]      q_nope | q_pe
    c, k_pe = split(Wkva x)                 [T, Lkv], [T, R]   c = rms(c): the cached latent
    q_pe, k_pe = rope_pairs(q_pe), rope_pairs(k_pe)            k_pe shared by every head
    cache += (c, k_pe)                      (Lkv + R) values per token per layer: the KV the
                                            plan counts (strata.shapes.mla_token_bytes): bf16,
                                            or int8 + one fp32 scale each per token (MLACache;
                                            with --kv-resident the engine's PromptKV keeps the
                                            older tokens in host memory and hands them back as
                                            the attention's `prefix`)
    Wkvb = [Wuk | Wuv] per head             [H, N + Hv, Lkv]
    o = causal softmax([q_nope, q_pe] . [c Wuk^T, k_pe] / sqrt(hd)) (c Wuv^T)   [T, H, Hv]
    y = Wo o                                [T, D]

Two forms of the same attention, one signature (`mla_chunk_attention`):
- expanded (what the model runs): decompress K_nope = c Wuk^T and V = c Wuv^T and attend with
  the heads' full q, a query block of B tokens at a time (the launch's block, MLA_BLOCK by
  default: strata.models.mla_launch); each decompresses the keys it sees B at a time and merges
  the key blocks by their log-sum-exp in fp32. On CUDA the keys land in the plan's scratch
  (strata.models.mla_scratch: mla_k / mla_v one block of K/V, mla_state the query block's acc
  and lse; the engine carves it) and each block is one launch with its lse
  (strata.models.mla_attend): torch's memory-efficient attention kernel (`attend_block`), its
  flash forward with V zero-padded to the q/k width (`attend_block_flash`, the default: flash
  takes one width, 192 for q/k and 128 for v here), cuDNN's attention at both widths
  (`attend_block_cudnn`; strata's block kernel where a GPU has no cuDNN attention, the same
  scratch), or strata's block kernel (`attend_carried`,
  strata.kernels.attention.mla_block: q/k 192 as two dots, v 128, the softmax state carried
  through the launches instead of merged); off CUDA, the reference, the same blocks in fp32
  plain torch. The transient beyond the scratch is one launch's kernel output (flash's hd wide;
  the block kernel's none), at most the launch's out_bytes (a block of more launches over
  groups of heads: strata.models.mla_launch.launch_heads), not the S keys' K/V (2.7 GB at S =
  32K before).
- absorbed (`mla_chunk_attention_absorbed`, the reference, in fp64): fold Wuk into the query
  (q_lat = q_nope Wuk, [T, H, Lkv]) and attend in the latent space, then Wuv on the output.

The blocks' cost on CUDA: each query block re-decompresses the keys before it, ceil(T / B)
passes of 2·S·Lkv·H·(N+Hv) (33.5M·S: 1.1 TFLOP at S = 32K, a cuBLAS GEMM) against the
attention's 81,920·T·S (11 TFLOP at T = 4096), and each key block's merge reads and writes the
fp32 state (2·B·H·Hv·4 B); the efficient kernel and its tiles are those the all-at-once SDPA
ran. The flash backend's PV product runs hd wide on the padded V: 2·T·S·H·(N+R+hd) =
98,304·T·S, +20% of the attention's multiply-adds, at flash's rate. benchmarks/mla_bench.py
measures blocked against all-at-once, and the backends (--arms blocked:flash).

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

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from strata.errors import StrataError
from strata.kernels.attention.kv_int8 import KV_DTYPES, cache_dtype, quantize_kv
from strata.models.layers import matmul_into, norm_out, rms_norm, rope_pairs_in_place
# the block kernels live in mla_attend; the tests and benchmarks import them from here too
from strata.models.mla_attend import (attend_block, attend_block_cudnn, attend_block_flash,
                                      attend_block_ref, attend_carried, attend_for, key_blocks,
                                      merge_block, merge_for)
from strata.models.mla_launch import (MLA_BLOCK, backend_on, key_rows, launch_heads,
                                     mla_launch, value_bytes)
from strata.models.mla_scratch import MLAScratch, mla_scratch_rows, mla_value_width



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


@dataclass(frozen=True, eq=False)
class LatentSegment:
    """The latent KV of a run of consecutive earlier tokens, for one layer: c [S, Lkv] and
    k_pe [S, R] (rows contiguous), in a float dtype, or int8 codes with c_scale, k_pe_scale
    [S, 1] fp32 (MLACache's format). `mla_chunk_attention`'s `prefix` is a list of these: the
    host-held tokens a chunk streams back (strata.models.kv.PromptKV.attend_latent)."""
    c: torch.Tensor
    k_pe: torch.Tensor
    c_scale: torch.Tensor | None = None
    k_pe_scale: torch.Tensor | None = None

    @property
    def length(self) -> int:
        return self.c.shape[0]


class MLACache:
    """Per layer the normed latent c [P, Lkv] and the rotated rope key k_pe [P, R] of the tokens
    read so far (`capacity` preallocates, else it grows). `length` is P. kv="bf16" / "fp32" keeps
    them in that dtype (None: the model's `dtype`, the reference forward's); kv="int8" keeps int8 codes with one fp32 scale per token for each of the
    two (strata.kernels.attention.kv_int8's format with the latent and the rope key one "head"
    each: a token's scales are its own, written once when its chunk joins the cache; the rope
    key gets its own scale because it is not normed and its range is not the latent's).
    `scratch`: layer -> MLAScratch the attention works in on CUDA (the engine's carve of the
    plan's mla_k / mla_v / mla_state (/ mla_c); a layer without one makes its own of that size)."""

    # the chunk's packed sequences (strata.models.packed.Packed), set by Decoder.prefill for
    # the chunk it reads; None: one sequence
    packed = None

    def __init__(self, n_layer: int, kv_lora: int, rope: int, *, capacity: int | None = None,
                 dtype: torch.dtype = torch.float32, device="cpu",
                 scratch: dict[int, MLAScratch] | None = None, kv: str | None = None):
        if kv is not None and kv not in KV_DTYPES:
            raise StrataError(f"MLA KV must be one of {', '.join(KV_DTYPES)}, got {kv!r}")
        self.capacity, self.length, self.kv = capacity, 0, kv
        self.scratch = scratch or {}
        devs = list(device) if isinstance(device, (list, tuple)) else [device] * n_layer
        n = capacity or 0
        code = torch.int8 if kv == "int8" else cache_dtype(kv, dtype)
        self.c = [torch.zeros(n, kv_lora, dtype=code, device=d) for d in devs]
        self.k_pe = [torch.zeros(n, rope, dtype=code, device=d) for d in devs]
        self.c_scale = [torch.zeros(n, 1, device=d) for d in devs] if kv == "int8" else None
        self.k_pe_scale = [torch.zeros(n, 1, device=d) for d in devs] if kv == "int8" else None

    @property
    def vram_bytes(self) -> int:
        """Bytes the cache holds on the layers' devices (what the plan's kv_vram counts)."""
        return sum(t.numel() * t.element_size() for store in self._stores() for t in store)

    host_bytes = 0      # the model's cache keeps nothing in host memory

    def _stores(self):
        names = ("c", "k_pe") + (("c_scale", "k_pe_scale") if self.kv == "int8" else ())
        return [getattr(self, n) for n in names]

    def extend(self, layer: int, c: torch.Tensor, k_pe: torch.Tensor):
        """Add the chunk's c [T, Lkv], k_pe [T, R]; returns all P+T tokens' (c, k_pe, c_scale,
        k_pe_scale): bf16 the values and None, None; int8 the codes and fp32 scales [P+T, 1]."""
        P, T = self.length, c.shape[0]
        if self.capacity is not None and P + T > self.capacity:
            raise StrataError(f"MLA cache holds {self.capacity} tokens; a chunk of {T} at "
                              f"position {P} does not fit")
        new = [c, k_pe]
        if self.kv == "int8":   # validate=False: a NaN reaches the output (the finite guard)
            (cq, cs), (kq, ks) = (quantize_kv(x[:, None], validate=False) for x in (c, k_pe))
            new = [cq[:, 0], kq[:, 0], cs, ks]
        out = []
        for store, x in zip(self._stores(), new):
            if self.capacity is None:
                store[layer] = torch.cat([store[layer], x])
            else:
                store[layer][P:P + T] = x
            out.append(store[layer][:P + T])
        return tuple(out) + ((None, None) if self.kv != "int8" else ())

    def attend_latent(self, layer: int, c: torch.Tensor, k_pe: torch.Tensor, attend):
        """The chunk's c, k_pe join the cache (`extend`); then `attend(prefix, c, k_pe, c_scale,
        k_pe_scale)` over all P+T tokens, the prefix empty (every token is resident): the
        protocol strata.models.kv.PromptKV.attend_latent keeps for a host-held window."""
        return attend([], *self.extend(layer, c, k_pe))

    def commit(self, n_tokens: int) -> None:
        self.length += n_tokens


def _joined(prefix, c, k_pe, c_scale, k_pe_scale):
    """One run of the prefix segments' tokens followed by (c, k_pe, c_scale, k_pe_scale)."""
    if not prefix:
        return c, k_pe, c_scale, k_pe_scale
    segs = [*prefix, LatentSegment(c, k_pe, c_scale, k_pe_scale)]
    cat = [torch.cat([getattr(g, n).to(getattr(segs[-1], n).dtype) for g in segs])
           for n in ("c", "k_pe")]
    if c_scale is None:
        return cat[0], cat[1], None, None
    return (*cat, torch.cat([g.c_scale for g in segs]), torch.cat([g.k_pe_scale for g in segs]))


def _check_prefix(prefix, c, k_pe, c_scale) -> None:
    for g in prefix:
        if (g.c_scale is None) != (c_scale is None) or g.c.shape[1:] != c.shape[1:] or \
                g.k_pe.shape[1:] != k_pe.shape[1:] or g.k_pe.shape[0] != g.c.shape[0]:
            raise StrataError(f"an MLA prefix segment must hold the chunk's format: c [S, "
                              f"{c.shape[1]}], k_pe [S, {k_pe.shape[1]}], "
                              f"{'int8 with scales' if c_scale is not None else 'no scales'}; "
                              f"got c {list(g.c.shape)}, k_pe {list(g.k_pe.shape)}, "
                              f"{'scales' if g.c_scale is not None else 'no scales'}")


def _dequant(x: torch.Tensor, scale: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """x as `dtype`: int8 codes times their per-token scale [S, 1] (or [S]), else a cast."""
    if scale is None:
        return x.to(dtype)
    return (x.to(dtype) * scale.reshape(-1, 1).to(dtype))


def _split_kvb(wkvb: torch.Tensor, n_head: int, nope: int, v_dim: int):
    w = wkvb.view(n_head, nope + v_dim, -1)
    return w[:, :nope], w[:, nope:]                       # [H, N, Lkv], [H, Hv, Lkv]


def mla_chunk_attention(q_nope: torch.Tensor, q_pe: torch.Tensor, c: torch.Tensor,
                        k_pe: torch.Tensor, wkvb: torch.Tensor, *, v_head_dim: int,
                        scale: float, block: int | None = None, sdpa: bool | None = None,
                        scratch: MLAScratch | None = None, out: torch.Tensor | None = None,
                        c_scale: torch.Tensor | None = None,
                        k_pe_scale: torch.Tensor | None = None,
                        prefix: Sequence[LatentSegment] = ()) -> torch.Tensor:
    """Expanded form. q_nope [H, T, N], q_pe [H, T, R] (rotated) of the chunk's T tokens, the
    last T of the S keys c [S, Lkv], k_pe [S, R] (rotated); wkvb [H*(N+Hv), Lkv] -> o [T, H, Hv]
    in q's dtype (written into `out` when given). Query t (position S-T+t) sees keys 0..S-T+t.
    int8 KV (MLACache kv="int8"): c and k_pe are int8 codes and c_scale, k_pe_scale [S, 1] fp32
    their per-token scales; each key block is dequantized to q's dtype (on CUDA into the
    scratch's c rows, the plan's mla_c) before it is decompressed. `prefix`: LatentSegments of
    the tokens before c, in position order, in c's format (the S keys are the prefix's tokens,
    then c's): a host-held window streamed back (strata.models.kv.PromptKV). A key block that
    spans two of them is gathered into the scratch's c rows (bf16 too), so every block is the
    one the keys in one run give, and the result is the same.

    sdpa=True (the default on CUDA): query blocks of `block` tokens (None: the scratch's, which
    the engine's carve sized; else the launch's in force, strata.models.mla_launch); each
    decompresses the keys it sees `block` at a time into
    `scratch` (strata.models.mla_scratch: the plan's mla_k / mla_v / mla_state carve; a launch
    given none makes one of that size) in q's dtype, attends each key block with one fused
    launch of the launch's backend (`attend_block`: torch's memory-efficient kernel, the one
    SDPA picks for these head widths; `attend_block_flash`: flash on V zero-padded to hd;
    `attend_block_ref` off CUDA, on the padded V for flash) and merges the blocks by their
    log-sum-exp in fp32 (the launch's merge: `merge_block`, or its one-launch kernel; a query
    block with one key block is written as it comes); the "triton" backend's launches
    (`attend_carried`) fold each block into the fp32 state themselves, the last into `out`.
    sdpa=False (the default off CUDA, the reference): the same blocking in fp32 plain torch,
    a transient of one block's expanded keys and scores."""
    H, T, N = q_nope.shape
    _check_prefix(prefix, c, k_pe, c_scale)
    sdpa = q_nope.is_cuda if sdpa is None else sdpa
    if block is None:   # the carve's block where the scratch is the carve's, else the launch's
        block = scratch.block if scratch is not None and scratch.block else mla_launch().block
    if sdpa:
        segs = [*prefix, LatentSegment(c, k_pe, c_scale, k_pe_scale)]
        return _expanded_scratch(q_nope, q_pe, segs, wkvb, v_head_dim, scale, block,
                                 scratch, out)
    c, k_pe, c_scale, k_pe_scale = _joined(prefix, c, k_pe, c_scale, k_pe_scale)
    if c_scale is not None:
        c, k_pe = _dequant(c, c_scale, torch.float32), _dequant(k_pe, k_pe_scale, torch.float32)
    o = torch.cat([_expanded_blocks(q_nope[:, a:a + block], q_pe[:, a:a + block],
                                    c[:c.shape[0] - T + a + q_nope[:, a:a + block].shape[1]],
                                    k_pe, wkvb, v_head_dim, scale, block)
                   for a in range(0, T, block)])
    return o if out is None else out.copy_(o)


def whole_q(q_nope: torch.Tensor, q_pe: torch.Tensor) -> torch.Tensor:
    """q [H, T, N + R] of q_nope [H, T, N] and q_pe [H, T, R]: their one tensor where they are
    its two column ranges side by side (mla_attention's, rotated in place), else joined (a
    copy: on the H100 3.4 ms a layer at T 32,768, 1.5 GiB)."""
    N, it = q_nope.shape[-1], q_nope.element_size()
    if (q_pe.dtype == q_nope.dtype and q_pe.device == q_nope.device
            and q_pe.shape[:-1] == q_nope.shape[:-1] and q_pe.stride() == q_nope.stride()
            and q_nope.stride(-1) == 1
            and q_pe.untyped_storage().data_ptr() == q_nope.untyped_storage().data_ptr()
            and q_pe.data_ptr() == q_nope.data_ptr() + N * it):
        return q_nope.as_strided((*q_nope.shape[:-1], N + q_pe.shape[-1]), q_nope.stride())
    return torch.cat([q_nope, q_pe], dim=-1)


def _pieces(segs, starts, a: int, b: int):
    """(segment index, its rows pa..pb, the block's rows i0..i1) covering keys a..b-1."""
    for j, (g, s0) in enumerate(zip(segs, starts)):
        lo, hi = max(a, s0), min(b, s0 + g.length)
        if lo < hi:
            yield j, lo - s0, hi - s0, lo - a, hi - a


def _expanded_scratch(q_nope, q_pe, segs, wkvb, v_head_dim, scale, block, scratch, out):
    H, T, N = q_nope.shape
    L, R, Hv, dt = segs[-1].c.shape[1], q_pe.shape[-1], v_head_dim, q_nope.dtype
    starts = [0]
    for g in segs:
        starts.append(starts[-1] + g.length)
    S = starts.pop()
    hd, P = N + R, S - T
    int8 = segs[-1].c_scale is not None
    # int8 dequantizes every block into the c rows; bf16 uses them to gather a block that
    # spans two segments (a host-held prefix beside the resident run)
    latent = L + R if int8 or len(segs) > 1 else 0
    launch = mla_launch()
    backend, merge = backend_on(launch.backend, q_nope.is_cuda), merge_for(launch.merge)
    if scratch is None:
        scratch = MLAScratch.of(H, hd, Hv, T, S, q_nope.device, dtype=dt, block=block,
                                latent=latent, backend=backend)
    scratch.check(H, hd, Hv, T, S, dt, block, latent, backend)
    attend, vw = attend_for(backend, Hv), mla_value_width(hd, Hv, backend)
    square = backend == "cudnn"    # its masked block square, the keys before it key_rows a launch
    kb = key_rows(block, launch) if square else block
    carried = backend == "triton"
    # flash: v [H, rows, W] a call, its rows the scratch's key rows
    rows = mla_scratch_rows(T, S, block)[0] if backend == "flash" else None
    if rows is not None:   # the padding, once a call: the same columns of every block (o's
        # columns < Hv never read them, each its own dot product; zero keeps the rest finite)
        scratch.padded(rows, H, vw)[..., Hv:].zero_()
    w_uk, w_uv = _split_kvb(wkvb.to(dt), H, N, Hv)
    w_uk, w_uv = w_uk.transpose(1, 2), w_uv.transpose(1, 2)                  # [H, Lkv, N|Hv]
    if not int8:
        cast = [(g.c.to(dt), g.k_pe.to(dt)) for g in segs]
    q = whole_q(q_nope, q_pe.to(dt))                                         # [H, T, hd]
    o = out if out is not None else torch.empty(T, H, Hv, dtype=dt, device=q.device)
    for t0 in range(0, T, block):
        n = min(block, T - t0)
        acc, lse = scratch.carried(n, H, Hv)
        blocks = key_blocks(P + t0 + n, n, kb, square=square)
        hg = launch_heads(H, n, vw, value_bytes(backend, q.element_size()), launch)
        heads = [slice(h0, min(H, h0 + hg)) for h0 in range(0, H, hg)]
        for i, (a, b, masked) in enumerate(blocks):
            k, v = scratch.kv(b - a, H, hd, vw, rows)
            pieces = list(_pieces(segs, starts, a, b))
            if int8:     # codes x their token's scale, into the scratch's c rows
                lat = scratch.latent(b - a, latent)
                for j, pa, pb, i0, i1 in pieces:
                    g = segs[j]
                    torch.mul(g.c[pa:pb], g.c_scale[pa:pb].reshape(-1, 1), out=lat[i0:i1, :L])
                    torch.mul(g.k_pe[pa:pb], g.k_pe_scale[pa:pb].reshape(-1, 1),
                              out=lat[i0:i1, L:])
                cblk, kblk = lat[:, :L], lat[:, L:]
            elif len(pieces) == 1:
                (j, pa, pb, _, _), = pieces
                cd, kp = cast[j]
                cblk, kblk = cd[pa:pb], kp[pa:pb]
            else:        # gathered as one run's rows are laid out: [m, Lkv], then [m, R]
                cblk, kblk = scratch.gathered(b - a, L, R)
                for j, pa, pb, i0, i1 in pieces:
                    cblk[i0:i1].copy_(segs[j].c[pa:pb])
                    kblk[i0:i1].copy_(segs[j].k_pe[pa:pb])
            cb = cblk.expand(H, b - a, L)                                    # no copy
            torch.bmm(cb, w_uk, out=k[..., :N])                              # c Wuk^T
            k[..., N:].copy_(kblk.expand(H, b - a, R))                       # the shared k_pe
            torch.bmm(cb, w_uv, out=v[..., :Hv])                             # c Wuv^T
            if carried:  # the launch folds the block into the state; the last one writes o
                last = i == len(blocks) - 1
                attend_carried(q[:, t0:t0 + n], k, v, masked, scale, acc=acc, lse=lse,
                               first=i == 0, out=o[t0:t0 + n].transpose(0, 1) if last else None)
            # the kernel's output lives only through its merge (one block's at a time, a
            # group of heads at a time: launch_heads keeps it within the launch's out_bytes)
            elif len(blocks) > 1:
                for h in heads:
                    merge(acc[h], lse[h], *attend(q[h, t0:t0 + n], k[h], v[h], masked, scale),
                          i == 0)
            else:    # written as it comes (through the fp32 acc it would read the same)
                for h in heads:
                    o[t0:t0 + n, h].copy_(attend(q[h, t0:t0 + n], k[h], v[h], masked, scale)[0]
                                          .transpose(0, 1))
        if len(blocks) > 1 and not carried:
            o[t0:t0 + n].copy_(acc.transpose(0, 1))
    return o


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
                                 scale: float, block: int | None = None,
                                 sdpa: bool | None = None, scratch: MLAScratch | None = None,
                                 out: torch.Tensor | None = None,
                                 c_scale: torch.Tensor | None = None,
                                 k_pe_scale: torch.Tensor | None = None,
                                 prefix: Sequence[LatentSegment] = ()) -> torch.Tensor:
    """Absorbed form, fp64, all keys at once (the reference; `block`, `sdpa`, `scratch`
    accepted and unused; `out` written when given; int8 codes dequantized in fp64; the
    prefix's tokens joined before c's)."""
    _check_prefix(prefix, c, k_pe, c_scale)
    c, k_pe, c_scale, k_pe_scale = _joined(prefix, c, k_pe, c_scale, k_pe_scale)
    H, T, N = q_nope.shape
    S = c.shape[0]
    w_uk, w_uv = _split_kvb(wkvb.double(), H, N, v_head_dim)
    cd = _dequant(c, c_scale, torch.float64)
    kp = _dequant(k_pe, k_pe_scale, torch.float64)
    q_lat = torch.einsum("htn,hnl->htl", q_nope.double(), w_uk)              # [H, T, Lkv]
    sc = (q_lat @ cd.t() + q_pe.double() @ kp.t()) * scale                   # [H, T, S]
    causal = torch.arange(S)[None, :] > (S - T + torch.arange(T))[:, None]
    p = torch.softmax(sc.masked_fill(causal.to(c.device), float("-inf")), dim=-1)
    o_lat = p @ cd                                                           # [H, T, Lkv]
    o = torch.einsum("htl,hvl->thv", o_lat, w_uv).to(q_nope.dtype)           # [T, H, Hv]
    return o if out is None else out.copy_(o)


def softmax_scale(s) -> float:
    """The attention's softmax scale: 1/sqrt(hd), times YaRN's mscale² (Yarn.kq) when scaled."""
    return s.head_dim ** -0.5 * (s.yarn.kq if s.yarn is not None else 1.0)


def mla_attention(x: torch.Tensor, w: MLAWeights, shape, cos: torch.Tensor, sin: torch.Tensor,
                  cache, layer: int, *, eps: float, out: torch.Tensor | None = None
                  ) -> torch.Tensor:
    """x [T, D] (normed) at positions P..P+T-1 -> [T, D]; appends (c, k_pe) to `cache`: the
    model's MLACache, or the engine's PromptKV over the latent (a host-held window streamed
    back as the attention's prefix); both keep `attend_latent`'s protocol. `out`: where the
    output goes when it takes it (layers.into_view; the decoder passes x, dead by then)."""
    s = shape
    m = s.mla
    T, H, R = x.shape[0], s.n_head, m.qk_rope
    N = s.head_dim - R
    # the engine's carve holds the chunk's query and output (MLAScratch.query / output): the
    # layer computes into them rather than allocating them beside the plan
    sc = cache.scratch.get(layer)
    qbuf = sc.query(T, H * s.head_dim, x.dtype, x.device) if sc is not None else None
    if w.wqa is not None:
        qa, qn = sc.q_a(T, m.q_lora, x.dtype, x.device) if sc is not None else (None, None)
        qa = torch.matmul(x, w.wqa.t(), out=qa)
        q = torch.matmul(rms_norm(qa, w.q_norm, eps, norm_out(qn, qa, w.q_norm)), w.wqb.t(),
                         out=qbuf)
    else:
        q = torch.matmul(x, w.wq.t(), out=qbuf)
    q = q.view(T, H, s.head_dim).transpose(0, 1)                             # [H, T, hd]
    # rotated in place: q_nope and q_pe stay the two column ranges of one tensor, which the
    # blocked attention reads as q whole (whole_q), with no joined copy
    q_nope, q_pe = q[..., :N], q[..., N:]
    rope_pairs_in_place(q_pe, cos, sin)
    L = m.kv_lora
    kv = torch.matmul(x, w.wkva.t(), out=None if sc is None else
                      sc.kv_proj(T, L + R, x.dtype, x.device))               # [T, Lkv + R]
    c = rms_norm(kv[:, :L], w.kv_norm, eps,
                 None if sc is None else norm_out(sc.c_out(T, L, x.dtype, x.device),
                                                  kv[:, :L], w.kv_norm))
    k_pe = rope_pairs_in_place(kv[:, L:][None], cos, sin)[0]                # [T, R], in kv

    def attend(prefix, c_run, kpe_run, c_scale, kpe_scale):
        return mla_chunk_attention(q_nope, q_pe, c_run, kpe_run, w.wkvb,
                                   v_head_dim=m.v_head_dim, scale=softmax_scale(s),
                                   scratch=sc, c_scale=c_scale, k_pe_scale=kpe_scale,
                                   prefix=prefix, out=None if sc is None else
                                   sc.output(T, H, m.v_head_dim, q.dtype, q.device))
    packed = getattr(cache, "packed", None)
    if packed is not None:
        attend = _per_sequence(packed, q_nope, q_pe, w, s, sc)
    o = cache.attend_latent(layer, c, k_pe, attend)
    return matmul_into(o.reshape(T, H * m.v_head_dim), w.wo, out)


def _per_sequence(packed, q_nope, q_pe, w: MLAWeights, s, scratch):
    """attend_latent's `attend` for packed sequences (an empty cache: no prefix, the run is the
    chunk): each sequence's queries over its own keys, one mla_chunk_attention call each (the
    blocked kernels take no block-diagonal mask; the sequences' rows are disjoint, so the calls
    write their own rows of one output)."""
    def attend(prefix, c_run, kpe_run, c_scale, kpe_scale):
        if prefix or c_run.shape[0] != q_nope.shape[1]:
            raise StrataError("packed sequences read a chunk with no keys before it")
        T, H = q_nope.shape[1], q_nope.shape[0]
        o = torch.empty(T, H, s.mla.v_head_dim, dtype=q_nope.dtype, device=q_nope.device)
        for a, b in packed.bounds:
            cut = slice(a, b)
            mla_chunk_attention(q_nope[:, cut], q_pe[:, cut], c_run[cut], kpe_run[cut], w.wkvb,
                                v_head_dim=s.mla.v_head_dim, scale=softmax_scale(s),
                                scratch=scratch, out=o[cut],
                                c_scale=None if c_scale is None else c_scale[cut],
                                k_pe_scale=None if kpe_scale is None else kpe_scale[cut])
        return o
    return attend
