"""An architecture as one record: its names in each source, its model wiring, its tensor-name
map, its readers' hooks, its options, its presets and its hparam tables.

Legend: D hidden, E experts, F expert width, i / l a layer.

Every part of strata that differs by architecture reads it here (strata.archs.registry finds
the record by strata name, HF model_type or GGUF general.architecture):
- `wiring`: the model class (strata.models): `from_tensors(shape, tensors, device=, dtype=,
  ffn=, device_map=)`; `build` checks the tensors against `layer_specs` first.
- `layer_specs(shape, i)`: layer i's dense tensors, llama.cpp's names -> torch shapes (the one
  description the pack writer, reader, importers, synthesizer and planner read).
- HF folder hooks: `hf_shape(cfg, where)` -> ModelShape; `hf_dense(ts, name)` -> the tensor
  of a pack name; `hf_experts(ts, i, shape)` -> (gate [E, F, D], up [E, F, D], down [E, D, F],
  (gate [E, F], up [E, F], down [E, D]) biases or None).
- GGUF hooks: `gguf_shape(r, path)` -> ModelShape (r: gguf-py's reader); `gguf_dense(name, x,
  shape)` -> x as strata holds it (e.g. Mixtral's q/k un-permuted); `gguf_join(name, tensors,
  shape, read)` -> a dense tensor the file stores split (None: absent); `gguf_experts(tensors,
  i, shape, src)` -> ([gate, up, down] bytes, format names, biases or None).
- `gguf_hparams` / `hf_hparams`: every metadata key / config field and what strata does with it
  (strata.archs.hparam_kinds), the audit's tables (strata.packs.hparams); `hf_hparams_of`: the
  table of an HF model_type whose config differs (a multimodal release's top level), by name.
- GGUF writer hooks (strata.archs.gguf_layout, the inverse of the GGUF hooks): `gguf_split(name,
  shp, shape)` -> {stored name: torch shape} of a dense tensor llama.cpp stores split (None: as
  it is); `gguf_values(shape)` -> {key: value} for the metadata keys whose value is not one
  ModelShape field (the table names the field of the others).
- `options`: the option groups its shapes set (types of strata.shapes.OPTION_GROUPS: its own
  GptOssOptions, a sliding Window, Yarn, Mla, DenseFfn, a sigmoid Router, Attn details); every
  other group of its shapes stays None or at its default (`own_options`).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from strata.archs.dense import global_specs, refuse_mismatch
from strata.shapes import ModelShape


def _same(name, x, shape):
    return x


def _nothing(name, tensors, shape, read):
    return None


def _no_split(name, shp, shape):
    return None


def _no_values(shape):
    return {}


@dataclass(frozen=True)
class Arch:
    name: str                          # strata's name: ModelShape.arch, a pack's header
    hf_types: tuple[str, ...]          # config.json model_type(s)
    gguf_archs: tuple[str, ...]        # GGUF general.architecture name(s)
    wiring: type                       # the model class
    layer_specs: Callable[[ModelShape, int], dict[str, tuple[int, ...]]]
    hf_shape: Callable
    hf_dense: Callable
    hf_experts: Callable
    gguf_shape: Callable
    gguf_experts: Callable
    gguf_hparams: Mapping
    hf_hparams: Mapping
    gguf_dense: Callable = _same
    gguf_join: Callable = _nothing
    options: tuple[type, ...] = ()
    gguf_split: Callable = _no_split
    gguf_values: Callable = _no_values
    hf_hparams_of: Mapping = None     # model_type -> its table where not hf_hparams

    def hf_table(self, model_type: str) -> Mapping:
        """The HF hparam table of `model_type` (one of hf_types)."""
        return (self.hf_hparams_of or {}).get(model_type, self.hf_hparams)

    def dense_specs(self, shape: ModelShape) -> dict[str, tuple[int, ...]]:
        """Every dense tensor of the model, name -> torch shape, in file order."""
        out = dict(global_specs(shape))
        for i in range(shape.n_layer):
            out.update(self.layer_specs(shape, i))
        return out

    def own_options(self, shape: ModelShape) -> bool:
        """Whether `shape` sets only option groups this record declares (`options`)."""
        return all(type(g) in self.options for g in shape.option_groups())

    @property
    def presets(self) -> dict[str, ModelShape]:
        """The presets of this architecture (strata.shapes.PRESETS holds them all)."""
        from strata.shapes import PRESETS
        return {n: s for n, s in PRESETS.items() if s.arch == self.name}

    def build(self, shape: ModelShape, tensors, **kw):
        """The wiring from dense tensors, checked against the name map first (one line naming
        the tensors that are missing, extra or mis-shaped)."""
        refuse_mismatch(self.dense_specs(shape), {n: tuple(t.shape) for n, t in tensors.items()},
                        "model weights")
        return self.wiring.from_tensors(shape, tensors, **kw)
