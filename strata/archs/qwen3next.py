"""Qwen3-Next's record, and what Qwen3.5-MoE's (strata.archs.qwen35moe) shares with it: the dense
tensors (llama.cpp's qwen3next names), how the HF and GGUF readers find them and the experts.

Legend: D hidden, E experts, F expert width, Fs the shared expert's width (n_shared F), H query
heads, Hkv kv heads, hd head dim, Hk / Hv linear key / value heads, dk / dv their dims, r = Hv /
Hk, C = 2 Hk dk + Hv dv the conv channels, K the conv kernel.

The pack holds what llama.cpp's converter (conversion/qwen.py, Qwen3NextModel) writes: every
RMSNorm weight but the DeltaNet output norm as (1 + w) (HF's zero-centred norm), `ssm_a` =
-exp(A_log) (fp32), `ssm_dt.bias` = dt_bias, the conv weight [C, K], Qwen3-Next's in_proj_qkvz
split into `attn_qkv` (all q heads, then k, then v) and `attn_gate` (z), `ssm_ba` = in_proj_ba
as it is (per key head r b's, then r a's), the gated attention's `attn_q` [2 H hd, D] as HF
holds it (per head hd query rows, then hd gate rows), the post-attention norm `post_attention_norm`.
V heads stay in HF's grouped order (value head h reads key head h // r); llama.cpp's Qwen3.5
converter tiles them, which the GGUF reader undoes (strata.archs.qwen35moe).

HF (Qwen3NextForCausalLM): `model.layers.N.linear_attn.*` (in_proj_qkvz, in_proj_ba, conv1d,
dt_bias, A_log, norm, out_proj) or `self_attn.*` by layer_types, `mlp.gate`,
`mlp.shared_expert.{gate,up,down}_proj`, `mlp.shared_expert_gate` [1, D], the experts as
Qwen3-MoE's (per expert or fused: strata.archs.hf_tensors).
GGUF (arch `qwen3next`): the same names, 3-D `ffn_*_exps` experts; the linear layers by
`attention.recurrent_layers` or `full_attention_interval`.
"""
from __future__ import annotations

import torch

from strata.archs import hparams_gguf, hparams_hf
from strata.archs.hf_config import config_fields
from strata.archs.gguf_tensors import field, layer_experts, rope_base
from strata.archs.hf_tensors import HF_GLOBAL, layer_experts as hf_layer_experts
from strata.archs.record import Arch
from strata.errors import StrataError
from strata.kernels.deltanet.sizes import conv_channels
from strata.models.qwen3_next import Qwen3Next
from strata.shapes import Attn, DenseFfn, LinearAttention, ModelShape

ARCH = "qwen3next"
KINDS = {"linear_attention": "linear", "full_attention": "full"}


def layer_specs_of(split_ba: bool):
    """layer_specs of a hybrid arch: Qwen3-Next's fused `ssm_ba` (split_ba False) or Qwen3.5's
    `ssm_beta` / `ssm_alpha`."""
    def layer_specs(s: ModelShape, i: int) -> dict[str, tuple[int, ...]]:
        D, p = s.d_model, f"blk.{i}."
        fs = s.dense.shared * s.d_expert
        out = {p + "attn_norm.weight": (D,)}
        if s.layer_kind(i) == "linear":
            lin = s.linear
            Hv, vd = lin.n_v_head, lin.n_v_head * lin.v_head_dim
            C = conv_channels(lin.n_k_head, Hv, lin.k_head_dim, lin.v_head_dim)
            out |= {p + "attn_qkv.weight": (C, D),                   # [C, D] q | k | v
                    p + "attn_gate.weight": (vd, D),                 # [Hv*dv, D] z
                    p + "ssm_conv1d.weight": (C, lin.conv_kernel),   # [C, K]
                    p + "ssm_dt.bias": (Hv,), p + "ssm_a": (Hv,),    # [Hv] fp32
                    **({p + "ssm_beta.weight": (Hv, D), p + "ssm_alpha.weight": (Hv, D)}
                       if split_ba else {p + "ssm_ba.weight": (2 * Hv, D)}),
                    p + "ssm_norm.weight": (lin.v_head_dim,),        # [dv]
                    p + "ssm_out.weight": (D, vd)}                   # [D, Hv*dv]
        else:
            q, kv = s.n_head * s.head_dim, s.n_kv_head * s.head_dim
            out |= {p + "attn_q.weight": (2 * q, D),                 # [2 H hd, D] q and gate
                    p + "attn_k.weight": (kv, D), p + "attn_v.weight": (kv, D),
                    p + "attn_output.weight": (D, q),
                    p + "attn_q_norm.weight": (s.head_dim,), p + "attn_k_norm.weight": (s.head_dim,)}
        return out | {
            p + "post_attention_norm.weight": (D,),
            p + "ffn_gate_inp.weight": (s.n_expert, D),              # router [E, D]
            p + "ffn_gate_inp_shexp.weight": (1, D),                 # the shared expert's gate
            p + "ffn_gate_shexp.weight": (fs, D), p + "ffn_up_shexp.weight": (fs, D),
            p + "ffn_down_shexp.weight": (D, fs)}
    return layer_specs


