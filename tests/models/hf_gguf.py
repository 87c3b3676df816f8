"""Write a Hugging Face Qwen3-MoE checkpoint as a llama.cpp-style `qwen3moe` GGUF (gguf-py's
writer): the metadata keys and tensor names convert_hf_to_gguf.py writes, expert matrices
stacked per layer (`ffn_{gate,up,down}_exps`, ggml shapes {D, F, E} / {F, D, E}) in `expert_fmt`,
dense matrices F32 (norms always F32, as llama.cpp keeps them)."""
from __future__ import annotations

import numpy as np
import torch

from strata.shapes import ModelShape
from tests.models.hf_tiny import HF_TO_GGUF


def write_gguf(sd: dict[str, torch.Tensor], shape: ModelShape, path, expert_fmt: str = "BF16"):
    import gguf
    arch = "qwen3moe"
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(shape.n_layer)
    w.add_context_length(shape.max_pos)
    w.add_embedding_length(shape.d_model)
    w.add_feed_forward_length(4 * shape.d_model)
    w.add_head_count(shape.n_head)
    w.add_head_count_kv(shape.n_kv_head)
    w.add_key_length(shape.head_dim)
    w.add_value_length(shape.head_dim)
    w.add_rope_freq_base(shape.rope_theta)
    w.add_layer_norm_rms_eps(shape.rms_eps)
    w.add_expert_count(shape.n_expert)
    w.add_expert_used_count(shape.top_k)
    w.add_expert_feed_forward_length(shape.d_expert)
    w.add_vocab_size(shape.vocab)

    def f32(name, t):
        w.add_tensor(name, t.float().contiguous().numpy())

    f32("token_embd.weight", sd["model.embed_tokens.weight"])
    f32("output_norm.weight", sd["model.norm.weight"])
    f32("output.weight", sd["lm_head.weight"])
    qtype = gguf.GGMLQuantizationType[expert_fmt]
    for l in range(shape.n_layer):
        pre = f"model.layers.{l}."
        for hf, gg in HF_TO_GGUF.items():
            f32(f"blk.{l}.{gg}.weight", sd[pre + hf + ".weight"])
        for hf, gg in (("gate_proj", "ffn_gate_exps"), ("up_proj", "ffn_up_exps"),
                       ("down_proj", "ffn_down_exps")):
            stack = torch.stack([sd[f"{pre}mlp.experts.{e}.{hf}.weight"]
                                 for e in range(shape.n_expert)]).float().numpy()  # [E, out, in]
            q = gguf.quants.quantize(np.ascontiguousarray(stack), qtype)
            w.add_tensor(f"blk.{l}.{gg}.weight", q, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
