"""llama.cpp's stock quantization mixes: which ggml type each tensor of a model gets.

The rules are those of llama.cpp's `llama_tensor_get_type` (src/llama-quant.cpp) for the mixes
people download most, restated for the tensors a GGUF holds (strata.archs.gguf_layout; a dense
layer's and a shared expert's ffn_down take ffn_down's rule by their layer, ffn_gate / ffn_up
and MLA's projections the default: llama.cpp counts its ffn_down tensors in file order instead,
so on a model with leading dense layers or shared experts a Q4_K_M file may differ in which
ffn_down tensors get Q6_K):

    mix      default  ffn_down_exps (layer i of n)                 attn_v (layer i)
    Q4_K_M   Q4_K     Q6_K where use_more_bits(i, n)               Q6_K where use_more_bits(i, n)
    Q5_K_M   Q5_K     Q6_K where use_more_bits(i, n)               Q6_K where use_more_bits(i, n)
    Q3_K_M   Q3_K     Q5_K for i < n/16, else Q4_K                  Q5_K for i < 2, else Q4_K
    Q2_K     Q2_K     Q3_K                                          Q4_K if n_gqa >= 4, else Q3_K
    IQ4_XS   IQ4_XS   Q5_K for i < n/8 (no imatrix), else IQ4_XS    Q5_K if n_gqa >= 4
    MXFP4_MOE: every 3-D tensor (the experts) MXFP4, every other matrix Q8_0 (the LM head too)

    use_more_bits(i, n): i < n/8 or i >= 7n/8 or (i - n/8) % 3 == 2 (C integer division)

ffn_gate_exps / ffn_up_exps / attn_q / token_embd take the default; output.weight takes Q6_K;
attn_output takes Q3_K (Q2_K) / Q4_K (Q3_K_M); with exactly 8 experts (Mixtral's case) attn_v
and attn_k take Q8_0 and attn_output Q5_K. Norms, the router and the DeltaNet's short conv
(ssm_conv1d) stay F32 (never quantized). A tensor whose rows (ggml ne[0], the input width) are
not whole blocks of its type falls back as llama.cpp's `tensor_type_fallback` does: IQ* ->
IQ4_NL, Q2_K/Q3_K -> Q4_0, Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, and F16 when even 32 does
not divide the row.
"""
from __future__ import annotations

from strata.errors import StrataError
from strata.formats.table import get_format
from strata.archs.gguf_layout import stored_dense
from strata.shapes import ModelShape

DEFAULT = {"Q4_K_M": "Q4_K", "Q5_K_M": "Q5_K", "Q3_K_M": "Q3_K", "Q2_K": "Q2_K",
           "IQ4_XS": "IQ4_XS", "MXFP4_MOE": "MXFP4"}
MIXES = tuple(DEFAULT)

_FALLBACK = {"IQ1_S": "IQ4_NL", "IQ1_M": "IQ4_NL", "IQ2_XXS": "IQ4_NL", "IQ2_XS": "IQ4_NL",
             "IQ2_S": "IQ4_NL", "IQ3_XXS": "IQ4_NL", "IQ3_S": "IQ4_NL", "IQ4_XS": "IQ4_NL",
             "Q2_0": "Q4_0", "Q2_K": "Q4_0", "Q3_K": "Q4_0", "Q4_K": "Q5_0", "Q5_K": "Q5_1",
             "Q6_K": "Q8_0"}


