"""Bytes of a Gated DeltaNet layer's prompt-path memory, as pure functions of the shape numbers,
so the planner counts them without touching a tensor.

Legend: T tokens of one call, Hk key heads, Hv value heads (Hk divides Hv), dk / dv head dims,
K the conv kernel width (4), BT the chunk (64), C = 2 Hk dk + Hv dv the conv channels.

    recurrent state (per layer, kept across calls):  conv [K-1, C] in the activations' dtype
                                                     + S [Hv, dk, dv] fp32
    chunk scratch (one call of chunk_gated_delta_rule over T tokens, freed on return):
        g_cum [T, Hv] fp32, w [T, Hv, dk] fp32, u [T, Hv, dv] fp32
        (+ qn, kn [T, Hk, dk] fp32 when the launcher L2-normalises q and k itself)
        (+ oi [T, Hv, dv] fp32 when the launch is split: strata.kernels.deltanet.launch)

`chunk_buffers` is the list the launcher allocates from (strata.kernels.deltanet.chunk), so the
count here and the tensors the kernel creates are one source (tests/kernels/test_deltanet_parts.py
measures them).
"""
from __future__ import annotations

from dataclasses import dataclass

from strata.errors import StrataError

STATE_ITEMSIZE = 4      # the recurrent matrix and every chunk intermediate are fp32
CHUNK = 64


@dataclass(frozen=True)
class Buffer:
    """One fp32 tensor of the chunk's scratch: its name and shape."""
    name: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        n = STATE_ITEMSIZE
        for s in self.shape:
            n *= s
        return n


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
                  qk_l2norm: bool = False, split: bool = False) -> tuple[Buffer, ...]:
    """The scratch one chunk_gated_delta_rule call over T tokens allocates (outputs aside);
    `split`: the launch's (strata.kernels.deltanet.launch.delta_launch().split)."""
    _check(h_k, h_v, d_k, d_v)
    if not isinstance(T, int) or T < 0:
        raise StrataError(f"deltanet sizes: T must be an int >= 0, got {T!r}")
    bufs = [Buffer("g_cum", (T, h_v)), Buffer("w", (T, h_v, d_k)), Buffer("u", (T, h_v, d_v))]
    if qk_l2norm:
        bufs += [Buffer("qn", (T, h_k, d_k)), Buffer("kn", (T, h_k, d_k))]
    if split:
        bufs.append(Buffer("oi", (T, h_v, d_v)))
    return tuple(bufs)


def chunk_scratch_bytes(T: int, h_k: int, h_v: int, d_k: int, d_v: int, *,
                        qk_l2norm: bool = False, split: bool = False) -> int:
    """Bytes of chunk_buffers: what a prompt chunk of T tokens needs beside the layer's input,
    output and state while its DeltaNet layer runs."""
    return sum(b.nbytes for b in chunk_buffers(T, h_k, h_v, d_k, d_v, qk_l2norm=qk_l2norm,
                                               split=split))
