"""The records of the DeepSeek / GLM-4.5 family: GLM-4.5 (`glm4moe`) and DeepSeek-V3 / Kimi-K2
(`deepseek2`). Their tensor-name map is strata.archs.family_names, their readers'
strata.archs.family_gguf and family_hf; their experts are read as Qwen3-MoE's (3-D GGUF
`ffn_*_exps`, HF per-expert or fused)."""
from __future__ import annotations

from strata.archs import family_gguf, family_hf, family_names, hparams_gguf, hparams_hf
from strata.archs.qwen3moe import gguf_experts
from strata.archs.record import Arch
from strata.models.deepseek import DeepSeek2
from strata.models.glm4moe import Glm4Moe
from strata.shapes import Attn, DenseFfn, Mla, Router, Yarn

GLM4MOE = Arch(
    name="glm4moe", hf_types=("glm4_moe",), gguf_archs=("glm4moe",), wiring=Glm4Moe,
    layer_specs=family_names.layer_specs, hf_shape=family_hf.hf_shape_glm,
    hf_dense=family_hf.hf_dense, hf_experts=family_hf.hf_experts,
    gguf_shape=family_gguf.gguf_shape, gguf_experts=gguf_experts,
    gguf_hparams=hparams_gguf.GLM4MOE, hf_hparams=hparams_hf.GLM4_MOE,
    gguf_values=family_gguf.gguf_values, options=(DenseFfn, Router, Attn))

DEEPSEEK2 = Arch(
    name="deepseek2", hf_types=("deepseek_v3", "kimi_k2"), gguf_archs=("deepseek2",),
    wiring=DeepSeek2, layer_specs=family_names.layer_specs, hf_shape=family_hf.hf_shape_ds,
    hf_dense=family_hf.hf_dense, hf_experts=family_hf.hf_experts,
    gguf_shape=family_gguf.gguf_shape, gguf_experts=gguf_experts,
    gguf_join=family_gguf.join_kv_b, gguf_hparams=hparams_gguf.DEEPSEEK2,
    hf_hparams=hparams_hf.DEEPSEEK_V3, gguf_split=family_gguf.split_kv_b,
    gguf_values=family_gguf.gguf_values, options=(DenseFfn, Router, Mla, Yarn))
