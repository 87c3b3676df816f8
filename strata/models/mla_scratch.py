"""The VRAM MLA's expanded attention works in on CUDA (strata.models.mla), and its one count.

Legend: T chunk tokens, P cached tokens, S = P + T keys, H heads, hd = N + R q/k head width,
Hv value head width, B the block (MLA_BLOCK).

    k      [rows, H, hd]    one key block decompressed (c Wuk^T | k_pe), head-major per block
    v      [rows, H, Hv]    its values c Wuv^T (flash: [H, rows, W], W = max(hd, Hv), the
                            columns Hv.. zero: values padded to the q/k width)
    state  fp32 [qrows, H·(Hv + 1)]   a query block's merged output (acc [H, n, Hv], kept
                                      normalized) and its log-sum-exp (lse [H, n])
    c      [rows, Lkv + R]  int8 KV: the block's latent and rope key dequantized; a host-held
                            window (bf16 too): a block spanning two segments gathered
    rows = min(B, S)   qrows = min(B, T)

The attention goes a query block of (at most) B tokens at a time; for each it decompresses the
keys it sees a block of B at a time, attends them (one fused launch a block), and merges the
blocks by their log-sum-exp in fp32. The last key block of a query block ends at its last
query's own key and holds min(B, P + t1) keys, so every launch's rows are at most min(B, S),
and the last chunk of a prompt uses exactly that many: `mla_scratch_rows(T, S)` is both what the
plan carves and what the launcher needs, for any (T, S).

At DeepSeek-V3's widths (H 128, hd 192, Hv 128) and B = 4096, the flash backend's launch: k 201
MB, v 201 MB (192 wide; 134 MB at Hv for the others), state 271 MB at a chunk of 4096 tokens or
more (the efficient backend at B = 2048: k + v 168 MB, state 135 MB), where all keys at once
(the old transient) took S·81,920 B, 2.7 GB at S = 32K. A smaller block launches and merges
more and re-decompresses the prefix once per query block (ceil(T / B) times); a larger one grows
the carve. B = 4096 against 2048 read a 5-layer DeepSeek-V3 8% faster at T = 32768 on the H100
(strata.models.mla_launch). strata.planning counts these buffers (mla_k, mla_v, mla_state) in
the layout's attention phase from this module.

B and the kernel are the launch in force (strata.models.mla_launch: MLALaunch(backend, block),
pinnable). The flash backend keeps v at W = max(hd, Hv) columns a head, laid out [H, rows, W]
whatever the block's m (a block is the first m rows of each head), so the zero columns Hv..W-1
stay where they are from block to block: zeroed once a call (the attention phase's bytes are
the experts' between layers), never per block. `mla_value_width` is that width, for the plan
and the launcher alike.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from strata.errors import StrataError
from strata.models.layers import buf_view
from strata.models.mla_launch import MLA_BLOCK, key_rows, mla_launch


def mla_scratch_rows(T: int, S: int, block: int | None = None) -> tuple[int, int]:
    """(key rows, query rows) of scratch a chunk of T tokens over S keys works in (block:
    the launch's in force when None; its key_block, strata.models.mla_launch.key_rows). The
    key rows are the plain tiling's largest block (strata.models.mla_attend.key_blocks), or the
    cudnn backend's key_block; its square tiling takes no more, the same from S > key rows."""
    block = mla_launch().block if block is None else block
    return min(key_rows(block), S), min(block, T)


def mla_value_width(hd: int, Hv: int, backend: str | None = None) -> int:
    """Values a head a key's v takes in the scratch: Hv (efficient, triton), or for the flash
    backend max(hd, Hv) (the values zero-padded to the q/k width); backend: the launch's in force
    when None."""
    backend = mla_launch().backend if backend is None else backend
    return max(hd, Hv) if backend == "flash" else Hv


def mla_state_floats(n_head: int, v_head_dim: int) -> int:
    """fp32 values of carried state per query row: acc (H·Hv) and lse (H)."""
    return n_head * (v_head_dim + 1)


@dataclass(frozen=True)
class MLAScratch:
    """Flat buffers: k (>= rows·H·hd values), v (>= rows·H·W, W = mla_value_width(hd, Hv)),
    state fp32 (>= qrows·mla_state_floats(H, Hv)), c (int8 KV or a prefix of segments:
    >= rows·(Lkv + R)); k, v and c in the attention's dtype. In the engine also the chunk's
    query and output (`q`, `o`: the carve's q and attn, T·QD values each, QD = H·max(hd, Hv)),
    which the layer computes into instead of allocating them beside the plan (`query`,
    `output`), and the carve's k and v (`lat`, `lat_norm`, T·(Lkv + R) values each: the
    plan's KVD for MLA, strata.planning.dims_for) for its latent projections: the compressed
    query and its norm in o's bytes before the output lands there (`q_a`), x Wkva^T in lat (`kv_proj`, its
    rope key rotated where it lies) and the normed latent c in lat_norm (`c_out`); none of
    them part of `nbytes`, which is the mla_* buffers'. `block`: the attention block
    the carve sized them for (the plan's, strata.planning.mla_dims' MB), which the attention
    runs at; None: the launch's."""
    k: torch.Tensor
    v: torch.Tensor
    state: torch.Tensor
    c: torch.Tensor | None = None
    q: torch.Tensor | None = None
    o: torch.Tensor | None = None
    block: int | None = None
    lat: torch.Tensor | None = None
    lat_norm: torch.Tensor | None = None

    @classmethod
    def of(cls, H: int, hd: int, Hv: int, T: int, S: int, device, *,
           dtype: torch.dtype = torch.bfloat16, block: int | None = None,
           latent: int = 0, backend: str | None = None) -> "MLAScratch":
        """Fresh scratch of exactly what (T, S) needs (tests, benchmarks, a launch given none);
        latent = Lkv + R adds the int8 KV's dequantization rows; block and backend: the
        launch's in force when None."""
        rows, qrows = mla_scratch_rows(T, S, block)
        mk = dict(dtype=dtype, device=device)
        vw = mla_value_width(hd, Hv, backend)
        return cls(torch.empty(rows * H * hd, **mk), torch.empty(rows * H * vw, **mk),
                   torch.empty(qrows * mla_state_floats(H, Hv), dtype=torch.float32,
                               device=device),
                   torch.empty(rows * latent, **mk) if latent else None)

    @classmethod
    def of_carve(cls, bufs) -> "MLAScratch":
        """Over a carve's mla_k / mla_v / mla_state (/ mla_c) buffers
        (strata.planning.MLA_SCRATCH_BUFS, MLA_LATENT_BUF), and its q and attn (the
        attention phase's query and output, strata.planning.ACTIVATIONS), at the block the
        carve sized them for (its dims' MB)."""
        c, q, o, k, v = (bufs.bufs.get(n) for n in ("mla_c", "q", "attn", "k", "v"))
        return cls(*(bufs[n].reshape(-1) for n in ("mla_k", "mla_v", "mla_state")),
                   *(None if t is None else t.reshape(-1) for t in (c, q, o)),
                   block=bufs.dims.get("MB"),
                   lat=None if k is None else k.reshape(-1),
                   lat_norm=None if v is None else v.reshape(-1))

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.k, self.v, self.state, self.c)
                   if t is not None)

    def check(self, H: int, hd: int, Hv: int, T: int, S: int, dtype: torch.dtype,
              block: int | None = None, latent: int = 0, backend: str | None = None) -> None:
        block = mla_launch().block if block is None else block
        rows, qrows = mla_scratch_rows(T, S, block)
        vw = mla_value_width(hd, Hv, backend)
        need = (rows * H * hd, rows * H * vw, qrows * mla_state_floats(H, Hv), rows * latent)
        have = (self.k.numel(), self.v.numel(), self.state.numel(),
                0 if self.c is None else self.c.numel())
        if any(h < n for h, n in zip(have, need)) or self.k.dtype != dtype or \
                self.v.dtype != dtype or self.state.dtype != torch.float32 or \
                (latent and self.c.dtype != dtype):
            raise StrataError(f"MLA scratch too small or of the wrong dtype for T={T}, S={S}, "
                              f"H={H}, hd={hd}, Hv={Hv} (v {vw} wide), block={block}, "
                              f"latent={latent}: needs "
                              f"k, v, state, c of {need} values ({dtype}, {dtype}, float32, "
                              f"{dtype}), has {have} ({self.k.dtype}, {self.v.dtype}, "
                              f"{self.state.dtype}, {None if self.c is None else self.c.dtype})")

    def query(self, T: int, width: int, dtype: torch.dtype, device) -> torch.Tensor | None:
        """[T, width] over `q` for the chunk's query projection, or None (no such buffer, too
        small, another dtype or device: the carve holds bf16, a CPU read's fp32 allocates its
        own; strata.models.layers.buf_view)."""
        return buf_view(self.q, (T, width), dtype, device)

    def output(self, T: int, H: int, Hv: int, dtype: torch.dtype, device
               ) -> torch.Tensor | None:
        """[T, H, Hv] over `o` for the attention's output, or None (as `query`)."""
        return buf_view(self.o, (T, H, Hv), dtype, device)

    def q_a(self, T: int, q_lora: int, dtype: torch.dtype, device
            ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """([T, Lq], [T, Lq]) over `o`'s first 2·T·Lq values: the compressed query and its
        norm (dead before the attention's output lands there), or (None, None) (as `query`)."""
        if self.o is None:
            return None, None
        n = T * q_lora
        return (buf_view(self.o, (T, q_lora), dtype, device),
                buf_view(self.o[n:], (T, q_lora), dtype, device))

    def kv_proj(self, T: int, width: int, dtype: torch.dtype, device) -> torch.Tensor | None:
        """[T, Lkv + R] over `lat` for x Wkva^T, or None (as `query`)."""
        return buf_view(self.lat, (T, width), dtype, device)

    def c_out(self, T: int, kv_lora: int, dtype: torch.dtype, device) -> torch.Tensor | None:
        """[T, Lkv] over `lat_norm` for the normed latent c, or None (as `query`)."""
        return buf_view(self.lat_norm, (T, kv_lora), dtype, device)

    def latent(self, m: int, width: int) -> torch.Tensor:
        """c [m, Lkv + R] view: a block's dequantized latent and rope key."""
        return self.c[:m * width].view(m, width)

    def gathered(self, m: int, kv_lora: int, rope: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(c [m, Lkv], k_pe [m, R]) contiguous views over the c rows: a bf16 block of keys
        gathered from two segments, laid out as one run's rows are."""
        return (self.c[:m * kv_lora].view(m, kv_lora),
                self.c[m * kv_lora:m * (kv_lora + rope)].view(m, rope))

    def kv(self, m: int, H: int, hd: int, Hv: int,
           rows: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(k [H, m, hd], v [H, m, Hv]) views of a block of m keys: contiguous; with `rows`
        (the flash layout, Hv there the padded width W) v is the first m rows of each head of
        [H, rows, W], the same columns for every block."""
        k = self.k[:H * m * hd].view(H, m, hd)
        if rows is None:
            return k, self.v[:H * m * Hv].view(H, m, Hv)
        return k, self.padded(rows, H, Hv)[:, :m]

    def padded(self, rows: int, H: int, width: int) -> torch.Tensor:
        """v [H, rows, width]: the flash layout's values of every block of a call."""
        return self.v[:H * rows * width].view(H, rows, width)

    def carried(self, n: int, H: int, Hv: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(acc fp32 [H, n, Hv], lse fp32 [H, n]) views for a query block of n tokens."""
        return (self.state[:H * n * Hv].view(H, n, Hv),
                self.state[H * n * Hv:n * mla_state_floats(H, Hv)].view(H, n))


__all__ = ["MLA_BLOCK", "MLAScratch", "mla_scratch_rows", "mla_state_floats",
           "mla_value_width"]