# ---- Hugging Face ------------------------------------------------------------------------------
_PLUS_ONE = {"attn_norm.weight": "input_layernorm.weight",
             "post_attention_norm.weight": "post_attention_layernorm.weight",
             "attn_q_norm.weight": "self_attn.q_norm.weight",
             "attn_k_norm.weight": "self_attn.k_norm.weight"}
_DENSE = {  # pack name (minus "blk.N.") -> HF name (minus "model.layers.N.")
    "attn_q.weight": "self_attn.q_proj.weight", "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight", "attn_output.weight": "self_attn.o_proj.weight",
    "ssm_dt.bias": "linear_attn.dt_bias", "ssm_norm.weight": "linear_attn.norm.weight",
    "ssm_out.weight": "linear_attn.out_proj.weight", "ssm_ba.weight": "linear_attn.in_proj_ba.weight",
    "ssm_beta.weight": "linear_attn.in_proj_b.weight",
    "ssm_alpha.weight": "linear_attn.in_proj_a.weight",
    "attn_gate.weight": "linear_attn.in_proj_z.weight",
    "attn_qkv.weight": "linear_attn.in_proj_qkv.weight",
    "ffn_gate_inp.weight": "mlp.gate.weight",
    "ffn_gate_inp_shexp.weight": "mlp.shared_expert_gate.weight",
    "ffn_gate_shexp.weight": "mlp.shared_expert.gate_proj.weight",
    "ffn_up_shexp.weight": "mlp.shared_expert.up_proj.weight",
    "ffn_down_shexp.weight": "mlp.shared_expert.down_proj.weight",
}


