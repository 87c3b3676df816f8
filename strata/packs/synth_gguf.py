"""`strata synth` as a GGUF file: random weights laid out as llama.cpp lays the architecture out
(its tensor names, types and metadata read from the architecture's record through
strata.archs.gguf_layout), with synth's BPE tokenizer (strata.packs.synth_vocab), so llama.cpp
loads and runs the file and `strata pack` reads it back as the same shape.

Draws: tensor k of the file (llama.cpp's order) is drawn from the seed [seed, k] (the same draw
strata.packs.synth.synth_dense makes for a dense tensor the file holds whole); experts as raw
block bytes (strata.packs.randblocks), GPT-OSS's expert biases fp32 N(0, BIAS_SIGMA^2).
strata.packs.synth.synth_pack makes the same draws from the same seeds, so `synth --pack`
writes the pack that `strata pack` makes of this file.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from strata.archs.gguf_layout import file_order, gguf_arch, metadata
from strata.errors import StrataError
from strata.formats.table import get_format
from strata.packs.synth_draws import (ExpertFormats, Mix, _dense_type, _per_layer, _seed,
                                      dense_tensor, expert_bias, expert_matrix)
from strata.packs.synth_vocab import _vocab
from strata.shapes import ModelShape

# general.file_type of a file whose experts are all one type (llama.cpp's LLAMA_FTYPE_MOSTLY_*)
_FTYPE = {"Q8_0": 7, "Q4_0": 2, "Q5_0": 8, "Q4_K": 15, "Q6_K": 18, "BF16": 32, "F16": 1,
          "F32": 0, "MXFP4": 38}


def _bytes_shape(shp, tname: str) -> tuple[int, ...]:
    """A tensor of torch shape `shp` as uint8 bytes of ggml type `tname` (rows of row_bytes)."""
    f = get_format(tname)
    if len(shp) == 1:   # norms, biases: F32
        return (shp[0] * f.block_bytes,)
    return (*shp[:-1], f.row_bytes(shp[-1]))


def _plan(shape: ModelShape, per_layer, dense_type: str, dense_types):
    """[(name, ggml type name, byte shape, maker(seed) -> uint8 array)] in the file's order."""
    plan = []
    for name, shp, is_expert in file_order(shape):
        if not is_expert:
            dt = _dense_type(name, dense_type, dense_types)
            plan.append((name, dt, _bytes_shape(shp, dt), lambda s, name=name, shp=shp, dt=dt:
                         dense_tensor(name, shp, shape, s, dt)))
            continue
        i, which = int(name.split(".")[1]), name.split(".")[2][len("ffn_"):-len("_exps")]
        if name.endswith(".bias"):
            plan.append((name, "F32", _bytes_shape(shp, "F32"),
                         lambda s, shp=shp: expert_bias(shp, s).view(np.uint8).reshape(-1)))
            continue
        fmt = get_format(getattr(per_layer[i], which)).name
        plan.append((name, fmt, _bytes_shape(shp, fmt),
                     lambda s, which=which, fmt=fmt: expert_matrix(which, fmt, shape, s)))
    return plan


def _check_types(names) -> None:
    import gguf
    for tname in names:
        if tname not in gguf.GGMLQuantizationType.__members__:
            raise StrataError(f"{tname} has no GGUF type in gguf-py; write a pack directly "
                              f"with synth_pack (strata synth --pack)")


def _add_metadata(w, shape: ModelShape) -> None:
    """The record's hparams, each in the GGUF type llama.cpp's converter writes it in."""
    a = gguf_arch(shape)
    for key, v in metadata(shape).items():
        k = f"{a}.{key}"
        if isinstance(v, bool):
            w.add_bool(k, v)
        elif isinstance(v, int):
            w.add_uint32(k, v)
        elif isinstance(v, float):
            w.add_float32(k, v)
        elif isinstance(v, str):
            w.add_string(k, v)
        elif isinstance(v, list):   # a per-layer array (which layers are recurrent)
            w.add_array(k, v)
        else:
            raise TypeError(f"{k}: {v!r}")


def _add_tokenizer(w, shape: ModelShape) -> None:
    tokens, types, merges, eos = _vocab(shape.vocab)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_eos_token_id(eos)
    w.add_pad_token_id(eos)
    w.add_bos_token_id(eos)
    w.add_add_bos_token(False)


def synth_gguf(path, shape: ModelShape, fmts: ExpertFormats | list[ExpertFormats] | Mix =
               ExpertFormats(), seed: int = 0, dense_type: str = "BF16",
               progress: bool = True) -> Path:
    """Write a GGUF of `shape`'s architecture with random weights; tensors are made and written
    one at a time. `fmts`: expert formats for all layers, one per layer, or a whole Mix (dense
    types too). Deterministic: the same arguments give the same bytes."""
    import gguf
    mix = fmts if isinstance(fmts, Mix) else None
    per_layer = _per_layer(shape, mix.experts if mix else fmts)
    _check_types(get_format(getattr(f, w)).name for f in per_layer for w in ("gate", "up", "down"))
    plan = _plan(shape, per_layer, dense_type, mix.dense if mix else None)
    _check_types(p[1] for p in plan)
    path = Path(path)
    w = gguf.GGUFWriter(str(path), gguf_arch(shape))
    f0 = per_layer[shape.moe_layers[0]] if shape.moe_layers else per_layer[0]
    w.add_name(f"strata-synth {shape.arch} {shape.n_layer}L E{shape.n_expert} "
               + (mix.name if mix else f"{f0.gate}/{f0.up}/{f0.down}"))
    w.add_file_type(int(gguf.LlamaFileType[f"MOSTLY_{mix.name}"]) if mix else
                    _FTYPE.get(f0.gate, 7))
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    _add_metadata(w, shape)
    _add_tokenizer(w, shape)
    w.add_string("strata.synth.seed", str(seed))
    for name, tname, bshape, _ in plan:
        w.add_tensor_info(name, bshape, np.dtype(np.uint8), int(np.prod(bshape)),
                          raw_dtype=gguf.GGMLQuantizationType[tname])
    tmp = path.with_name(path.name + ".partial")
    w.write_header_to_file(tmp)
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=sum(int(np.prod(p[2])) for p in plan), unit="B", unit_scale=True,
                   desc=f"synth {path.name}", file=sys.stderr)
    try:
        for k, (name, _, bshape, make) in enumerate(plan):
            arr = make(_seed(seed, k))
            w.write_tensor_data(np.ascontiguousarray(arr).reshape(bshape))
            if bar is not None:
                bar.update(int(np.prod(bshape)))
        w.close()
        tmp.replace(path)
    except BaseException:
        w.close()
        if tmp.exists():
            tmp.unlink()
        raise
    finally:
        if bar is not None:
            bar.close()
    return path
