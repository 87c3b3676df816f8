"""The gated delta rule through fla-core's Triton kernels (flash-linear-attention, pinned 0.6.0),
launched by strata on buffers strata hands in, so the planner's count is the only count.

Legend: T tokens, Hk key heads, Hv value heads (Hk divides Hv: fla reads grouped value heads
natively), dk / dv head dims, BT = 64 the chunk, NT = ceil(T / BT).

    chunk_gated_delta_rule_fla(q, k [T, Hk, dk], v [T, Hv, dv], g, beta [T, Hv],
                               initial_state [Hv, dk, dv] fp32 | None, *, scale, use_qk_l2norm,
                               chunk_size, out_state, scratch) -> (o [T, Hv, dv] in v's dtype,
                                                                   final state [Hv, dk, dv] fp32)

The signature is strata's own launcher's (strata.kernels.deltanet.chunk), whose twin and
reference are strata.kernels.deltanet.naive. Five launches, the forward fla-core's
chunk_gated_delta_rule runs, each on a buffer of sizes.fla_buffers: the chunk-local cumsum of
g in log2 units (g_cum, fp32), the fused beta k k^T + triangular solve (A [T, Hv, BT]), the WY
pair (w [T, Hv, dk], u [T, Hv, dv]), the scan over chunks writing each chunk's entry state
(h [NT, Hv, dk, dv]) and v_new [T, Hv, dv], and the output. A, w, u, h, v_new (and qn, kn, the
L2-normed q and k) are in the activations' dtype, as fla keeps them; the state is fp32 and
goes through its own buffer ht before out_state (fla's autotuner reruns the scan on its first
call of a shape, so the scan must not overwrite the state it reads). fla's dots on bf16
operands round as bf16 tensor-core products do: the state drifts ~4e-3 from the fp64
recurrence at Qwen3.5's heads where strata's kernel keeps 1e-6
(experiments/results/deltanet_fla-*), and it runs 8x faster at T 32768 on the H100.

fla-core is an optional dependency (`pip install 'strata[fla]'`); without it the call says so
in one line. Under TRITON_INTERPRET=1 two things fla assumes of a GPU are met for its kernels
only: its autotuners keep their first config (the interpreter has nothing to time), and the
loop counter of a `range` over a scalar argument is a Triton scalar (the interpreter hands a
Python int, on which fla's `.to(tl.int64)` fails). Nothing else of fla is changed.
"""
from __future__ import annotations

import builtins
import functools
import os
import warnings

import torch
import triton

from strata.errors import StrataError
from strata.kernels.deltanet.buffers import launch_dims, take_buffer
from strata.kernels.deltanet.fla_import import lean_kernel_modules
from strata.kernels.deltanet.norms import l2norm
from strata.kernels.deltanet.outs import output_buffer
from strata.kernels.deltanet.sizes import CHUNK, fla_buffers

# the release strata launches and tests: its kernels' arguments are fla-core internals, so
# another release may name them otherwise (pyproject's strata[fla] pins the same one)
FLA_VERSION = "0.6.0"
# the modules of the five kernels, imported without the rest of fla (strata.kernels.deltanet
# .fla_import): the scan, the output, the fused kkt solve, the WY pair, the chunk cumsum
KERNEL_MODULES = ("fla.ops.common.chunk_delta_h", "fla.ops.common.chunk_o",
                  "fla.ops.gated_delta_rule.chunk_fwd", "fla.ops.gated_delta_rule.wy_fast",
                  "fla.ops.utils.cumsum")
RCP_LN2 = 1.4426950216       # fla's kernels decay with exp2: g_cum is in log2 units


def fla_version() -> str | None:
    """The installed fla-core's version (its metadata; no import), None where it is absent."""
    try:
        import importlib.metadata as md
        return md.version("fla-core")
    except Exception:                                           # noqa: BLE001
        return None


@functools.cache
def fla_kernels():
    """fla-core's five forward kernels, or a one-line StrataError where it is not installed."""
    version = fla_version()
    if version != FLA_VERSION:
        have = f"fla-core {version} is installed" if version else "fla-core is not installed"
        raise StrataError(f"the delta rule's fla backend launches fla-core {FLA_VERSION} and "
                          f"{have}: pip install 'strata[fla]', or pin backend=strata")
    with warnings.catch_warnings():         # its import warns where Triton has no GPU driver
        warnings.simplefilter("ignore")
        h, o, fwd, wy, cumsum = lean_kernel_modules(KERNEL_MODULES, FLA_VERSION)
    ks = dict(cumsum=cumsum.chunk_local_cumsum_scalar_kernel,
              solve=fwd.chunk_gated_delta_rule_fwd_kkt_solve_kernel,
              wy=wy.recompute_w_u_fwd_kernel,
              scan=h.chunk_gated_delta_rule_fwd_kernel_h_blockdim64, out=o.chunk_fwd_kernel_o)
    from strata.config import tune_cache
    for k in ks.values():
        if os.environ.get("TRITON_INTERPRET") == "1":
            _interpretable(k)
        elif tune_cache():
            _tuned_on_disk(k)
    return ks