def hf_linear(cfg: dict, where, arch: str, **extra) -> ModelShape:
    """The shape of a Qwen3-Next / Qwen3.5-MoE text config.json (see the module doc)."""
    if cfg.get("mlp_only_layers") or cfg.get("decoder_sparse_step", 1) != 1:
        raise StrataError(f"{where}: dense MLP layers (mlp_only_layers / decoder_sparse_step) "
                          f"are not supported; every layer must be MoE")
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    with config_fields(where):
        H, D, L = cfg["num_attention_heads"], cfg["hidden_size"], cfg["num_hidden_layers"]
        hd = cfg.get("head_dim") or D // H
        F, Fs = cfg["moe_intermediate_size"], cfg["shared_expert_intermediate_size"]
        if Fs % F:
            raise StrataError(f"{where}: shared_expert_intermediate_size {Fs} is not a multiple "
                              f"of moe_intermediate_size {F}; strata's shared expert is n F wide")
        interval = int(cfg.get("full_attention_interval", 4))
        lin = LinearAttention(cfg["linear_conv_kernel_dim"], cfg["linear_num_key_heads"],
                              cfg["linear_num_value_heads"], cfg["linear_key_head_dim"],
                              cfg["linear_value_head_dim"], interval)
        types = cfg.get("layer_types")
        if types is not None:
            if any(t not in KINDS for t in types):
                raise StrataError(f"{where}: layer_types holds {sorted(set(types) - set(KINDS))}; "
                                  f"strata reads {', '.join(KINDS)}")
            kinds = tuple(KINDS[t] for t in types)
            if kinds != tuple(lin.kind(l) for l in range(len(kinds))):
                lin = LinearAttention(*(getattr(lin, f) for f in (
                    "conv_kernel", "n_k_head", "n_v_head", "k_head_dim", "v_head_dim",
                    "full_interval")), layer_types=kinds)
        theta = cfg.get("rope_theta") or rope.get("rope_theta", 10000.0)
        prf = rope.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 0.25))
        return ModelShape(
            arch=arch, n_layer=L, d_model=D, n_expert=cfg["num_experts"],
            top_k=cfg["num_experts_per_tok"], d_expert=F, n_head=H,
            n_kv_head=cfg.get("num_key_value_heads") or H, head_dim=hd,
            vocab=cfg["vocab_size"], rope_theta=float(theta), rms_eps=float(cfg["rms_norm_eps"]),
            max_pos=cfg.get("max_position_embeddings", 32768), dense=DenseFfn(shared=Fs // F),
            attn=Attn(rope_dim=int(hd * float(prf))), linear=lin, **extra)


def hf_shape(cfg: dict, where) -> ModelShape:
    return hf_linear(cfg, where, ARCH, norm_topk_prob=bool(cfg.get("norm_topk_prob", True)))


def _qkvz(ts, p: str, s: ModelShape) -> tuple[torch.Tensor, torch.Tensor]:
    """Qwen3-Next's in_proj_qkvz [Hk (2 dk + 2 r dv), D] -> (qkv [C, D], z [Hv dv, D]), as
    llama.cpp's converter splits it (all q heads, then k, then v)."""
    lin = s.linear
    Hk, dk, rdv = lin.n_k_head, lin.k_head_dim, lin.n_v_head // lin.n_k_head * lin.v_head_dim
    w = ts.get(p + "linear_attn.in_proj_qkvz.weight")
    q, k, v, z = torch.split(w.view(Hk, 2 * dk + 2 * rdv, -1), [dk, dk, rdv, rdv], dim=1)
    D = w.shape[-1]
    return torch.cat([q.reshape(-1, D), k.reshape(-1, D), v.reshape(-1, D)]), z.reshape(-1, D)


def _base(ts, prefixes: tuple[str, ...]) -> str:
    """The prefix of the text model's tensors: the first of `prefixes` ("model." for a causal
    LM's folder, "model.language_model." for a multimodal release's) the checkpoint has."""
    return next((p for p in prefixes if p + "embed_tokens.weight" in ts), prefixes[0])


def hf_dense_of(prefixes: tuple[str, ...]):
    """hf_dense reading the text model under the first of `prefixes` the checkpoint has."""
    def hf_dense(ts, name: str) -> torch.Tensor:
        base = _base(ts, prefixes)
        if name == "output.weight":
            return ts.get(HF_GLOBAL[name])
        if not name.startswith("blk."):   # token_embd, output_norm (+ 1)
            x = ts.get(base + HF_GLOBAL[name][len("model."):])
            return x.float() + 1 if name == "output_norm.weight" else x
        _, i, rest = name.split(".", 2)
        p = f"{base}layers.{i}."
        if rest in _PLUS_ONE:
            return ts.get(p + _PLUS_ONE[rest]).float() + 1
        if rest == "ssm_a":
            return -ts.get(p + "linear_attn.A_log").float().exp()
        if rest == "ssm_conv1d.weight":
            return ts.get(p + "linear_attn.conv1d.weight").squeeze(1)
        if rest in ("attn_qkv.weight", "attn_gate.weight") and \
                p + "linear_attn.in_proj_qkvz.weight" in ts:
            return _qkvz(ts, p, ts.shape)[rest == "attn_gate.weight"]
        return ts.get(p + _DENSE[rest])
    return hf_dense


def hf_experts_of(prefixes: tuple[str, ...]):
    """hf_experts of the text model under the first of `prefixes` the checkpoint has."""
    def hf_experts(ts, i: int, s: ModelShape):
        """(gate [E, F, D], up [E, F, D], down [E, D, F], None: no biases) of layer i."""
        return (*hf_layer_experts(ts, i, s, _base(ts, prefixes)), None)
    return hf_experts


hf_experts = hf_experts_of(("model.",))


# ---- GGUF --------------------------------------------------------------------------------------
def gguf_linear(r, path, arch: str, **extra) -> ModelShape:
    """The shape of a qwen3next / qwen35moe GGUF: llama.cpp's keys (see hparams_gguf)."""
    a = arch
    tensors = {t.name: t for t in r.tensors}
    if "token_embd.weight" not in tensors:
        raise StrataError(f"{path} has no token_embd.weight")
    D, H = int(field(r, f"{a}.embedding_length")), int(field(r, f"{a}.attention.head_count"))
    L, hd = int(field(r, f"{a}.block_count")), int(field(r, f"{a}.attention.key_length", D // H))
    F = int(field(r, f"{a}.expert_feed_forward_length"))
    Fs = int(field(r, f"{a}.expert_shared_feed_forward_length", F))
    Hk, Hv = int(field(r, f"{a}.ssm.group_count")), int(field(r, f"{a}.ssm.time_step_rank"))
    dk, inner = int(field(r, f"{a}.ssm.state_size")), int(field(r, f"{a}.ssm.inner_size"))
    rec = field(r, f"{a}.attention.recurrent_layers", required=False)
    lin = LinearAttention(int(field(r, f"{a}.ssm.conv_kernel")), Hk, Hv, dk, inner // Hv,
                          int(field(r, f"{a}.full_attention_interval", 4)))
    if rec is not None:
        kinds = tuple("linear" if bool(x) else "full" for x in list(rec)[:L])
        if kinds != tuple(lin.kind(l) for l in range(L)):
            lin = LinearAttention(lin.conv_kernel, Hk, Hv, dk, inner // Hv, lin.full_interval,
                                  kinds)
    return ModelShape(
        arch=arch, n_layer=L, d_model=D, n_expert=int(field(r, f"{a}.expert_count")),
        top_k=int(field(r, f"{a}.expert_used_count")), d_expert=F, n_head=H,
        n_kv_head=int(field(r, f"{a}.attention.head_count_kv", H)), head_dim=hd,
        vocab=int(tensors["token_embd.weight"].shape[1]),
        rope_theta=float(f"{float(rope_base(r, a, path)):.7g}"),
        rms_eps=float(f"{float(field(r, f'{a}.attention.layer_norm_rms_epsilon')):.7g}"),
        max_pos=int(field(r, f"{a}.context_length", 32768)), dense=DenseFfn(shared=max(1, Fs // F)),
        attn=Attn(rope_dim=int(field(r, f"{a}.rope.dimension_count", hd // 4))), linear=lin,
        **extra)


def gguf_shape(r, path) -> ModelShape:
    return gguf_linear(r, path, ARCH)


def gguf_experts(tensors: dict, i: int, s: ModelShape, src):
    """Layer i's ([gate, up, down] expert bytes, format names, None: no biases)."""
    return (*layer_experts(tensors, i, s, src), None)


def gguf_values_of(sections: bool):
    """gguf_values: the keys whose value is not one ModelShape field (strata.archs.gguf_layout):
    the shared expert's and the DeltaNet's value widths, which layers are recurrent (as the
    converter writes it from layer_types), and Qwen3.5's MRoPE sections (llama.cpp requires
    them): llama.cpp's interleaved MRoPE turns pair i by axis i mod 3 while i < 3 x that
    axis's section, else by a fourth position that is 0 for text, so the sections must cover
    every rotary pair for text to turn as plain RoPE (as transformers turns it): the pairs of
    each residue, [11, 11, 10] for 32 pairs, the converter's default)."""
    def gguf_values(s: ModelShape) -> dict:
        lin = s.linear
        out = {"expert_shared_feed_forward_length": s.dense.shared * s.d_expert,
               "ssm.inner_size": lin.n_v_head * lin.v_head_dim,
               "attention.recurrent_layers": [s.layer_kind(l) == "linear"
                                              for l in range(s.n_layer)]}
        if sections:
            t = s.rot_dim // 2    # rotary pairs; pair i turns by position axis i mod 3
            out["rope.dimension_sections"] = [(t + 2) // 3, (t + 1) // 3, t // 3, 0]
        return out
    return gguf_values


QWEN3NEXT = Arch(
    name=ARCH, hf_types=("qwen3_next",), gguf_archs=("qwen3next",), wiring=Qwen3Next,
    layer_specs=layer_specs_of(False), hf_shape=hf_shape,
    hf_dense=hf_dense_of(("model.",)), hf_experts=hf_experts, gguf_shape=gguf_shape,
    gguf_experts=gguf_experts, gguf_hparams=hparams_gguf.QWEN3NEXT,
    hf_hparams=hparams_hf.QWEN3_NEXT, gguf_values=gguf_values_of(False),
    options=(DenseFfn, Attn, LinearAttention))
