"""GPT-OSS's record: its dense tensors (llama.cpp's gpt-oss names), and how the HF and
GGUF readers find them and its experts (with their biases).

Legend: D hidden, E experts, F expert width, H query heads, Hkv kv heads, hd head dim.

HF (GptOssForCausalLM, bf16/fp32 weights): `mlp.router.{weight,bias}`; experts fused and stored
input-major with gate and up INTERLEAVED along the output: `mlp.experts.gate_up_proj` [E, D, 2F]
(column 2f is gate row f, column 2f+1 up row f), `gate_up_proj_bias` [E, 2F] (the same
interleave), `down_proj` [E, F, D], `down_proj_bias` [E, D]; `self_attn.sinks` [H]; q/k/v/o
with biases. OpenAI's release stores the experts as MXFP4 `*_blocks`/`*_scales`: llama.cpp's
converter repacks those into GGUF MXFP4, which strata packs byte for byte (pack the GGUF).

GGUF (arch `gpt-oss`, convert_hf_to_gguf.py's layout): gate and up de-interleaved into
`ffn_gate_exps` / `ffn_up_exps` ({D, F, E}, or fused `ffn_gate_up_exps` {D, 2F, E}, gate rows
first) and `ffn_down_exps` {F, D, E}, each with a `.bias` ({F, E} / {2F, E} / {D, E});
`attn_sinks.weight` [H]; the pre-FFN norm is `post_attention_norm`. Metadata: expert width
`gpt-oss.expert_feed_forward_length`, `gpt-oss.attention.sliding_window` (its layers by
`attention.sliding_window_pattern`, llama.cpp's default 2: even layers), YaRN in
`gpt-oss.rope.scaling.{type,factor,original_context_length}`. The clamped SwiGLU's alpha and
limit are not in llama.cpp's gpt-oss files (it fixes them at 1.702 and 7.0: strata.shapes
defaults); a per-layer `gpt-oss.swiglu_clamp_exp` (gguf-py's key for other models' clamps), when
present and uniform, gives the limit. HF's yarn `truncate` is not stored either (false in the
release's config.json, so false here).
"""
from __future__ import annotations

import numpy as np
import torch

from strata.archs.hf_config import config_fields
from strata.archs.gguf_tensors import dense, field as gguf_field, layer_experts
from strata.archs import hparams_gguf, hparams_hf
from strata.archs.attention_names import gqa_specs
from strata.archs.hf_tensors import HF_ATTENTION, hf_dense_tensor
from strata.archs.record import Arch
from strata.errors import StrataError
from strata.models.gpt_oss import GptOss
from strata.shapes import GptOssOptions, ModelShape, Window, Yarn

ARCH = "gpt-oss"


def layer_specs(s: ModelShape, i: int) -> dict[str, tuple[int, ...]]:
    D, p = s.d_model, f"blk.{i}."
    return {p + "attn_norm.weight": (D,)} | gqa_specs(s, p, bias="each", out_bias=True) | {
        p + "attn_sinks.weight": (s.n_head,),           # [H] sink logits
        p + "post_attention_norm.weight": (D,),         # [D] the pre-FFN norm
        p + "ffn_gate_inp.weight": (s.n_expert, D),     # router [E, D]
        p + "ffn_gate_inp.bias": (s.n_expert,),         # [E]
    }


def _shape(window: int, pattern: int, swiglu_alpha: float = 1.702, swiglu_limit: float = 7.0,
           **kw) -> ModelShape:
    """A GPT-OSS shape: its options (biased experts, the clamped SwiGLU), its sliding window
    (none when `window` is 0) and `kw`'s fields."""
    return ModelShape(arch=ARCH, opts=GptOssOptions(swiglu_alpha, swiglu_limit),
                      window=Window(window, pattern) if window > 0 else None, **kw)


# ---- Hugging Face ------------------------------------------------------------------------------
_HF_LAYER = HF_ATTENTION | {  # pack name (minus "blk.N.") -> HF name (minus "model.layers.N.")
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "attn_sinks.weight": "self_attn.sinks",
    "ffn_gate_inp.weight": "mlp.router.weight",
    "ffn_gate_inp.bias": "mlp.router.bias",
}


def pattern_of(slides: list[bool]) -> int | None:
    """The Window.pattern p whose layers slide exactly where `slides` says (layer l
    slides when l % p < p - 1, llama.cpp's set_swa_pattern), None when no p spells it."""
    n = len(slides)
    for p in range(1, n + 2):
        if all((l % p < p - 1) == bool(s) for l, s in enumerate(slides)):
            return p
    return None


