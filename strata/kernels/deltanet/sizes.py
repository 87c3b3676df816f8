"""Bytes of a Gated DeltaNet layer's prompt-path memory, as pure functions of the shape numbers,
so the planner counts them without touching a tensor.

Legend: T tokens of one call, Hk key heads, Hv value heads (Hk divides Hv), dk / dv head dims,
K the conv kernel width (4), BT the chunk (64), C = 2 Hk dk + Hv dv the conv channels.

    recurrent state (per layer, kept across calls):  conv [K-1, C] in the activations' dtype
                                                     + S [Hv, dk, dv] fp32
    chunk scratch (one call of chunk_gated_delta_rule over T tokens, freed on return), by the
    launch's backend (strata.kernels.deltanet.launch):
      strata: g_cum [T, Hv] fp32, w [T, Hv, dk] fp32, u [T, Hv, dv] fp32
              (+ qn, kn [T, Hk, dk] fp32 when the launcher L2-normalises q and k itself)
              (+ oi [T, Hv, dv] fp32 when the launch is split)
      fla:    g_cum [T, Hv] fp32, A [T, Hv, BT], w [T, Hv, dk], u and v_new [T, Hv, dv],
              h [NT, Hv, dk, dv] (NT = ceil(T / BT): each chunk's entry state), in the
              activations' dtype (itemsize bytes), ht [Hv, dk, dv] fp32 (its final state)
              (+ qn, kn [T, Hk, dk] in the activations' dtype with the L2 norm)

`chunk_buffers` is the list the launchers allocate from (strata.kernels.deltanet.chunk and
.fla_rule), so the count here and the tensors the kernels create are one source
(tests/kernels/test_deltanet_parts.py and test_deltanet_fla.py measure them). Each buffer names
the layout symbol its leading dim counts (rows): T tokens, TC chunks, or 1 (a fixed size).
"""
from __future__ import annotations

from dataclasses import dataclass

from strata.errors import StrataError

STATE_ITEMSIZE = 4      # the recurrent matrix and every chunk intermediate are fp32
CHUNK = 64


ITEMSIZES = {4: "float32", 2: "bfloat16"}   # the activations' dtypes a buffer may take


@dataclass(frozen=True)
class Buffer:
    """One tensor of the chunk's scratch: its name, shape, bytes an element (4: fp32, 2: the
    activations' bf16) and the layout symbol of its leading dim (T, TC or 1)."""
    name: str
    shape: tuple[int, ...]
    itemsize: int = STATE_ITEMSIZE
    rows: str = "T"

    @property
    def nbytes(self) -> int:
        n = self.itemsize
        for s in self.shape:
            n *= s
        return n

    @property
    def row_bytes(self) -> int:
        """Bytes of one unit of `rows` (the layout's width of this buffer)."""
        n = self.itemsize
        for s in self.shape[1:]:
            n *= s
        return n if self.rows != "1" else self.nbytes

    @property
    def torch_dtype(self):
        import torch
        return getattr(torch, ITEMSIZES[self.itemsize])


def _check(h_k: int, h_v: int, d_k: int, d_v: int) -> None:
    for name, v in (("h_k", h_k), ("h_v", h_v), ("d_k", d_k), ("d_v", d_v)):
        if not isinstance(v, int) or v < 1:
            raise StrataError(f"deltanet sizes: {name} must be a positive int, got {v!r}")
    if h_v % h_k:
        raise StrataError(f"deltanet sizes: h_v ({h_v}) must be a multiple of h_k ({h_k})")


def conv_channels(h_k: int, h_v: int, d_k: int, d_v: int) -> int:
    """C: the channels of the short conv (q, k and v side by side)."""
    return 2 * h_k * d_k + h_v * d_v


def conv_state_bytes(h_k: int, h_v: int, d_k: int, d_v: int, *, conv_kernel: int = 4,
                     itemsize: int = 2) -> int:
    """The conv state [K-1, C] in the activations' dtype (itemsize bytes)."""
    _check(h_k, h_v, d_k, d_v)
    return (conv_kernel - 1) * conv_channels(h_k, h_v, d_k, d_v) * itemsize