def use_more_bits(i: int, n: int) -> bool:
    """llama.cpp's layer pick for more bits: the first and last eighth and every third between."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def fallback(qtype: str, ncols: int) -> str:
    """The type llama.cpp stores a tensor of rows of `ncols` weights in when it asked `qtype`."""
    if ncols % get_format(qtype).block == 0:
        return qtype
    alt = _FALLBACK.get(qtype)
    if alt is None:
        raise StrataError(f"no fallback for {qtype} rows of {ncols} weights")
    return alt if ncols % get_format(alt).block == 0 else "F16"


def _check(mix: str) -> str:
    m = mix.strip().upper()
    if m not in DEFAULT:
        raise StrataError(f"unknown mix {mix!r}; strata writes llama.cpp's {', '.join(MIXES)}")
    return m


def _asked(mix: str, kind: str, i: int, shape: ModelShape, imatrix: bool) -> str:
    """llama.cpp's choice for tensor `kind` of layer i, before the row-length fallback."""
    n, t = shape.n_layer, DEFAULT[mix]
    e8 = shape.n_expert == 8
    if mix == "MXFP4_MOE":   # experts (3-D) MXFP4, every other matrix Q8_0
        return "MXFP4"          # (expert_types asks only for experts; dense_types below)
    if kind == "output":
        return "Q6_K"
    if kind == "attn_v":
        gqa = shape.n_head // shape.n_kv_head
        if mix == "Q2_K":
            t = "Q4_K" if gqa >= 4 else "Q3_K"
        elif mix == "Q3_K_M":
            t = "Q5_K" if i < 2 else "Q4_K"
        elif mix == "IQ4_XS" and gqa >= 4:
            t = "Q5_K"
        elif mix in ("Q4_K_M", "Q5_K_M") and use_more_bits(i, n):
            t = "Q6_K"
        return "Q8_0" if e8 else t
    if kind == "attn_k":
        return "Q8_0" if e8 else t
    if kind == "ffn_down":
        if mix == "Q2_K":
            return "Q3_K"
        if mix == "Q3_K_M":
            return "Q5_K" if i < n // 16 else "Q4_K"
        if mix in ("Q4_K_M", "Q5_K_M"):
            return "Q6_K" if use_more_bits(i, n) else t
        if mix == "IQ4_XS" and i < n // 8 and not imatrix:
            return "Q5_K"
        return t
    if kind == "attn_output":
        if e8:
            return "Q5_K" if mix in ("Q2_K", "Q3_K_M", "Q4_K_M", "IQ4_XS") else t
        return {"Q2_K": "Q3_K", "Q3_K_M": "Q4_K"}.get(mix, t)
    return t   # token_embd, attn_q, ffn_gate, ffn_up


def expert_types(mix: str, shape: ModelShape, imatrix: bool = False) -> list[tuple[str, str, str]]:
    """Per layer, the stored (gate, up, down) types of the expert tensors under `mix`."""
    mix = _check(mix)
    D, F = shape.d_model, shape.d_expert
    return [(fallback(_asked(mix, "ffn_gate", i, shape, imatrix), D),
             fallback(_asked(mix, "ffn_up", i, shape, imatrix), D),
             fallback(_asked(mix, "ffn_down", i, shape, imatrix), F)) for i in range(shape.n_layer)]


# names llama-quantize never quantizes (llama-quant.cpp's tensor_allows_quantization, the ones
# strata's architectures have): the routers and the DeltaNet's short conv (its CUDA ssm_conv
# asserts an F32 weight), which llama.cpp's converter writes in F32
KEPT_F32 = ("ffn_gate_inp.weight", "ssm_conv1d")


def dense_types(mix: str, shape: ModelShape, imatrix: bool = False) -> dict[str, str]:
    """Stored type of every dense tensor under `mix`: what llama-quantize leaves as its
    converter wrote it (F32: the 1-D tensors, the router, the DeltaNet conv; KEPT_F32) and the
    rule's type for the rest."""
    mix = _check(mix)
    out = {}
    for name, shp in stored_dense(shape).items():
        if len(shp) == 1 or any(k in name for k in KEPT_F32):
            out[name] = "F32"
            continue
        i = int(name.split(".")[1]) if name.startswith("blk.") else 0
        kind = {"output.weight": "output", "token_embd.weight": "token_embd"}.get(name) or \
            name.split(".")[2]   # attn_q / attn_k / attn_v / attn_output / ffn_down_shexp ...
        if kind.startswith("ffn_down"):   # a dense layer's or the shared expert's: ffn_down's rule
            kind = "ffn_down"
        elif kind.startswith(("ffn_gate", "ffn_up")):
            kind = kind[:kind.index("_", 4)] if kind.count("_") > 1 else kind
        if mix == "MXFP4_MOE":   # llama.cpp: a 3-D tensor (MLA's attn_k_b / attn_v_b) MXFP4
            out[name] = fallback("MXFP4" if len(shp) == 3 else "Q8_0", shp[-1])
            continue
        out[name] = fallback(_asked(mix, kind, i, shape, imatrix), shp[-1])
    return out