def _autotuners(kernel):
    """The Autotuners in `kernel`'s chain of wrappers (heuristics, autotune, jit)."""
    from triton.runtime.autotuner import Autotuner
    node = kernel
    while node is not None:
        if isinstance(node, Autotuner):
            yield node
        node = getattr(node, "fn", None)


def _tuned_on_disk(kernel) -> None:
    """Each autotuner of `kernel` keeps its timings in Triton's cache (as Triton's own
    TRITON_CACHE_AUTOTUNING does, for these kernels only): a fresh process's first prompt reads
    the choice instead of timing every config again (STRATA_TUNE_CACHE=0: time anew)."""
    for node in _autotuners(kernel):
        node.cache_results = True


def _interpreter_range(*args):
    """`range` for fla's kernel modules under the interpreter: Triton scalars as counters."""
    from triton.runtime.interpreter import _implicit_cvt
    ends = [int(a.handle.data.item()) if hasattr(a, "handle") else int(a) for a in args]
    for i in builtins.range(*ends):
        yield _implicit_cvt(i)


def _interpretable(kernel) -> None:
    """Under the interpreter: each autotuner of `kernel` keeps its first config, and the module
    its Triton function lives in sees _interpreter_range as `range`."""
    for node in _autotuners(kernel):
        node.configs = node.configs[:1]
    node = kernel
    while node is not None:
        if isinstance(getattr(node, "fn", None), type(lambda: 0)):
            node.fn.__globals__["range"] = _interpreter_range
        node = getattr(node, "fn", None)


def chunk_gated_delta_rule_fla(q, k, v, g, beta, initial_state=None, *, scale=None,
                               use_qk_l2norm: bool = False, chunk_size: int = CHUNK,
                               out_state=None, scratch=None, out=None):
    """The chunked gated delta rule on fla-core's kernels (the module docstring)."""
    T, Hk, dk, Hv, dv = launch_dims(q, k, v, g, beta, initial_state, out_state, chunk_size,
                                    "chunk_gated_delta_rule_fla")
    K = fla_kernels()
    act = v.dtype
    bufs = {b.name: take_buffer(scratch, b, q.device, "chunk_gated_delta_rule_fla")
            for b in fla_buffers(T, Hk, Hv, dk, dv, qk_l2norm=use_qk_l2norm,
                                 itemsize=act.itemsize)}
    if use_qk_l2norm:
        q, k = l2norm(q, out=bufs["qn"]), l2norm(k, out=bufs["kn"])
    q, k, v = (x.to(act).contiguous() for x in (q, k, v))
    g, beta = g.float().contiguous(), beta.contiguous()
    o = output_buffer(out, (T, Hv, dv), act, q.device, "chunk_gated_delta_rule_fla")
    ht = bufs["ht"]
    state = out_state if out_state is not None else torch.empty(
        (Hv, dk, dv), dtype=torch.float32, device=q.device)
    if T == 0:
        state.copy_(initial_state if initial_state is not None else torch.zeros_like(state))
        return o, state
    scale = float(dk ** -0.5 if scale is None else scale)
    BT, NT = chunk_size, triton.cdiv(T, chunk_size)
    heads = dict(H=Hk, HV=Hv, K=dk, BT=BT)
    no_varlen = dict(cu_seqlens=None, chunk_indices=None)
    # q, k, v, g, beta, the outputs: [1, T, ...] as fla's batch of one
    gc, A, w, u, h, vn = (bufs[n] for n in ("g_cum", "A", "w", "u", "h", "v_new"))
    with (torch.cuda.device(q.device) if q.is_cuda else _null()):
        K["cumsum"][(NT * Hv,)](s=g, o=gc, scale=RCP_LN2, T=T, B=1, H=Hv, BT=BT, REVERSE=False,
                                USE_GRAPH=False, **no_varlen)
        A.zero_()       # the solve writes the lower triangle of each chunk's block only
        K["solve"][(NT, Hv)](k=k, g=gc, beta=beta, A=A, T=T, BC=16, **heads, **no_varlen)
        K["wy"][(NT, Hv)](k=k, v=v, beta=beta, w=w, u=u, A=A, g=gc, T=T, V=dv, BK=64, BV=64,
                          **heads, **no_varlen)
        K["scan"][lambda meta: (triton.cdiv(dv, meta["BV"]) * Hv,)](
            k=k, v=u, w=w, v_new=vn, g=gc, gk=None, h=h, h0=initial_state, ht=ht,
            cu_seqlens=None, chunk_offsets=None, T=T, V=dv, STATE_V_FIRST=False, **heads)
        K["out"][lambda meta: (triton.cdiv(dv, meta["BV"]) * NT, Hv)](
            q=q, k=k, v=vn, h=h, g=gc, g_gamma=None, o=o, scale=scale, T=T, V=dv,
            STATE_V_FIRST=False, **heads, **no_varlen)
        state.copy_(ht)
    return o, state


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
