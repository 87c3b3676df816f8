"""GGUF `glm4moe` (GLM-4.5) and `deepseek2` (DeepSeek-V3, Kimi-K2) metadata -> ModelShape, and
the dense tensors llama.cpp's converter splits (strata.archs.family holds their records).

- Leading dense layers: {arch}.leading_dense_block_count, their width feed_forward_length.
- NextN / MTP layers (GLM-4.5's last nextn_predict_layers blocks) are not read.
- deepseek2 MLA: newer conversions write head_count_kv 1 with key_length = Lkv + R and the
  per-head sizes in key_length_mla / value_length_mla; older ones head_count_kv = H and
  key_length = N + R, value_length = Hv. Newer ones also split attn_kv_b [H*(N+Hv), Lkv] into
  attn_k_b (torch [H, Lkv, N]) and attn_v_b ([H, Hv, Lkv]); `join_kv_b` rebuilds attn_kv_b.
"""
from __future__ import annotations

import torch

from strata.archs.gguf_tensors import field, rope_base
from strata.errors import StrataError
from strata.shapes import Attn, DenseFfn, Mla, ModelShape, Router, Yarn

SIGMOID = 2   # gguf.ExpertGatingFuncType.SIGMOID


def gguf_shape(r, path) -> ModelShape:
    """The shape from the metadata."""
    a = field(r, "general.architecture")
    D = int(field(r, f"{a}.embedding_length"))
    H = int(field(r, f"{a}.attention.head_count"))
    tensors = {t.name: t for t in r.tensors}
    if "token_embd.weight" not in tensors:
        raise StrataError(f"{path} has no token_embd.weight")
    gating = int(field(r, f"{a}.expert_gating_func", SIGMOID))
    if gating != SIGMOID:
        raise StrataError(f"{path}: expert_gating_func {gating}; strata routes this family's "
                          f"sigmoid gate (2)")
    n_layer = int(field(r, f"{a}.block_count")) - int(field(r, f"{a}.nextn_predict_layers", 0))
    common = dict(
        n_layer=n_layer, d_model=D, n_expert=int(field(r, f"{a}.expert_count")),
        top_k=int(field(r, f"{a}.expert_used_count")),
        d_expert=int(field(r, f"{a}.expert_feed_forward_length")), n_head=H,
        vocab=int(tensors["token_embd.weight"].shape[1]),
        rope_theta=float(f"{float(rope_base(r, a, path)):.7g}"),
        rms_eps=float(f"{float(field(r, f'{a}.attention.layer_norm_rms_epsilon')):.7g}"),
        max_pos=int(field(r, f"{a}.context_length", 40960)),
        dense=DenseFfn(int(field(r, f"{a}.leading_dense_block_count", 0)),
                       int(field(r, f"{a}.feed_forward_length")),
                       int(field(r, f"{a}.expert_shared_count", 0))),
        router=Router("sigmoid", int(field(r, f"{a}.expert_group_count", 1)) or 1,
                      int(field(r, f"{a}.expert_group_used_count", 1)) or 1,
                      float(f"{float(field(r, f'{a}.expert_weights_scale', 1.0)):.7g}")),
        norm_topk_prob=bool(field(r, f"{a}.expert_weights_norm", True)))
    if a == "glm4moe":
        hd = int(field(r, f"{a}.attention.key_length", D // H))
        p = "blk.0."
        return ModelShape(arch=a, n_kv_head=int(field(r, f"{a}.attention.head_count_kv", H)),
                          head_dim=hd,
                          attn=Attn(qk_norm=p + "attn_q_norm.weight" in tensors,
                                    bias=p + "attn_q.bias" in tensors,
                                    rope_dim=int(field(r, f"{a}.rope.dimension_count", hd))),
                          **common)
    R = int(field(r, f"{a}.rope.dimension_count"))
    mla_k = field(r, f"{a}.attention.key_length_mla", 0, required=False)
    hd = int(mla_k) if mla_k else int(field(r, f"{a}.attention.key_length"))
    mla_v = field(r, f"{a}.attention.value_length_mla", 0, required=False)
    hv = int(mla_v) if mla_v else int(field(r, f"{a}.attention.value_length"))
    return ModelShape(arch=a, n_kv_head=H, head_dim=hd,
                      mla=Mla(int(field(r, f"{a}.attention.q_lora_rank", 0)),
                              int(field(r, f"{a}.attention.kv_lora_rank")), R, hv),
                      yarn=gguf_yarn_ds(r, a, path), **common)


def gguf_yarn_ds(r, a: str, path) -> Yarn | None:
    """deepseek2's rope scaling as llama.cpp reads it (None: plain RoPE).

    llama.cpp (src/models/deepseek2.cpp, llama-context.cpp): rope.scaling.yarn_log_multiplier L
    is 0.1 mscale_all_dim (the converter's legacy form, divided back by 0.1) and mscale is taken
    equal to mscale_all_dim, so cos/sin keep rope.scaling.attn_factor (default 1) and the softmax
    scale gains (attn_factor · (0.1 mscale_all_dim ln factor + 1))². The correction range comes
    from rope.scaling.original_context_length and the betas (the converter writes the config's;
    llama.cpp's loader reads none and uses 32 / 1, the values every DeepSeek release carries:
    strata reads the file's). A YaRN file without the log multiplier, or one carrying
    yarn_attn_factor / yarn_ext_factor (transformers and llama.cpp read those apart), is refused:
    strata does not guess which reading was meant."""
    from strata.rope_scaling import yarn_mscale
    kind = str(field(r, f"{a}.rope.scaling.type", "none"))
    factor = float(field(r, f"{a}.rope.scaling.factor", 0.0, required=False) or 0.0)
    if kind in ("none", "linear") and factor in (0.0, 1.0):
        return None
    if kind != "yarn":
        raise StrataError(f"{path}: {a}.rope.scaling.type {kind!r} with factor {factor:g}; "
                          f"strata reads deepseek2 with plain RoPE or yarn")
    log_mul = field(r, f"{a}.rope.scaling.yarn_log_multiplier", None, required=False)
    if log_mul is None:
        raise StrataError(f"{path}: yarn without {a}.rope.scaling.yarn_log_multiplier: llama.cpp "
                          f"and transformers scale such a file's attention differently; "
                          f"re-convert it with llama.cpp's convert_hf_to_gguf.py")
    for key, implied in (("yarn_attn_factor", None), ("yarn_ext_factor", 1.0)):
        v = field(r, f"{a}.rope.scaling.{key}", None, required=False)
        if v is not None and (implied is None or float(v) != implied):
            raise StrataError(f"{path}: {a}.rope.scaling.{key} = {float(v):g}: llama.cpp's "
                              f"deepseek2 ignores it and transformers applies it; strata does not "
                              f"guess which was meant")
    if factor <= 1.0:
        raise StrataError(f"{path}: yarn with {a}.rope.scaling.factor {factor:g}; it must be > 1")
    mscale_all = float(log_mul) / 0.1
    raf = float(field(r, f"{a}.rope.scaling.attn_factor", 1.0, required=False) or 1.0)
    return Yarn(float(f"{factor:.7g}"),
                int(field(r, f"{a}.rope.scaling.original_context_length")),
                beta_fast=float(field(r, f"{a}.rope.scaling.yarn_beta_fast", 32.0,
                                      required=False)),
                beta_slow=float(field(r, f"{a}.rope.scaling.yarn_beta_slow", 1.0,
                                      required=False)),
                truncate=True, attn=raf, kq=(raf * yarn_mscale(factor, mscale_all)) ** 2)


def join_kv_b(name: str, tensors: dict, shape: ModelShape, read) -> torch.Tensor | None:
    """attn_kv_b [H*(N+Hv), Lkv] of dense tensor `name` from its layer's attn_k_b / attn_v_b
    (None when absent, or for another name); `read(t, torch_shape)`: a tensor's values,
    F32/F16/BF16 or dequantized."""
    if not name.endswith("attn_kv_b.weight"):
        return None
    p = name[:-len("attn_kv_b.weight")]
    kb, vb = tensors.get(p + "attn_k_b.weight"), tensors.get(p + "attn_v_b.weight")
    if kb is None or vb is None:
        return None
    m = shape.mla
    H, R, L = shape.n_head, m.qk_rope, m.kv_lora
    N, Hv = shape.head_dim - R, m.v_head_dim
    k = read(kb, (H, L, N)).float().transpose(1, 2)                # [H, N, Lkv]
    v = read(vb, (H, Hv, L)).float()                               # [H, Hv, Lkv]
    return torch.cat([k, v], dim=1).reshape(H * (N + Hv), L)




# ---- the writer's side (strata.archs.gguf_layout) ----------------------------------------------
def split_kv_b(name: str, shp, shape: ModelShape) -> dict | None:
    """attn_kv_b [H*(N+Hv), Lkv] as llama.cpp's converter stores it: attn_k_b [H, Lkv, N] and
    attn_v_b [H, Hv, Lkv] (join_kv_b's inverse); None for any other tensor."""
    if not name.endswith("attn_kv_b.weight"):
        return None
    p = name[:-len("attn_kv_b.weight")]
    m = shape.mla
    H, L, N = shape.n_head, m.kv_lora, shape.head_dim - m.qk_rope
    return {p + "attn_k_b.weight": (H, L, N), p + "attn_v_b.weight": (H, m.v_head_dim, L)}


def gguf_values(shape: ModelShape) -> dict:
    """The metadata values that are not one ModelShape field, as llama.cpp's converter writes
    them: the sigmoid gate; GLM's rotary width; MLA's newer layout (head_count_kv 1, the latent's
    key / value widths, the per-head sizes in *_mla)."""
    out = {"expert_gating_func": SIGMOID}
    if shape.arch == "glm4moe":
        out["rope.dimension_count"] = shape.rot_dim
    m, y = shape.mla, shape.yarn
    if m:
        out |= {"attention.head_count_kv": 1,
                "attention.key_length": m.kv_lora + m.qk_rope,
                "attention.value_length": m.kv_lora,
                "attention.key_length_mla": shape.head_dim,
                "attention.value_length_mla": m.v_head_dim}
    if m and y is not None:   # gguf_yarn_ds's reading, inverted
        import math
        raf = y.attn or 1.0
        out |= {"rope.scaling.attn_factor": raf, "rope.scaling.yarn_log_multiplier":
                (math.sqrt(y.kq) / raf - 1.0) / math.log(y.factor)}
    return out