def _sliding(cfg: dict, n_layer: int, window: int, where) -> int:
    """The sliding pattern that layer_types spells (GPT-OSS's: 2, even layers slide); refuse
    one no pattern spells."""
    types = cfg.get("layer_types")
    if not window or types is None:
        return 2
    kinds = {"sliding_attention": True, "full_attention": False}
    p = (pattern_of([kinds[t] for t in types])
         if len(types) == n_layer and all(t in kinds for t in types) else None)
    if p is None:
        raise StrataError(f"{where}: layer_types {types} is not a repeating pattern of sliding "
                          f"layers then one full layer; strata reads those patterns only")
    return p


MXFP4_HF = ("{where}: the experts are MXFP4 blocks (OpenAI's release format); convert the "
            "checkpoint with llama.cpp's convert_hf_to_gguf.py and pack the GGUF (its MXFP4 "
            "experts are kept byte for byte)")


def hf_shape(cfg: dict, where) -> ModelShape:
    if (cfg.get("quantization_config") or {}).get("quant_method") == "mxfp4":
        raise StrataError(MXFP4_HF.format(where=where))
    with config_fields(where):
        H, L = cfg["num_attention_heads"], cfg["num_hidden_layers"]
        rp = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
        theta = float(cfg.get("rope_theta") or rp.get("rope_theta", 150000.0))
        kind = rp.get("rope_type") or rp.get("type") or "default"
        if kind not in ("yarn", "default"):
            raise StrataError(f"{where}: rope type {kind!r}; strata reads GPT-OSS with yarn "
                              f"(or plain) RoPE")
        yarn = None
        if kind == "yarn":
            yarn = Yarn(float(rp["factor"]), int(rp["original_max_position_embeddings"]),
                        beta_fast=float(rp.get("beta_fast") or 32.0),
                        beta_slow=float(rp.get("beta_slow") or 1.0),
                        truncate=bool(rp.get("truncate", True)))
        window = int(cfg.get("sliding_window", 128) or 0)   # GptOssConfig's default
        return _shape(
            window, _sliding(cfg, L, window, where), n_layer=L, d_model=cfg["hidden_size"],
            n_expert=cfg["num_local_experts"], top_k=cfg["num_experts_per_tok"],
            d_expert=cfg["intermediate_size"], n_head=H,
            n_kv_head=cfg.get("num_key_value_heads") or H,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // H, vocab=cfg["vocab_size"],
            rope_theta=theta, rms_eps=float(cfg["rms_norm_eps"]),
            max_pos=cfg.get("max_position_embeddings", 131072),
            swiglu_alpha=float(cfg.get("swiglu_alpha", 1.702)),
            swiglu_limit=float(cfg.get("swiglu_limit", 7.0)), yarn=yarn)


def hf_dense(ts, name: str) -> torch.Tensor:
    return hf_dense_tensor(ts, name, _HF_LAYER)


def hf_experts(ts, i: int, s: ModelShape):
    """(gate [E, F, D], up [E, F, D], down [E, D, F], (gate [E, F], up [E, F], down [E, D])
    biases) of layer i: HF's interleaved gate/up split, every matrix made output-major."""
    E, D, F = s.n_expert, s.d_model, s.d_expert
    p = f"model.layers.{i}.mlp.experts."
    if p + "gate_up_proj_blocks" in ts:
        raise StrataError(MXFP4_HF.format(where=f"layer {i}"))
    gu, dn = ts.get(p + "gate_up_proj"), ts.get(p + "down_proj")
    gub, dnb = ts.get(p + "gate_up_proj_bias"), ts.get(p + "down_proj_bias")
    want = ((E, D, 2 * F), (E, F, D), (E, 2 * F), (E, D))
    got = tuple(tuple(t.shape) for t in (gu, dn, gub, dnb))
    if got != want:
        raise StrataError(f"layer {i} experts are {[list(g) for g in got]}, expected "
                          f"{[list(w) for w in want]} (gate_up_proj, down_proj and biases)")
    gate, up = gu[..., 0::2].transpose(1, 2), gu[..., 1::2].transpose(1, 2)   # [E, F, D]
    return gate, up, dn.transpose(1, 2), (gub[:, 0::2], gub[:, 1::2], dnb)


