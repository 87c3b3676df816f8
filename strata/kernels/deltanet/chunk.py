"""The gated delta rule over a prompt chunk in Triton: the chunked WY form (flash-linear-
attention's chunk_gated_delta_rule forward), fp32 state, for one sequence.

Legend: T tokens, Hk key heads, Hv value heads, dk / dv head dims, BT = 64 the chunk.

    chunk_gated_delta_rule(q, k [T, Hk, dk], v [T, Hv, dv], g, beta [T, Hv],
                           initial_state [Hv, dk, dv] fp32 | None, *, scale, use_qk_l2norm,
                           chunk_size, out_state, scratch) -> (o [T, Hv, dv] in q's dtype,
                                                               final state [Hv, dk, dv] fp32)

The math and its twin with the same signature: strata.kernels.deltanet.naive (the recurrent
form is the reference). Two launches (strata.kernels.deltanet._chunk_kernel): the WY pair per
chunk, all chunks in parallel; then the scan over chunks per (value head, dv block) with the
state in registers, writing o as it goes; or, with the launch in force split
(strata.kernels.deltanet.launch), the scan writes v_new and the inter-chunk part and a third
launch adds the intra-chunk part parallel over chunks (the same o). The scratch the call
allocates is exactly sizes.chunk_buffers (g_cum, w, u; qn, kn with use_qk_l2norm; oi when
split), all fp32 and freed on return;
`scratch` (name -> a contiguous tensor holding at least that buffer's bytes on q's device:
the prompt layout's dn_* views, strata.planning.deltanet_bufs) hands some or all of them in,
and the call then allocates only what is missing.
`out_state` receives the final state and may be `initial_state` itself (each program reads its
block of the state before the scan and writes the same block after it). The kernels read rows
of q, k, v, g, beta contiguous; other strides are copied first (outside the counted scratch).

A prompt cut at a multiple of BT runs the same programs on the same rows as one call does, so
two calls carrying the state give the one-call result; a cut inside a chunk moves only
rounding (tests/kernels/test_deltanet_chunk.py holds both).

With the launch's backend "fla" the call is fla-core's kernels on the same arguments
(strata.kernels.deltanet.fla_rule; its buffers are sizes.fla_buffers).
"""
from __future__ import annotations

import contextlib

import torch
import triton

from strata.kernels.deltanet._chunk_kernel import (_gdn_out_fwd_kernel, _gdn_state_fwd_kernel,
                                                   _gdn_wy_fwd_kernel)
from strata.kernels.deltanet.launch import delta_launch
from strata.kernels.deltanet.norms import l2norm
from strata.kernels.deltanet.outs import output_buffer
from strata.kernels.deltanet.buffers import launch_dims, take_buffer
from strata.kernels.deltanet.sizes import CHUNK, chunk_buffers



def _on_device(x: torch.Tensor):
    return torch.cuda.device(x.device) if x.is_cuda else contextlib.nullcontext()


def _rows(x: torch.Tensor) -> torch.Tensor:
    return x if x.is_contiguous() else x.contiguous()


def delta_rule_on(x: torch.Tensor):
    """The delta rule for x's device: on CUDA the Triton launch in force (strata's kernels or
    fla-core's); on the CPU the torch twin (the interpreter would take minutes), unless the
    launch in force is fla's, whose kernels then run in the interpreter (what pinning it asks)."""
    from strata._backend import INTERPRET
    from strata.kernels.deltanet.naive import chunk_gated_delta_rule_torch
    if x.is_cuda or (INTERPRET and delta_launch().backend == "fla"):
        return chunk_gated_delta_rule
    return chunk_gated_delta_rule_torch


def chunk_gated_delta_rule(q, k, v, g, beta, initial_state=None, *, scale=None,
                           use_qk_l2norm: bool = False, chunk_size: int = CHUNK,
                           out_state=None, scratch=None, out=None):
    """The chunked gated delta rule (see the module docstring) -> (o, final state); o into
    `out` where given (a contiguous [T, Hv, dv] in q's dtype: the engine's carve)."""
    T, Hk, dk, Hv, dv = launch_dims(q, k, v, g, beta, initial_state, out_state, chunk_size,
                                    "chunk_gated_delta_rule")
    L = delta_launch()
    if L.resolved(q.element_size()) == "fla":
        from strata.kernels.deltanet.fla_rule import chunk_gated_delta_rule_fla
        return chunk_gated_delta_rule_fla(q, k, v, g, beta, initial_state, scale=scale,
                                          use_qk_l2norm=use_qk_l2norm, chunk_size=chunk_size,
                                          out_state=out_state, scratch=scratch, out=out)
    scratch = {b.name: take_buffer(scratch, b, q.device)
               for b in chunk_buffers(T, Hk, Hv, dk, dv, qk_l2norm=use_qk_l2norm,
                                      split=L.split)}
    o = output_buffer(out, (T, Hv, dv), q.dtype, q.device, "chunk_gated_delta_rule")
    ht = out_state if out_state is not None else torch.empty(
        (Hv, dk, dv), dtype=torch.float32, device=q.device)
    if use_qk_l2norm:
        q, k = l2norm(q, out=scratch["qn"]), l2norm(k, out=scratch["kn"])
    q, k, v, g, beta = (_rows(x) for x in (q, k, v, g, beta))
    BK = max(16, triton.next_power_of_2(dk))
    bv = min(L.bv, max(16, triton.next_power_of_2(dv)))
    dims = dict(HK=Hk, HV=Hv, DK=dk, DV=dv, BT=chunk_size, BK=BK, BV=bv, PREC=L.prec)
    run = dict(num_warps=L.warps, num_stages=L.stages)
    scale = float(dk ** -0.5 if scale is None else scale)
    oi = scratch.get("oi", o)          # unused by the fused scan (SPLIT False)
    with _on_device(q):
        if T:
            _gdn_wy_fwd_kernel[(triton.cdiv(T, chunk_size), Hv)](
                k, v, g, beta, scratch["g_cum"], scratch["w"], scratch["u"], T, **run, **dims)
        h0 = initial_state if initial_state is not None else ht
        _gdn_state_fwd_kernel[(triton.cdiv(dv, bv), Hv)](
            q, k, scratch["w"], scratch["u"], scratch["g_cum"], h0, o, ht, oi, T, scale,
            HAS_H0=initial_state is not None, SPLIT=L.split, **run, **dims)
        if L.split and T:
            _gdn_out_fwd_kernel[(triton.cdiv(T, chunk_size), Hv, triton.cdiv(dv, bv))](
                q, k, scratch["u"], scratch["g_cum"], oi, o, T, scale, **run, **dims)
    return o, ht
