"""Hugging Face Qwen3-MoE checkpoint folder (config.json + *.safetensors) -> pack.

Experts are read per expert (`mlp.experts.<e>.{gate,up,down}_proj.weight`, what save_pretrained
writes) or fused (`mlp.experts.gate_up_proj` [E, 2F, D] with gate rows first and
`mlp.experts.down_proj` [E, D, F], transformers 5's in-memory layout) and quantized to the chosen
formats; dense weights keep their dtype. Legend: E experts, D hidden, F expert width.

Another architecture's folder (a config.json model_type that a tensor-name map claims, see
strata.packs.names.by_source: mixtral, gpt_oss) is read through its map's `hf_shape`, `hf_dense`
and `hf_experts` (which may return the experts' biases).
"""
from __future__ import annotations

import json
from pathlib import Path

from strata.errors import StrataError
from strata.packs.blobs import assemble_blobs
from strata.packs.hf_tensors import HF_GLOBAL, SafeTensors, layer_experts
from strata.packs.names import dense_specs
from strata.packs.quantize import quantize_rows
from strata.shapes import ModelShape

_DENSE = {  # pack name (minus "blk.N.") -> HF name (minus "model.layers.N.")
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate_inp.weight": "mlp.gate.weight",
}
def hf_shape(cfg: dict, where) -> ModelShape:
    mt = cfg.get("model_type")
    if mt != "qwen3_moe":
        raise StrataError(f"{where}: model_type {mt!r}; strata packs qwen3_moe checkpoints")
    if cfg.get("mlp_only_layers") or cfg.get("decoder_sparse_step", 1) != 1:
        raise StrataError(f"{where}: dense MLP layers (mlp_only_layers/decoder_sparse_step) are not "
                          f"supported; every layer must be MoE")
    try:
        H = cfg["num_attention_heads"]
        rope = cfg.get("rope_theta") or (cfg.get("rope_parameters") or {}).get("rope_theta", 10000.0)
        return ModelShape(
            arch="qwen3moe", n_layer=cfg["num_hidden_layers"], d_model=cfg["hidden_size"],
            n_expert=cfg.get("num_experts") or cfg["num_local_experts"],
            top_k=cfg["num_experts_per_tok"], d_expert=cfg["moe_intermediate_size"], n_head=H,
            n_kv_head=cfg.get("num_key_value_heads", H),
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // H, vocab=cfg["vocab_size"],
            rope_theta=float(rope), rms_eps=float(cfg["rms_norm_eps"]),
            norm_topk_prob=bool(cfg.get("norm_topk_prob", False)),   # Qwen3MoeConfig's default
            max_pos=cfg.get("max_position_embeddings", 40960))
    except KeyError as e:
        raise StrataError(f"{where}: config.json lacks {e.args[0]}") from None
    except (TypeError, ValueError) as e:
        raise StrataError(f"{where}: config.json has a value of the wrong type ({e})") from None


def hf_folder(src: Path):
    """(config.json, the shape strata reads from it, the architecture's name map or None for
    Qwen3-MoE) of a HF folder; the config audited (strata.packs.hparams) and refused in one
    line where strata would read it wrong."""
    cfgp = src / "config.json"
    if not cfgp.is_file():
        raise StrataError(f"{src} has no config.json; give a Hugging Face checkpoint folder or a GGUF")
    try:
        cfg = json.loads(cfgp.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise StrataError(f"{cfgp} is not valid JSON ({e}); fix or re-download the checkpoint's "
                          f"config.json") from None
    if not isinstance(cfg, dict):
        raise StrataError(f"{cfgp} holds a JSON {type(cfg).__name__}, not an object; fix or "
                          f"re-download it")
    from strata.packs.hparams import audit_hf
    audit_hf(cfg, src)   # a field strata would drop, or a value it does not implement: refused
    from strata.packs import from_hf_ds
    from strata.packs.file import check_shape
    from strata.packs.names import by_source
    arch = None
    if cfg.get("model_type") in from_hf_ds.MODEL_TYPES:   # GLM-4.5, DeepSeek-V3, Kimi-K2
        s = from_hf_ds.hf_shape_ds(cfg, src)
    else:
        arch = by_source("hf", cfg.get("model_type"))   # Mixtral, GPT-OSS (None: Qwen3-MoE's)
        s = arch.hf_shape(cfg, src) if arch is not None else hf_shape(cfg, src)
    check_shape(s, cfgp)
    return cfg, s, arch


def hf_folder_shape(src) -> ModelShape:
    """The shape `strata pack` reads from a HF folder (strata.packs.provenance checks a pack's
    against it)."""
    return hf_folder(Path(src))[1]


def hf_to_pack(src, out, quant="BF16", quant_gate=None, quant_up=None, quant_down=None,
               progress: bool = True):
    """Write a pack from a HF Qwen3-MoE folder; experts quantized to `quant` (per-matrix overrides).
    The folder's tokenizer (tokenizer.json, or the slow files through transformers) is carried."""
    from strata.packs.writer import write_pack
    from strata.packs.provenance import hf_record
    from strata.packs.synth import ExpertFormats
    from strata.tokenize import hf_tokenizer
    src = Path(src)
    cfg, s, arch = hf_folder(src)
    fmts = ExpertFormats.of(quant, quant_gate, quant_up, quant_down)
    from strata.packs import from_hf_ds
    if cfg.get("model_type") in from_hf_ds.MODEL_TYPES:   # GLM-4.5, DeepSeek-V3, Kimi-K2
        return from_hf_ds.hf_to_pack_ds(src, cfg, s, out, fmts, progress, hf_tokenizer(src))
    lay = fmts.layout(s)
    ts = SafeTensors(src)
    dense = {}
    tied = "lm_head.weight" not in ts
    for name in dense_specs(s):
        if tied and name == "output.weight":
            continue
        if arch is not None:
            dense[name] = arch.hf_dense(ts, name)
        elif name.startswith("blk."):
            _, i, rest = name.split(".", 2)
            dense[name] = ts.get(f"model.layers.{i}.{_DENSE[rest]}")
        else:
            dense[name] = ts.get(HF_GLOBAL[name])

    def layer(i):
        def make():
            if arch is not None:
                g, u, d, bias = arch.hf_experts(ts, i, s)
            else:
                (g, u, d), bias = layer_experts(ts, i, s), None
            return assemble_blobs(lay, quantize_rows(g, fmts.gate), quantize_rows(u, fmts.up),
                                  quantize_rows(d, fmts.down), s.n_expert, bias=bias)
        return make
    return write_pack(out, s, dense, [layer(i) for i in range(s.n_layer)], lay, native=True,  # plain ggml row layouts
                      source=f"hf:{src.name}", progress=progress, tokenizer=hf_tokenizer(src),
                      provenance=hf_record(cfg))