# ---- GGUF --------------------------------------------------------------------------------------
def gguf_shape(r, path) -> ModelShape:
    a = ARCH
    tensors = {t.name: t for t in r.tensors}

    def field(key, default=None):
        return gguf_field(r, key, default)
    D = int(field(f"{a}.embedding_length"))
    H = int(field(f"{a}.attention.head_count"))
    if "token_embd.weight" not in tensors:
        raise StrataError(f"{path} has no token_embd.weight")
    opts = {}
    kind = field(f"{a}.rope.scaling.type", "none")
    if kind == "yarn":
        opts["yarn"] = Yarn(float(field(f"{a}.rope.scaling.factor")),
                            int(field(f"{a}.rope.scaling.original_context_length")),
                            beta_fast=float(field(f"{a}.rope.scaling.yarn_beta_fast", 32.0)),
                            beta_slow=float(field(f"{a}.rope.scaling.yarn_beta_slow", 1.0)),
                            truncate=False)
    elif kind not in ("none", ""):
        raise StrataError(f"{path}: {a}.rope.scaling.type is {kind!r}; strata reads yarn")
    clamp = field(f"{a}.swiglu_clamp_exp", [])
    clamp = [float(v) for v in (clamp if isinstance(clamp, (list, tuple)) else [clamp])]
    if len(set(clamp)) > 1:
        raise StrataError(f"{path}: {a}.swiglu_clamp_exp varies by layer ({clamp}); strata "
                          f"reads one SwiGLU limit per model")
    if clamp:
        opts["swiglu_limit"] = clamp[0]
    n_layer = int(field(f"{a}.block_count"))
    return _shape(
        int(field(f"{a}.attention.sliding_window", 0)),
        _gguf_pattern(field(f"{a}.attention.sliding_window_pattern", 2), n_layer, path),
        n_layer=n_layer, d_model=D,
        n_expert=int(field(f"{a}.expert_count")), top_k=int(field(f"{a}.expert_used_count")),
        d_expert=int(field(f"{a}.expert_feed_forward_length")), n_head=H,
        n_kv_head=int(field(f"{a}.attention.head_count_kv", H)),
        head_dim=int(field(f"{a}.attention.key_length", D // H)),
        vocab=int(tensors["token_embd.weight"].shape[1]),
        rope_theta=float(f"{float(field(f'{a}.rope.freq_base')):.7g}"),
        rms_eps=float(f"{float(field(f'{a}.attention.layer_norm_rms_epsilon')):.7g}"),
        max_pos=int(field(f"{a}.context_length", 131072)), **opts)


def _gguf_pattern(v, n_layer: int, path) -> int:
    """llama.cpp's sliding_window_pattern (load_swa_pattern): a number p (layer l slides when
    l % p < p - 1; 0: every layer) or one bool per layer, as Window.pattern."""
    a = f"{ARCH}.attention.sliding_window_pattern"
    if isinstance(v, (list, tuple)):
        p = pattern_of([bool(x) for x in v]) if len(v) == n_layer else None
        if p is None:
            raise StrataError(f"{path}: {a} {list(v)} is not a repeating pattern of sliding "
                              f"layers then one full layer; strata reads those patterns only")
        return p
    if int(v) < 1:
        raise StrataError(f"{path}: {a} is {v} (every layer sliding); strata reads patterns of "
                          f"sliding layers then one full layer (>= 1)")
    return int(v)


def _bias(tensors: dict, name: str, shape: tuple[int, int], src) -> np.ndarray:
    """A ggml {n, E} bias tensor as fp32 [E, n]; one line naming it when absent or mis-shaped."""
    t = tensors.get(name)
    if t is None:
        raise StrataError(f"{src} has no {name}; GPT-OSS experts carry biases")
    if [int(v) for v in t.shape] != [shape[1], shape[0]]:
        raise StrataError(f"{name} has ggml shape {[int(v) for v in t.shape]}, expected "
                          f"{[shape[1], shape[0]]} from the metadata")
    return dense(t, shape).float().numpy()


def gguf_experts(tensors: dict, i: int, s: ModelShape, src):
    """Layer i's ([gate, up, down] expert bytes, format names, (gate, up, down) fp32 biases)."""
    E, D, F = s.n_expert, s.d_model, s.d_expert
    p = f"blk.{i}."
    mats, fmts = layer_experts(tensors, i, s, src)
    if p + "ffn_gate_up_exps.bias" in tensors:
        gu = _bias(tensors, p + "ffn_gate_up_exps.bias", (E, 2 * F), src)
        bg, bu = gu[:, :F], gu[:, F:]
    else:
        bg = _bias(tensors, p + "ffn_gate_exps.bias", (E, F), src)
        bu = _bias(tensors, p + "ffn_up_exps.bias", (E, F), src)
    bd = _bias(tensors, p + "ffn_down_exps.bias", (E, D), src)
    return mats, fmts, (bg, bu, bd)


# llama.cpp permutes nothing for gpt-oss (NEOX RoPE, as HF): the record's gguf_dense is the default
GPT_OSS = Arch(
    name=ARCH, hf_types=("gpt_oss",), gguf_archs=("gpt-oss",), wiring=GptOss,
    layer_specs=layer_specs, hf_shape=hf_shape, hf_dense=hf_dense, hf_experts=hf_experts,
    gguf_shape=gguf_shape, gguf_experts=gguf_experts, gguf_hparams=hparams_gguf.GPT_OSS,
    hf_hparams=hparams_hf.GPT_OSS, options=(GptOssOptions, Window, Yarn))
