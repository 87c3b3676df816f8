"""Hugging Face checkpoint folder (config.json + *.safetensors) -> pack.

The architecture's record (strata.archs.registry, found by config.json's model_type) reads the
shape (`hf_shape`), the dense tensors (`hf_dense`) and a layer's experts (`hf_experts`: gate,
up, down and their biases, if any), which are quantized to the chosen formats; dense weights
keep their dtype. A leading dense layer (DeepSeek, GLM-4.5) has no experts.
"""
from __future__ import annotations

import json
from pathlib import Path

from strata.archs.hf_tensors import SafeTensors
from strata.archs.names import dense_specs
from strata.errors import StrataError
from strata.packs.blobs import assemble_blobs
from strata.packs.quantize import quantize_rows
from strata.shapes import ModelShape

def hf_folder(src: Path):
    """(config.json, the shape strata reads from it, the architecture's record) of a HF folder;
    the config audited (strata.packs.hparams) and refused in one line where strata would read
    it wrong."""
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
    from strata.archs.registry import by_hf
    from strata.packs.file import check_shape
    arch = by_hf(cfg.get("model_type"), src)
    s = arch.hf_shape(cfg, src)
    check_shape(s, cfgp)
    return cfg, s, arch


def hf_folder_shape(src) -> ModelShape:
    """The shape `strata pack` reads from a HF folder (strata.packs.provenance checks a pack's
    against it)."""
    return hf_folder(Path(src))[1]


def hf_to_pack(src, out, quant="BF16", quant_gate=None, quant_up=None, quant_down=None,
               progress: bool = True):
    """Write a pack from a HF folder; experts quantized to `quant` (per-matrix overrides).
    The folder's tokenizer (tokenizer.json, or the slow files through transformers) is carried."""
    from strata.packs.writer import write_pack
    from strata.packs.provenance import hf_record
    from strata.packs.synth import ExpertFormats
    from strata.tokenize import hf_tokenizer
    src = Path(src)
    cfg, s, arch = hf_folder(src)
    fmts = ExpertFormats.of(quant, quant_gate, quant_up, quant_down)
    lay = fmts.layout(s)
    ts = SafeTensors(src)
    ts.shape = s
    dense = {}
    tied = "lm_head.weight" not in ts
    for name in dense_specs(s):
        if tied and name == "output.weight":
            continue
        dense[name] = arch.hf_dense(ts, name)

    def layer(i):
        def make():
            g, u, d, bias = arch.hf_experts(ts, i, s)
            return assemble_blobs(lay, quantize_rows(g, fmts.gate), quantize_rows(u, fmts.up),
                                  quantize_rows(d, fmts.down), s.n_expert, bias=bias)
        return make
    return write_pack(out, s, dense, [layer(i) for i in range(s.n_layer)], lay, native=True,  # plain ggml row layouts
                      source=f"hf:{src.name}", progress=progress, tokenizer=hf_tokenizer(src),
                      provenance=hf_record(cfg))
