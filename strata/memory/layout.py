"""The prompt path's buffers for a chunk of T tokens, described once as data.

The carve EXECUTES this description (`PromptLayout.carve`) and `bytes_needed(T, ring)` READS it by
running the same code on a dry carve: one source, never a second hand-kept count (seed #583's bug
was exactly such a count, T*(D-HC)*4 bytes off the carve).

Order in the loan (each buffer 256-byte aligned):

    ring       uint8 [ring, align256(max_blob)]  streamed expert slots
    persistent buffers (live through every layer of the chunk)
    union of phases (attention, then feed-forward: never alive together, so they share bytes)

Legend: T tokens, D hidden, E experts, K top-k, F expert width, QD = H*hd (query width),
KVD = Hkv*hd (key/value width), TK = T*K routed (token, expert) pairs,
TKP = T*K + min(E, T*K)*(BM-1) routed pairs after padding each routed expert's group to a
multiple of BM rows, BM the expert GEMM's BLOCK_M for the chunk (strata.kernels.tiles.block_m_for;
a launch over fewer tokens picks no larger one; a pinned taller tile is refused by the GEMM's
workspace check),
E1 = E + 1 (group offsets with an end marker).

bytes_needed is ring*stride + sum(T * c_i) + max over phases of sum(T * c_j) + constant padding
(+ alignment rounding), every c positive: monotone in T.

To add a buffer, add a `Buf` to ACTIVATIONS (or pass a LayoutSpec of your own): the carve, the
scan, `strata plan` and the tests all follow.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from strata.errors import StrataError
from strata.kernels.tiles import block_m_for
from strata.memory.carve import Carve, Placement, align_up
from strata.shapes import ModelShape



@dataclass(frozen=True)
class Buf:
    """One buffer: a name the engine looks it up by, a dtype, and symbolic dims (see legend)."""
    name: str
    dtype: torch.dtype
    dims: tuple[str, ...]
    doc: str = ""


@dataclass(frozen=True)
class Phase:
    name: str
    bufs: tuple[Buf, ...]


@dataclass(frozen=True)
class LayoutSpec:
    persistent: tuple[Buf, ...]
    phases: tuple[Phase, ...]

    def names(self) -> list[str]:
        return [b.name for b in self.persistent] + [b.name for p in self.phases for b in p.bufs]

    def with_buffer(self, buf: Buf, phase: str | None = None) -> "LayoutSpec":
        """This spec plus `buf` (persistent, or appended to the named phase)."""
        if buf.name in self.names() or buf.name == "ring":
            raise StrataError(f"layout already has a buffer named {buf.name!r}")
        if phase is None:
            return replace(self, persistent=self.persistent + (buf,))
        if phase not in [p.name for p in self.phases]:
            return replace(self, phases=self.phases + (Phase(phase, (buf,)),))
        return replace(self, phases=tuple(replace(p, bufs=p.bufs + (buf,)) if p.name == phase
                                          else p for p in self.phases))


bf16, f32, i32 = torch.bfloat16, torch.float32, torch.int32

ACTIVATIONS = LayoutSpec(
    persistent=(
        Buf("x", bf16, ("T", "D"), "residual stream, carried from layer to layer"),
        Buf("xn", bf16, ("T", "D"), "RMS-normed input of the current block"),
    ),
    phases=(
        Phase("attention", (
            Buf("q", bf16, ("T", "QD"), "queries (q-norm and RoPE applied in place)"),
            Buf("k", bf16, ("T", "KVD"), "this chunk's keys, before they join the KV cache"),
            Buf("v", bf16, ("T", "KVD"), "this chunk's values"),
            Buf("attn", bf16, ("T", "QD"), "attention output; the o projection adds into x in place"),
        )),
        Phase("moe", (
            Buf("router_logits", f32, ("T", "E"), "router logits, fp32 for a stable softmax"),
            Buf("topk_ids", i32, ("T", "K"), "chosen experts per token"),
            Buf("topk_weights", f32, ("T", "K"), "their (renormalized) routing weights"),
            Buf("sorted_token", i32, ("TKP",), "(token*K + k) ids grouped by expert, BM-padded"),
            Buf("expert_offsets", i32, ("E1",), "start of each expert's group in sorted_token"),
            Buf("h", bf16, ("TKP", "F"), "expert intermediate silu(gate x) * up x, BM-padded rows"),
            Buf("yk", f32, ("TK", "D"), "down projection per routed pair, weighted, before the "
                                       "sum over K"),
            Buf("moe_out", f32, ("T", "D"), "expert output accumulated in fp32 over the passes"),
        )),
    ),
)


def pass_experts(ring: int, batch: int | None = None) -> int:
    """G: the most experts one pass of the expert FFN reads (the streaming provider's batch:
    `batch`, default half the ring, so the next batch's copies land while this one computes)."""
    return max(1, min(batch or max(1, ring // 2), max(ring, 1)))


def dims_for(shape: ModelShape, T: int, block_m: int | None = None, ring: int = 0,
             batch: int | None = None) -> dict[str, int]:
    """Values of the layout's symbols for a chunk of T tokens. TKP pads each of the (at most
    min(E, T*K)) routed experts' groups to `block_m` rows (default: the expert GEMM's BLOCK_M
    for this chunk); monotone in T, as BLOCK_M only grows with T."""
    E, K = shape.n_expert, shape.top_k
    bm = block_m if block_m is not None else block_m_for(T, K, E)
    return {"T": T, "D": shape.d_model, "E": E, "E1": E + 1, "K": K, "F": shape.d_expert,
            "QD": shape.n_head * shape.head_dim, "KVD": shape.n_kv_head * shape.head_dim,
            "TK": T * K, "TKP": T * K + min(E, T * K) * (bm - 1),
            "G": pass_experts(ring, batch), "BB": 3 * shape.d_model * shape.d_expert * 2}


# The "decoded" expert FFN's buffer: one pass's experts decoded to bf16 (G x BB bytes). Engines
# whose FFN may decode add it to their layout: ACTIVATIONS.with_buffer(DECODE_BUF, "moe").
DECODE_BUF = Buf("wdec", torch.uint8, ("G", "BB"), "a pass's experts decoded to bf16 blobs")


@dataclass
class PromptBuffers:
    """What a carve of the layout hands the engine: ring slots and activation views by name."""
    ring: torch.Tensor | None           # uint8 [ring, stride]; slot i is ring[i]
    bufs: dict[str, torch.Tensor | None]
    placements: list[Placement] = field(default_factory=list)
    stop: int = 0

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.bufs[name]


@dataclass(frozen=True)
class PromptLayout:
    """The prompt path's layout for one model shape and ring slot size."""
    shape: ModelShape
    max_blob: int
    spec: LayoutSpec = ACTIVATIONS
    block_m: int | None = None    # None: the expert GEMM's BLOCK_M for each chunk size
    batch: int | None = None      # experts per streamed pass (None: ring // 2; see pass_experts)

    @property
    def slot_stride(self) -> int:
        """Bytes between ring slots: max_blob rounded up to the carve's alignment."""
        return align_up(self.max_blob)

    def carve(self, carve: Carve, T: int, ring: int) -> PromptBuffers:
        """Lay the buffers for T tokens and `ring` slots out on `carve` (the one executor)."""
        if T < 1 or ring < 0:
            raise StrataError(f"a chunk needs T >= 1 tokens and ring >= 0 slots, got T={T}, "
                              f"ring={ring}")
        dims = dims_for(self.shape, T, self.block_m, ring, self.batch)
        ring_view = carve.take("ring", torch.uint8, (ring, self.slot_stride))
        bufs: dict[str, torch.Tensor | None] = {}

        def take(b: Buf):
            bufs[b.name] = carve.take(b.name, b.dtype, tuple(dims[d] for d in b.dims))

        for b in self.spec.persistent:
            take(b)
        with carve.union() as u:
            for ph in self.spec.phases:
                with u.phase():
                    for b in ph.bufs:
                        take(b)
        return PromptBuffers(ring_view, bufs, list(carve.placements), carve.stop)

    def placements(self, T: int, ring: int) -> list[Placement]:
        c = Carve.dry()
        self.carve(c, T, ring)
        return c.placements

    def bytes_needed(self, T: int, ring: int) -> int:
        """Bytes of the loan a chunk of T tokens with `ring` slots uses: the dry carve's stop."""
        c = Carve.dry()
        self.carve(c, T, ring)
        return c.stop

    def ring_bytes(self, ring: int) -> int:
        """Bytes of the ring region, read from the same layout."""
        return next(p.nbytes for p in self.placements(1, ring) if p.name == "ring")
