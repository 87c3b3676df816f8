"""How llama.cpp lays a model of each architecture out in a GGUF file, read from the
architecture's record (strata.archs.record.Arch): the stored tensors (the record's name map,
with the tensors llama.cpp's converter stores split) and the metadata (the record's GGUF hparam
table: the ModelShape field each key holds). What `strata synth` writes (strata.packs.synth_gguf).

Legend: D hidden, E experts, F expert width; torch shapes ([out, in] for matrices; a GGUF lists
the reverse, ggml's ne).
"""
from __future__ import annotations

from strata.archs.hparam_kinds import INERT, REFUSED, USED, OneOf, SameAs
from strata.archs.registry import get_arch
from strata.shapes import ModelShape, Yarn


def gguf_arch(shape: ModelShape) -> str:
    """The general.architecture llama.cpp stores this architecture under."""
    return get_arch(shape.arch).gguf_archs[0]


def stored_dense(shape: ModelShape, names=None) -> dict[str, tuple[int, ...]]:
    """The dense tensors of the file (name -> torch shape), a layer's together: the record's
    dense_specs, each tensor llama.cpp stores split (gguf_split) as its parts. `names`: only
    these of dense_specs."""
    a = get_arch(shape.arch)
    out = {}
    for name, shp in a.dense_specs(shape).items():
        if names is None or name in names:
            out.update(a.gguf_split(name, shp, shape) or {name: shp})
    return out


def expert_tensors(shape: ModelShape, i: int) -> dict[str, tuple[int, ...]]:
    """Layer i's routed experts as llama.cpp stores them (none on a leading dense layer):
    ffn_{gate,up}_exps [E, F, D], ffn_down_exps [E, D, F], and with biased experts (GPT-OSS)
    ffn_{gate,up}_exps.bias [E, F], ffn_down_exps.bias [E, D] (F32)."""
    if not shape.is_moe_layer(i):
        return {}
    E, D, F = shape.n_expert, shape.d_model, shape.d_expert
    p = f"blk.{i}."
    out = {p + "ffn_gate_exps.weight": (E, F, D), p + "ffn_up_exps.weight": (E, F, D),
           p + "ffn_down_exps.weight": (E, D, F)}
    if shape.expert_bias:
        out |= {p + "ffn_gate_exps.bias": (E, F), p + "ffn_up_exps.bias": (E, F),
                p + "ffn_down_exps.bias": (E, D)}
    return out


def file_order(shape: ModelShape) -> list[tuple[str, tuple[int, ...], bool]]:
    """[(name, torch shape, is an expert tensor)] in the order llama.cpp's converter writes:
    token_embd, each layer's dense tensors then its experts, output_norm, output."""
    dense = stored_dense(shape)
    out = [("token_embd.weight", dense["token_embd.weight"], False)]
    for i in range(shape.n_layer):
        out += [(n, s, False) for n, s in dense.items() if n.startswith(f"blk.{i}.")]
        out += [(n, s, True) for n, s in expert_tensors(shape, i).items()]
    return out + [(n, dense[n], False) for n in ("output_norm.weight", "output.weight")]


# keys llama.cpp reads, when absent, as the key without the suffix (the sliding layers' sizes,
# the output width): the equal value is left out, as the converter leaves it
_DEFAULTS_TO_ITS_BASE = ("_swa", "_out")


def _value(v):
    return "yarn" if isinstance(v, Yarn) else v   # rope.scaling.type names the group


def metadata(shape: ModelShape) -> dict[str, object]:
    """{key (without the "<arch>." prefix): value} of every hparam the record's GGUF table
    names: a used or inert key with one ModelShape field holds that field (the first key of a
    field only: nextn_predict_layers is not block_count); a key refused unless equal to another
    key holds that key's value (llama.cpp's default for an absent value_length or
    rope.dimension_count is D / H, not the head size), but for _DEFAULTS_TO_ITS_BASE; a key refused unless one value, whose absence llama.cpp reads
    otherwise, holds that value; the record's gguf_values give the rest. RoPE scaling keys only
    for a scaled model; per-layer (array) keys are left to llama.cpp's defaults."""
    a = get_arch(shape.arch)
    fixed = a.gguf_values(shape)
    out, fields_done = {}, set()
    for key, hp in a.gguf_hparams.items():
        if key in fixed:
            out[key] = fixed[key]
            continue
        if key.startswith("rope.scaling.") and shape.yarn is None or hp.array:
            continue
        if hp.kind in (USED, INERT) and len(hp.fields) == 1:
            f = hp.fields[0]
            if f in fields_done:
                continue
            fields_done.add(f)
            out[key] = _value(shape.field(f))
        elif hp.kind == REFUSED and isinstance(hp.ok, SameAs) and hp.ok.key in out \
                and not key.endswith(_DEFAULTS_TO_ITS_BASE):
            out[key] = out[hp.ok.key]
        elif hp.kind == REFUSED and hp.missing and isinstance(hp.ok, OneOf) \
                and len(hp.ok.values) == 1:
            out[key] = hp.ok.values[0]
    return out
