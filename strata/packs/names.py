"""The dense tensors of a Qwen3-MoE pack: names (llama.cpp's GGUF names) and torch shapes.

The one description of what a pack's dense part holds; the writer, the reader, the GGUF and HF
importers and the synthesizer all read it. Shapes are torch order, [out, in] for matrices
(a GGUF `{in, out}` tensor read row-major is exactly this).

Another architecture brings its own tensor-name map, a module named in ARCH_NAMES (e.g.
strata.packs.names_mixtral): its `layer_specs(shape, i)`, and the HF and GGUF readers' hooks
(docs/architectures.md lists them). `arch_names(arch)` finds it; Qwen3-MoE's is this module.

Legend: D hidden, V vocabulary, E experts, H query heads, Hkv kv heads, hd head dim.
"""
from __future__ import annotations

import importlib

from strata.errors import StrataError
from strata.shapes import ModelShape

# Dense tensors that may be absent: the LM head when the embeddings are tied.
OPTIONAL = ("output.weight",)

# strata arch name -> its tensor-name map module (absent: Qwen3-MoE's, below)
ARCH_NAMES = {
    "mixtral": "strata.packs.names_mixtral",
    "gpt-oss": "strata.packs.names_gpt_oss",
}


def arch_names(arch: str):
    """The tensor-name map module of strata arch `arch`, None for qwen3moe (this module)."""
    mod = ARCH_NAMES.get(arch)
    return importlib.import_module(mod) if mod else None


def by_source(kind: str, name: str):
    """The tensor-name map whose HF model_type (kind "hf") or GGUF general.architecture (kind
    "gguf") is `name`, None when no other architecture claims it (then it is Qwen3-MoE's or
    unsupported: the Qwen3-MoE reader says which)."""
    for arch in ARCH_NAMES:
        m = arch_names(arch)
        if name in (m.HF_MODEL_TYPES if kind == "hf" else m.GGUF_ARCHS):
            return m
    return None


def global_specs(s: ModelShape) -> dict[str, tuple[int, ...]]:
    return {
        "token_embd.weight": (s.vocab, s.d_model),      # [V, D]
        "output_norm.weight": (s.d_model,),             # [D]
        "output.weight": (s.vocab, s.d_model),          # [V, D]  (absent when tied)
    }


def layer_specs(s: ModelShape, i: int) -> dict[str, tuple[int, ...]]:
    from strata.packs import names_ds
    if s.arch in names_ds.ARCHS:   # GLM-4.5, DeepSeek-V3: strata.packs.names_ds
        return names_ds.layer_specs_ds(s, i)
    m = arch_names(s.arch)   # Mixtral, GPT-OSS
    if m is not None:
        return m.layer_specs(s, i)
    q, kv = s.n_head * s.head_dim, s.n_kv_head * s.head_dim
    p = f"blk.{i}."
    return {
        p + "attn_norm.weight": (s.d_model,),           # [D]
        p + "attn_q.weight": (q, s.d_model),            # [H*hd, D]
        p + "attn_k.weight": (kv, s.d_model),           # [Hkv*hd, D]
        p + "attn_v.weight": (kv, s.d_model),           # [Hkv*hd, D]
        p + "attn_output.weight": (s.d_model, q),       # [D, H*hd]
        p + "attn_q_norm.weight": (s.head_dim,),        # [hd]
        p + "attn_k_norm.weight": (s.head_dim,),        # [hd]
        p + "ffn_norm.weight": (s.d_model,),            # [D]
        p + "ffn_gate_inp.weight": (s.n_expert, s.d_model),  # router [E, D]
    }


def dense_specs(s: ModelShape) -> dict[str, tuple[int, ...]]:
    """Every dense tensor of the model, name -> torch shape, in file order."""
    out = dict(global_specs(s))
    for i in range(s.n_layer):
        out.update(layer_specs(s, i))
    return out


def experts_name(i: int) -> str:
    """The pack tensor holding layer i's expert blobs, uint8 [E, blob_size]."""
    return f"blk.{i}.experts"


def check_dense(s: ModelShape, shapes: dict[str, tuple[int, ...]], where: str) -> None:
    """Refuse a dense set with missing, extra or mis-shaped tensors, naming the first problems."""
    want = dense_specs(s)
    missing = [n for n in want if n not in shapes and n not in OPTIONAL]
    extra = [n for n in shapes if n not in want]
    wrong = [f"{n} is {list(shapes[n])}, expected {list(want[n])}"
             for n in want if n in shapes and tuple(shapes[n]) != want[n]]
    problems = []
    if missing:
        problems.append(f"missing {', '.join(missing[:5])}" + (" ..." if len(missing) > 5 else ""))
    if extra:
        problems.append(f"unexpected {', '.join(extra[:5])}" + (" ..." if len(extra) > 5 else ""))
    if wrong:
        problems.append("; ".join(wrong[:5]))
    if problems:
        raise StrataError(f"{where}: dense tensors disagree with the model shape: "
                          + "; ".join(problems))
