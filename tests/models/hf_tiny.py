"""A tiny random Qwen3-MoE built with Hugging Face transformers (no downloads), and a direct
HF -> strata conversion used to test the model without a pack (BF16 expert blobs)."""
from __future__ import annotations

import torch

from strata.blob import BlobLayout
from strata.shapes import ModelShape

HF_TO_GGUF = {  # per layer, HF suffix -> llama.cpp name
    "input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
    "post_attention_layernorm": "ffn_norm", "mlp.gate": "ffn_gate_inp",
}

TINY = ModelShape("qwen3moe", n_layer=2, d_model=64, n_expert=8, top_k=2, d_expert=32, n_head=4,
                  n_kv_head=2, head_dim=16, vocab=256, rope_theta=10000.0)


# A second shape: 3 layers, MQA (Hkv = 1), K = 4 of 16 experts, hd 32, theta 1e6 (Qwen3's).
TINY_B = ModelShape("qwen3moe", n_layer=3, d_model=64, n_expert=16, top_k=4, d_expert=32, n_head=4,
                    n_kv_head=1, head_dim=32, vocab=192, rope_theta=1_000_000.0)


def make_hf_model(shape: ModelShape = TINY, seed: int = 0, tied: bool = False):
    """A Qwen3MoeForCausalLM in fp32 whose weights are all exactly representable in BF16, so a
    BF16 pack stores them losslessly and only arithmetic order separates strata from HF.
    Weights are scaled like a trained model (≈ 1/sqrt(fan_in)) so that routing is decisive and
    activations stay O(1) - the default 0.02 init gives near-uniform routing that a tie can flip."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
    cfg = Qwen3MoeConfig(
        vocab_size=shape.vocab, hidden_size=shape.d_model, intermediate_size=4 * shape.d_model,
        moe_intermediate_size=shape.d_expert, num_hidden_layers=shape.n_layer,
        num_attention_heads=shape.n_head, num_key_value_heads=shape.n_kv_head,
        head_dim=shape.head_dim, num_experts=shape.n_expert, num_experts_per_tok=shape.top_k,
        norm_topk_prob=shape.norm_topk_prob, rms_norm_eps=shape.rms_eps,
        max_position_embeddings=512, tie_word_embeddings=tied,
        rope_parameters={"rope_type": "default", "rope_theta": shape.rope_theta})
    cfg._attn_implementation = "sdpa"
    g = torch.Generator().manual_seed(seed)
    model = Qwen3MoeForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1:   # norm weights around 1
                w = 1.0 + 0.1 * torch.randn(p.shape, generator=g)
            elif "embed_tokens" in name:
                w = torch.randn(p.shape, generator=g)
            else:             # [out, in] (or [E, out, in]): 1/sqrt(in)
                w = torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5
                if name.endswith("mlp.gate.weight"):
                    w = w * 4.0  # decisive routing, as in a trained router
            p.copy_(w.to(torch.bfloat16).float())
    return model


def hf_state(model) -> dict[str, torch.Tensor]:
    """The checkpoint as save_pretrained writes it (per-expert names)."""
    import tempfile
    from safetensors.torch import load_file
    with tempfile.TemporaryDirectory() as d:
        model.save_pretrained(d)
        return load_file(f"{d}/model.safetensors")


def to_strata(sd: dict[str, torch.Tensor], shape: ModelShape):
    """(dense tensors by llama.cpp name, per-layer uint8 expert blobs, per-layer BF16 layouts)."""
    dense = {"token_embd.weight": sd["model.embed_tokens.weight"],
             "output_norm.weight": sd["model.norm.weight"], "output.weight": sd["lm_head.weight"]}
    lay = BlobLayout.make(shape.d_model, shape.d_expert, "BF16")
    blobs = []
    for l in range(shape.n_layer):
        pre = f"model.layers.{l}."
        for hf, gg in HF_TO_GGUF.items():
            dense[f"blk.{l}.{gg}.weight"] = sd[pre + hf + ".weight"]
        arena = torch.zeros(shape.n_expert, lay.size, dtype=torch.uint8)
        for e in range(shape.n_expert):
            for m, hf in zip(lay.matrices, ("gate_proj", "up_proj", "down_proj")):
                w = sd[f"{pre}mlp.experts.{e}.{hf}.weight"].to(torch.bfloat16).contiguous()
                arena[e, m.offset:m.offset + m.nbytes] = w.view(torch.uint8).reshape(-1)
        blobs.append(arena)
    return dense, blobs, [lay] * shape.n_layer


def quantize_roundtrip(w: torch.Tensor, fmt: str) -> torch.Tensor:
    """w [rows, cols] fp32 -> dequant(quant(w)) fp32 through gguf-py: the weights a quantized
    blob really holds (used to give HF the same expert weights as a quantized strata pack)."""
    import gguf
    q = gguf.GGMLQuantizationType[fmt]
    return torch.from_numpy(gguf.quants.dequantize(gguf.quants.quantize(w.numpy(), q), q)).float()


def quantize_blob_bytes(w: torch.Tensor, fmt: str) -> torch.Tensor:
    """w [rows, cols] fp32 -> uint8 bytes of the matrix in ggml format `fmt` (rows contiguous)."""
    import gguf
    q = gguf.quants.quantize(w.float().numpy(), gguf.GGMLQuantizationType[fmt])
    return torch.from_numpy(q.view("uint8").reshape(-1).copy())


def requantize_experts(model, fmt: str) -> None:
    """Replace every HF expert matrix by dequant(quant(w)) in `fmt`, in place (HF v5 keeps the
    experts fused: gate_up_proj [E, 2F, D], down_proj [E, D, F])."""
    with torch.no_grad():
        for layer in model.model.layers:
            ex = layer.mlp.experts
            for e in range(ex.gate_up_proj.shape[0]):
                ex.gate_up_proj[e] = quantize_roundtrip(ex.gate_up_proj[e], fmt)
                ex.down_proj[e] = quantize_roundtrip(ex.down_proj[e], fmt)


def to_strata_quant(sd: dict[str, torch.Tensor], shape: ModelShape, fmt: str):
    """Like `to_strata` with expert blobs quantized to `fmt` by gguf-py."""
    dense, _, _ = to_strata(sd, shape)
    lay = BlobLayout.make(shape.d_model, shape.d_expert, fmt)
    blobs = []
    for l in range(shape.n_layer):
        arena = torch.zeros(shape.n_expert, lay.size, dtype=torch.uint8)
        for e in range(shape.n_expert):
            for m, hf in zip(lay.matrices, ("gate_proj", "up_proj", "down_proj")):
                w = sd[f"model.layers.{l}.mlp.experts.{e}.{hf}.weight"]
                arena[e, m.offset:m.offset + m.nbytes] = quantize_blob_bytes(w, fmt)
        blobs.append(arena)
    return dense, blobs, [lay] * shape.n_layer
