"""Qwen3-Next (`qwen3next`, Qwen3NextForCausalLM) and Qwen3.5-MoE's text model (`qwen35moe`,
Qwen3_5MoeForCausalLM): the MoE decoder (strata.models.moe_decoder) with Gated DeltaNet
linear-attention layers beside gated full-attention ones (ModelShape.linear says which), and a
shared expert behind a sigmoid gate.

Legend: T tokens, D hidden, H query heads, Hkv kv heads, hd head dim, R rotary dims, Hk / Hv
linear key / value heads, dk / dv their head dims, C = 2 Hk dk + Hv dv, K the conv kernel.

Every norm weight of the pack is (1 + w) (HF's zero-centred RMSNorm, as llama.cpp's converter
writes it), except the linear layer's output norm (ssm_norm, a plain weight).
Per layer:
    full:   [q | gate] = Wq xn [T, H, 2 hd] (per head: hd query dims, then hd gate dims)
            q, k = rms(q), rms(Wk xn) per head; NEOX RoPE on dims [0, R); v = Wv xn
            h = x + Wo (attn(q, k, v) * sigmoid(gate))
    linear: mixed = Wqkv xn [T, C]; z = Wgate xn [T, Hv, dv]
            b, a [T, Hv]: Qwen3-Next's ssm_ba (per key head r b's then r a's, r = Hv / Hk) or
            Qwen3.5's ssm_beta / ssm_alpha
            q, k, v = split(silu(conv1d(mixed, carried K-1 inputs)))
            g = ssm_a * softplus(a + dt_bias) (ssm_a = -exp(A_log)), beta = sigmoid(b)
            o = gated delta rule(l2norm(q), l2norm(k), v, g, beta; carried S) [T, Hv, dv]
            h = x + Wout (rms(o) ssm_norm * silu(z))
    x = h + sum_k w_k expert_k(rms(h)) + sigmoid(rms(h) . wsg) shared(rms(h))
            (softmax top-K renormalised; shared: a resident SwiGLU, strata.models.ffn)
The linear layers' conv state and S live in the cache's `states` (strata.models.layer_state)
and carry from chunk to chunk; packed sequences (strata.models.packed) each run from a zero
state, one after the other, so nothing crosses a boundary. On CUDA the conv, the delta rule and
the gated norm are strata's Triton kernels (strata.kernels.deltanet); elsewhere their plain-torch
twins (the attention's and the norms' convention: Triton on CUDA, the twin on the CPU).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from strata.errors import StrataError
from strata.kernels.attention.kv_int8 import cache_dtype
from strata.kernels.deltanet import (causal_conv1d, causal_conv1d_torch, delta_rule_on,
                                     gated_rms_norm, gated_rms_norm_torch, split_qkv)
from strata.models.attention import AttentionWeights, attend as attend_cached, carve_proj, project
from strata.models.ffn import DenseFFN
from strata.models.kv import KVCache, kv_windows
from strata.models.layer_state import new_states, state_dtype
from strata.models.layers import add_rounded_, buf_view, matmul_into, norm_out, norm_rope
from strata.models.moe_block import moe_block
from strata.models.moe_decoder import MoeDecoder


@dataclass
class DeltaNetWeights:
    qkv: torch.Tensor            # [C, D] attn_qkv
    gate: torch.Tensor           # [Hv*dv, D] attn_gate (z)
    conv: torch.Tensor           # [C, K] ssm_conv1d
    dt_bias: torch.Tensor        # [Hv] ssm_dt.bias, fp32
    a: torch.Tensor              # [Hv] ssm_a = -exp(A_log), fp32
    norm: torch.Tensor           # [dv] ssm_norm
    out: torch.Tensor            # [D, Hv*dv] ssm_out
    ba: torch.Tensor | None = None     # [2 Hv, D] ssm_ba (Qwen3-Next)
    beta: torch.Tensor | None = None   # [Hv, D] ssm_beta (Qwen3.5)
    alpha: torch.Tensor | None = None  # [Hv, D] ssm_alpha (Qwen3.5)

    def map(self, fn) -> "DeltaNetWeights":
        kw = {k: None if t is None else fn(t) for k, t in vars(self).items()}
        kw["dt_bias"], kw["a"] = kw["dt_bias"].float(), kw["a"].float()   # the gates are fp32
        return DeltaNetWeights(**kw)


@dataclass
class HybridLayer:
    attn_norm: torch.Tensor                   # [D] (1 + w)
    attn: AttentionWeights | DeltaNetWeights  # gated attention (wq [2 H hd, D]) or DeltaNet
    ffn_norm: torch.Tensor                    # [D] post_attention_norm (1 + w)
    router: torch.Tensor                      # [E, D]
    shared: DenseFFN                          # the shared expert
    shared_gate: torch.Tensor                 # [1, D] ffn_gate_inp_shexp

    def map(self, fn) -> "HybridLayer":
        return HybridLayer(fn(self.attn_norm), self.attn.map(fn), fn(self.ffn_norm),
                           fn(self.router), self.shared.map(fn), fn(self.shared_gate))


def _linear_weights(get, p: str) -> DeltaNetWeights:
    def opt(name):
        try:
            return get(p + name)
        except KeyError:
            return None
    return DeltaNetWeights(
        get(p + "attn_qkv.weight"), get(p + "attn_gate.weight"), get(p + "ssm_conv1d.weight"),
        get(p + "ssm_dt.bias").float(), get(p + "ssm_a").float(), get(p + "ssm_norm.weight"),
        get(p + "ssm_out.weight"), ba=opt("ssm_ba.weight"), beta=opt("ssm_beta.weight"),
        alpha=opt("ssm_alpha.weight"))


class Qwen3Next(MoeDecoder):
    """Both architectures: they differ only in how b and a are projected (DeltaNetWeights)."""

    @classmethod
    def layer_weights(cls, shape, get, l: int) -> HybridLayer:
        p = f"blk.{l}."
        if shape.layer_kind(l) == "linear":
            attn = _linear_weights(get, p)
        else:
            attn = AttentionWeights(*(get(f"{p}attn_{n}.weight")
                                      for n in ("q", "k", "v", "output")),
                                    q_norm=get(p + "attn_q_norm.weight"),
                                    k_norm=get(p + "attn_k_norm.weight"))
        return HybridLayer(get(p + "attn_norm.weight"), attn, get(p + "post_attention_norm.weight"),
                           get(p + "ffn_gate_inp.weight"),
                           DenseFFN(*(get(f"{p}ffn_{w}_shexp.weight")
                                      for w in ("gate", "up", "down"))),
                           get(p + "ffn_gate_inp_shexp.weight"))

    def new_cache(self, capacity: int | None = None, kv: str | None = None):
        """The GQA KVCache of the full layers (the linear ones keep none: kv_windows) with the
        linear layers' recurrent states."""
        s = self.shape
        cache = KVCache(s.n_layer, s.n_kv_head, s.head_dim, capacity=capacity,
                        dtype=cache_dtype(kv, self.dtype), device=self.layer_devices,
                        windows=kv_windows(s))
        cache.states = new_states(s, dtype=state_dtype(kv, self.dtype),
                                  devices=self.layer_devices)
        return cache

    def attend(self, xn, lw: HybridLayer, cos, sin, cache, l: int, into=None) -> torch.Tensor:
        if isinstance(lw.attn, DeltaNetWeights):
            return self.delta_attend(xn, lw.attn, cache, l, into)
        s, w = self.shape, lw.attn
        T, H, Hkv, hd = xn.shape[0], s.n_head, s.n_kv_head, s.head_dim
        # the engine's carve holds the query and gate projection (qg), the rotated q and k, v
        # and the attention's output (cache.proj; each None where there is none: a CPU read in
        # fp32, the model's own cache)
        bufs = carve_proj(cache, l)
        dt = torch.promote_types(xn.dtype, w.wv.dtype)
        qg = project(xn, w.wq, None, buf_view(bufs.get("qg"), (T, 2 * H * hd), dt, xn.device)
                     ).view(T, H, 2 * hd)
        # per-head norm and the partial RoPE in one pass (strata.kernels.norm on CUDA)
        q = norm_rope(qg[..., :hd], w.q_norm, cos, sin, s.rms_eps,
                      norm_out(bufs.get("q"), qg[..., :hd], w.q_norm))         # [H, T, hd]
        # the raw k in v's bytes until it is normed, then v there
        k = project(xn, w.wk, None, buf_view(bufs.get("v"), (T, Hkv * hd), dt, xn.device)
                    ).view(T, Hkv, hd)
        k = norm_rope(k, w.k_norm, cos, sin, s.rms_eps, norm_out(bufs.get("k"), k, w.k_norm))
        v = project(xn, w.wv, None, buf_view(bufs.get("v"), (T, Hkv * hd), dt, xn.device)
                    ).view(T, Hkv, hd)
        attn = bufs.get("attn")
        o = attend_cached(q, k, v, cache, l, into=attn)                        # [T, H, hd]
        if attn is not None and o.data_ptr() == attn.data_ptr() and o.is_contiguous():
            # the output in attn (the route wrote it there): gated where it lies, the gate's
            # sigmoid in qg's own bytes (s·o and o·s are the same bits)
            y = o.mul_(torch.sigmoid_(qg[..., hd:]))
        else:
            # the output gate into the sigmoid's own [T, H, hd] buffer (the carve's attn),
            # reading o and the gate where they lie (o is often a transposed view)
            y = torch.sigmoid(qg[..., hd:], out=buf_view(attn, (T, H, hd), qg.dtype,
                                                         xn.device)).mul_(o)
        return matmul_into(y.reshape(T, H * hd), w.wo, into)

    def delta_attend(self, xn, w: DeltaNetWeights, cache, l: int, into=None) -> torch.Tensor:
        """A Gated DeltaNet layer's output [T, D]; its conv state and S carry in cache.states.
        Packed sequences (cache.packed) each run from a zero conv state and S, as read alone
        (each sequence's output into its own rows of xn). `into`: delta_rows'."""
        states = getattr(cache, "states", None)
        if states is None or l not in states.S:
            raise StrataError(f"layer {l} is linear attention but the cache holds no recurrent "
                              f"state for it (a cache of {type(self).__name__}.new_cache)")
        packed = getattr(cache, "packed", None)
        bufs = carve_proj(cache, l)
        if packed is None:
            return self.delta_rows(xn, w, states, l, into, bufs)
        # one sequence at a time, each from the zero state a fresh cache holds, so that nothing
        # crosses a boundary (a packed batch is one chunk: no sequence carries into another
        # chunk). Its rows of xn are read by its own call only, so its output lands there: the
        # calls allocate only what one call over the whole chunk would, and the delta rule takes
        # its first rows of the chunk's dn_* scratch.
        for a, b in packed.bounds:
            states.conv[l].zero_()
            states.S[l].zero_()
            xn[a:b] = self.delta_rows(xn[a:b], w, states, l, xn[a:b], bufs)
        return xn

    def delta_rows(self, xn, w: DeltaNetWeights, states, l: int, into=None,
                   bufs=None) -> torch.Tensor:
        """The layer over consecutive rows xn [T, D] of one sequence, from and into
        states.conv[l] and states.S[l] -> [T, D], into `into` where it takes it (layers.
        into_view: xn itself, read by then). `bufs`: the carve's buffers a full layer's
        attention uses and a linear one's leaves free (cache.proj), which take its [T, ·]
        tensors in turn: the q / k / v projection in qg, the conv's q and k in q and its v in
        attn, then (the projection read) the rule's output and the gate z in qg, the gated
        norm in q (q and k read); each allocated where it does not fit (a CPU read in fp32)."""
        lin, T = self.shape.linear, xn.shape[0]
        Hk, Hv, dk, dv = lin.n_k_head, lin.n_v_head, lin.k_head_dim, lin.v_head_dim
        bufs, dev = bufs or {}, xn.device
        dt = torch.promote_types(xn.dtype, w.qkv.dtype)
        qg, qk_w, v_w = bufs.get("qg"), 2 * Hk * dk, Hv * dv
        if w.ba is not None:      # per key head: r b's, then r a's
            ba = (xn @ w.ba.t()).view(T, Hk, 2, Hv // Hk)
            b, a = ba[:, :, 0].reshape(T, Hv), ba[:, :, 1].reshape(T, Hv)
        else:
            b, a = xn @ w.beta.t(), xn @ w.alpha.t()
        conv = states.conv[l]
        conv1d = causal_conv1d if xn.is_cuda else causal_conv1d_torch
        # q and k in one output, v in its own: the delta rule reads v without copying it
        qkv = project(xn, w.qkv, None, buf_view(qg, (T, qk_w + v_w), dt, dev))
        mixed, new_conv = conv1d(qkv, w.conv, None, conv.to(xn.dtype), split=qk_w,
                                 out=(buf_view(bufs.get("q"), (T, qk_w), qkv.dtype, dev),
                                      buf_view(bufs.get("attn"), (T, v_w), qkv.dtype, dev)))
        conv.copy_(new_conv)
        q, k, v = split_qkv(mixed, Hk, Hv, dk, dv)
        g = w.a * F.softplus(a.float() + w.dt_bias)                  # [T, Hv] fp32, <= 0
        rule = delta_rule_on(xn)
        S = states.S[l]
        o, _ = rule(q, k, v, g, b.sigmoid(), S, use_qk_l2norm=True, out_state=S,
                    scratch=states.scratch.get(l),
                    out=buf_view(qg, (T, Hv, dv), v.dtype, dev))     # the projection is read
        z = project(xn, w.gate, None, buf_view(None if qg is None else qg[T * v_w:],
                                               (T, v_w), dt, dev)).view(T, Hv, dv)
        norm = gated_rms_norm if xn.is_cuda else gated_rms_norm_torch
        y = norm(o, z, w.norm, self.shape.rms_eps,
                 buf_view(bufs.get("q"), (T, Hv, dv), o.dtype, dev))  # q and k are read
        return matmul_into(y.reshape(T, Hv * dv), w.out, into)

    def mlp(self, h, lw: HybridLayer, l: int, provider, observer) -> torch.Tensor:
        """The routed experts plus the shared expert behind its sigmoid gate."""
        y = moe_block(h, l, self.router(lw), self.ffn, provider, observer)
        # y rounded to h's dtype plus the gated shared output (the same bits as y.to(h.dtype)
        # + ...), a block of rows at a time (add_rounded_): no [T, D] copy of y
        # the gate first: the shared expert's output takes h's bytes (DenseFFN's `into`)
        gate = torch.sigmoid(h @ lw.shared_gate.t())                           # [T, 1]
        shared = lw.shared(h, buf=provider.workspace(l).spare(), into=h)   # as family.mlp's
        return add_rounded_(shared.mul_(gate), y)
