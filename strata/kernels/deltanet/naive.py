"""The gated delta rule in plain torch: the recurrent form (the reference, one token at a time)
and the chunked WY form (the Triton launcher's twin, same signature), both as transformers 5.24's
torch_recurrent_gated_delta_rule / torch_chunk_gated_delta_rule compute them
(models/qwen3_next/modeling_qwen3_next.py), for one sequence.

Legend: T tokens, Hk key heads, Hv value heads (value head h reads key head h // (Hv / Hk),
transformers' repeat_interleave), dk / dv head dims, BT the chunk.

    q, k [T, Hk, dk]   v [T, Hv, dv]   g [T, Hv] (log decay, <= 0)   beta [T, Hv]
    initial_state, final state [Hv, dk, dv] fp32      o [T, Hv, dv] in q's dtype

    q, k <- l2norm(q), l2norm(k)   (use_qk_l2norm)     q <- q * scale  (default dk^-1/2)
    per token t, per head:  S <- S * exp(g_t)
                            S <- S + k_t (beta_t (v_t - S^T k_t))^T
                            o_t = S^T q_t

The chunked form runs the same map 64 tokens at a time: with G = cumsum of g inside the chunk
and A[i, j] = beta_i k_i.k_j exp(G_i - G_j) (i > j), the WY pair w = (I + A)^-1 (beta exp(G) k),
u = (I + A)^-1 (beta v) gives v_new = u - w S, o = (q exp(G)) S + tril(q k^T exp(G_i - G_j)) v_new
and S <- S exp(G_last) + (k exp(G_last - G))^T v_new. Every chunk is computed by the same torch
calls on tensors of the same shapes whatever T is, so a prompt cut at a multiple of BT and
carried through the state gives the one-call result bit for bit on the CPU.
"""
from __future__ import annotations

import torch

from strata.errors import StrataError
from strata.kernels.deltanet.norms import l2norm_torch
from strata.kernels.deltanet.sizes import CHUNK


def check_inputs(q, k, v, g, beta, initial_state, out_state, chunk_size: int, what: str):
    """One line naming what is wrong with the inputs of `what`, raised as a StrataError."""
    def bad(msg):
        raise StrataError(f"{what}: {msg}")
    ts = (q, k, v, g, beta)
    if not all(isinstance(t, torch.Tensor) and t.is_floating_point() for t in ts):
        bad("q, k, v, g, beta must be float tensors")
    if q.dim() != 3 or k.shape != q.shape or v.dim() != 3:
        bad(f"q, k [T, Hk, dk] and v [T, Hv, dv], got q {list(q.shape)} k {list(k.shape)} "
            f"v {list(v.shape)}")
    T, Hk, dk = q.shape
    Hv, dv = v.shape[1:]
    if v.shape[0] != T or Hv % Hk or g.shape != (T, Hv) or beta.shape != (T, Hv):
        bad(f"v [T={T}, Hv, dv] with Hv a multiple of Hk={Hk}, g and beta [T, Hv]; got v "
            f"{list(v.shape)} g {list(g.shape)} beta {list(beta.shape)}")
    for name, s in (("initial_state", initial_state), ("out_state", out_state)):
        if s is not None and (not isinstance(s, torch.Tensor) or s.dtype != torch.float32
                              or s.shape != (Hv, dk, dv) or s.device != q.device):
            bad(f"{name} must be fp32 [{Hv}, {dk}, {dv}] on {q.device}, got "
                f"{getattr(s, 'dtype', type(s).__name__)} {list(getattr(s, 'shape', []))}")
    if len({t.device for t in ts}) != 1:
        bad("q, k, v, g, beta must be on one device")
    if chunk_size != CHUNK:
        bad(f"chunk_size must be {CHUNK}, got {chunk_size}")


def _prepare(q, k, v, g, beta, scale, use_qk_l2norm):
    """fp32, head-major [Hv, T, .] operands with q/k repeated to Hv heads, normed and scaled."""
    Hk, dk = q.shape[1:]
    rep = v.shape[1] // Hk
    qf, kf = q.float(), k.float()
    if use_qk_l2norm:
        qf, kf = l2norm_torch(qf), l2norm_torch(kf)
    qf = qf * (dk ** -0.5 if scale is None else scale)
    qf, kf = (x.repeat_interleave(rep, dim=1).transpose(0, 1) for x in (qf, kf))  # [Hv, T, dk]
    return qf, kf, v.float().transpose(0, 1), g.float().t(), beta.float().t()