def recurrent_state_bytes(h_k: int, h_v: int, d_k: int, d_v: int, *, conv_kernel: int = 4,
                          itemsize: int = 2) -> int:
    """One layer's state carried from call to call: the conv state + S [Hv, dk, dv] fp32."""
    return (conv_state_bytes(h_k, h_v, d_k, d_v, conv_kernel=conv_kernel, itemsize=itemsize)
            + h_v * d_k * d_v * STATE_ITEMSIZE)


def chunk_buffers(T: int, h_k: int, h_v: int, d_k: int, d_v: int, *,
                  qk_l2norm: bool = False, split: bool = False, backend: str = "strata",
                  itemsize: int = 2) -> tuple[Buffer, ...]:
    """The scratch one chunk_gated_delta_rule call over T tokens allocates (outputs aside) for
    the launch in force (strata.kernels.deltanet.launch.delta_launch(): its `split` and
    `backend`); `itemsize`: the activations' bytes an element (fla's buffers take their dtype)."""
    if backend == "fla":
        return fla_buffers(T, h_k, h_v, d_k, d_v, qk_l2norm=qk_l2norm, itemsize=itemsize)
    if backend != "strata":
        raise StrataError(f"deltanet sizes: backend must be strata or fla, got {backend!r}")
    _check(h_k, h_v, d_k, d_v)
    _check_T(T)
    bufs = [Buffer("g_cum", (T, h_v)), Buffer("w", (T, h_v, d_k)), Buffer("u", (T, h_v, d_v))]
    if qk_l2norm:
        bufs += [Buffer("qn", (T, h_k, d_k)), Buffer("kn", (T, h_k, d_k))]
    if split:
        bufs.append(Buffer("oi", (T, h_v, d_v)))
    return tuple(bufs)


def fla_buffers(T: int, h_k: int, h_v: int, d_k: int, d_v: int, *, qk_l2norm: bool = False,
                itemsize: int = 2) -> tuple[Buffer, ...]:
    """The buffers strata.kernels.deltanet.fla_rule hands fla-core's five kernels for T tokens
    (the module docstring's list), in the activations' dtype of `itemsize` bytes."""
    _check(h_k, h_v, d_k, d_v)
    _check_T(T)
    if itemsize not in ITEMSIZES:
        raise StrataError(f"deltanet sizes: itemsize must be 4 or 2, got {itemsize!r}")
    n_chunks = -(-T // CHUNK)
    a = itemsize
    bufs = [Buffer("g_cum", (T, h_v)), Buffer("A", (T, h_v, CHUNK), a),
            Buffer("w", (T, h_v, d_k), a), Buffer("u", (T, h_v, d_v), a),
            Buffer("v_new", (T, h_v, d_v), a), Buffer("h", (n_chunks, h_v, d_k, d_v), a, "TC"),
            Buffer("ht", (h_v, d_k, d_v), STATE_ITEMSIZE, "1")]
    if qk_l2norm:
        bufs += [Buffer("qn", (T, h_k, d_k), a), Buffer("kn", (T, h_k, d_k), a)]
    return tuple(bufs)


def _check_T(T) -> None:
    if not isinstance(T, int) or T < 0:
        raise StrataError(f"deltanet sizes: T must be an int >= 0, got {T!r}")


def chunk_scratch_bytes(T: int, h_k: int, h_v: int, d_k: int, d_v: int, *,
                        qk_l2norm: bool = False, split: bool = False, backend: str = "strata",
                        itemsize: int = 2) -> int:
    """Bytes of chunk_buffers: what a prompt chunk of T tokens needs beside the layer's input,
    output and state while its DeltaNet layer runs."""
    return sum(b.nbytes for b in chunk_buffers(T, h_k, h_v, d_k, d_v, qk_l2norm=qk_l2norm,
                                               split=split, backend=backend,
                                               itemsize=itemsize))