def _finish(o, S, out_state, dtype, out=None):
    if out_state is not None:
        out_state.copy_(S)
        S = out_state
    if out is not None:    # the launchers' `out`: o rounded to its dtype, written there
        return out.copy_(o.transpose(0, 1).to(dtype)), S
    return o.transpose(0, 1).to(dtype).contiguous(), S


def recurrent_gated_delta_rule(q, k, v, g, beta, initial_state=None, *, scale=None,
                               use_qk_l2norm: bool = False, chunk_size: int = CHUNK,
                               out_state=None, scratch=None, out=None):
    """The reference: one token at a time (see the module docstring) -> (o, final state).
    `chunk_size` and `scratch` are accepted (and ignored) to keep the chunked form's signature;
    `out_state`, when given, receives the final state (it may be initial_state)."""
    check_inputs(q, k, v, g, beta, initial_state, out_state, chunk_size,
                 "recurrent_gated_delta_rule")
    T = q.shape[0]
    Hv, dk, dv = v.shape[1], q.shape[2], v.shape[2]
    qf, kf, vf, gf, bf = _prepare(q, k, v, g, beta, scale, use_qk_l2norm)
    S = (torch.zeros(Hv, dk, dv, dtype=torch.float32, device=q.device) if initial_state is None
         else initial_state.clone())
    o = torch.zeros(Hv, T, dv, dtype=torch.float32, device=q.device)
    for t in range(T):
        q_t, k_t, v_t = qf[:, t], kf[:, t], vf[:, t]                      # [Hv, d]
        S = S * gf[:, t].exp()[:, None, None]
        kv_mem = (S * k_t[:, :, None]).sum(dim=-2)                           # [Hv, dv]
        delta = (v_t - kv_mem) * bf[:, t, None]
        S = S + k_t[:, :, None] * delta[:, None, :]
        o[:, t] = (S * q_t[:, :, None]).sum(dim=-2)
    return _finish(o, S, out_state, q.dtype, out)


def chunk_gated_delta_rule_torch(q, k, v, g, beta, initial_state=None, *, scale=None,
                                 use_qk_l2norm: bool = False, chunk_size: int = CHUNK,
                                 out_state=None, scratch=None, out=None):
    """The chunked WY form in torch, chunk by chunk (the Triton launcher's twin; `scratch` is
    accepted and ignored: torch allocates its own temporaries)."""
    check_inputs(q, k, v, g, beta, initial_state, out_state, chunk_size,
                 "chunk_gated_delta_rule_torch")
    T = q.shape[0]
    Hv, dk, dv = v.shape[1], q.shape[2], v.shape[2]
    qf, kf, vf, gf, bf = _prepare(q, k, v, g, beta, scale, use_qk_l2norm)
    S = (torch.zeros(Hv, dk, dv, dtype=torch.float32, device=q.device) if initial_state is None
         else initial_state.clone())
    o = torch.zeros(Hv, T, dv, dtype=torch.float32, device=q.device)
    BT = chunk_size
    for s in range(0, T, BT):
        e = min(s + BT, T)
        n = e - s
        qc, kc, vc = qf[:, s:e], kf[:, s:e], vf[:, s:e]                     # [Hv, n, d]
        bc = bf[:, s:e]                                                      # [Hv, n]
        G = gf[:, s:e].cumsum(dim=-1)                                        # [Hv, n]
        upper = torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1)
        decay = (G[:, :, None] - G[:, None, :]).masked_fill(upper, float("-inf")).exp()
        kb = kc * bc[..., None]
        A = (kb @ kc.transpose(-1, -2)) * decay                              # [Hv, n, n]
        u = torch.linalg.solve_triangular(A, vc * bc[..., None], upper=False,
                                          unitriangular=True)                # [Hv, n, dv]
        w = torch.linalg.solve_triangular(A, kb * G.exp()[..., None], upper=False,
                                          unitriangular=True)                # [Hv, n, dk]
        attn = (qc @ kc.transpose(-1, -2)) * decay                           # [Hv, n, n]
        v_new = u - w @ S                                                    # [Hv, n, dv]
        o[:, s:e] = (qc * G.exp()[..., None]) @ S + attn @ v_new
        g_last = G[:, -1:]                                                   # [Hv, 1]
        S = (S * g_last.exp()[..., None]
             + (kc * (g_last - G).exp()[..., None]).transpose(-1, -2) @ v_new)
    return _finish(o, S, out_state, q.dtype, out)
