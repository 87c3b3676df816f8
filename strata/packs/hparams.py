"""Every hyperparameter a model file carries, per architecture, and what strata does with it;
the audit that refuses a file carrying one strata would otherwise drop.

    GGUF[arch][suffix]     GGUF key "{arch}.{suffix}" (llama.cpp's LLM_KV names, llama-arch.cpp)
    GGUF_GLOBAL[key]       the general.* / split.* keys llama.cpp's loader reads (whole names)
    HF[model_type][name]   a config.json field; "rope_parameters.<sub>" a field of its RoPE dict
                           (transformers 5's rope_parameters, or the legacy rope_scaling)

The tables live in strata.archs.hparams_gguf and hparams_hf (each architecture's record,
strata.archs.registry, holds its own), their entry kinds in strata.archs.hparam_kinds; this
module holds the audit.

Legend (Hp.kind):
    used      the reader sets ModelShape field(s) `fields` from it; `ok`, when given, bounds the
              values strata implements (another value is refused)
    refused   strata implements only the values `ok` (usually the source's own default); a file
              carrying another one is refused in one line (StrataError: the CLI exits 2)
    inert     it cannot change a prefill's logits; `why` says why
  and on any kind:
    missing   a refusal for when the key is absent: the source reads its absence as a value
              strata's reader would not (`also`: other names of the same value)
    default   the value the source assumes when the key is absent (tests: absent reads as it)
    array     it may be a per-layer array (any other key given as an array is refused: the
              readers take one value for every layer)

Sources: llama.cpp 0c1e57098 (vendored by llama-cpp-python 0.3.36): src/llama-model.cpp
load_hparams (every architecture), src/models/<arch>.cpp load_arch_hparams, src/llama-arch.cpp
(key names), src/llama-hparams.h (defaults), conversion/*.py (the keys convert_hf_to_gguf.py
writes). transformers 5.24: the Qwen3Moe/Mixtral/GptOss/DeepseekV3/Glm4Moe config classes and
modeling_rope_utils (the RoPE dict's fields), plus the legacy fields released config.json files
carry. A key under "{arch}." or a config.json field that the table does not list is refused: strata
cannot know whether it changes the logits (tests/packs/test_hparams_audit.py walks the table
against llama.cpp's loader keys and transformers' config fields).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from strata.archs.hparam_kinds import (INERT, NO_DEFAULT, REFUSED, ROPE, ROPE_DICTS, USED, Hp,
                                       OneOf, SameAs, Where, _show)
from strata.archs.hparams_gguf import GGUF_GLOBAL, GLOBAL_PREFIXES
from strata.archs.registry import ARCHS
from strata.errors import StrataError

# Every table by the source's name for it (the records hold them: strata.archs.registry)
GGUF = {g: a.gguf_hparams for a in ARCHS for g in a.gguf_archs}
HF = {t: a.hf_table(t) for a in ARCHS for t in a.hf_types}

__all__ = ["GGUF", "GGUF_GLOBAL", "GLOBAL_PREFIXES", "HF", "Hp", "INERT",
           "NO_DEFAULT", "OneOf", "REFUSED", "ROPE", "ROPE_DICTS", "SameAs", "USED", "Where",
           "audit_gguf", "audit_hf", "counts", "gguf_meta", "hf_fields"]


# ---- the audit ------------------------------------------------------------------------------
def _check(hp: Hp, key: str, v, get, where: str, fix: str, layers: bool = False) -> None:
    """Refuse `v` where `hp` bounds it; `layers`: a GGUF, where an array is a per-layer value."""
    if layers and isinstance(v, (list, tuple)) and not hp.array:
        raise StrataError(f"{where} {key} is a per-layer array ({_show(list(v))}); strata reads "
                          f"one value for every layer")
    if hp.ok is not None and not hp.ok.holds(v, get):
        reads = ("reads files without it" if hp.ok == OneOf(()) else
                 f"implements {hp.ok} only")
        why = f": {hp.why}" if hp.why else ""
        raise StrataError(f"{where} {key} is {_show(v)}, but strata {reads}{why}; {fix}")


def audit_gguf(arch: str | None, meta: Mapping[str, Any], path) -> None:
    """Refuse a GGUF whose metadata carries a key strata would drop or a value it does not
    implement (one line naming the key). `meta`: key -> value (values read when asked);
    an architecture without a table is left to the reader (which names those it reads)."""
    table = GGUF.get(arch) if isinstance(arch, str) else None
    if table is None:
        return
    pre = arch + "."
    where = f"{path}: GGUF metadata"
    fix = "re-convert the model without it, or read it with llama.cpp"

    def get(suffix):
        return meta[pre + suffix] if pre + suffix in meta else None
    unknown = []
    for key in meta:
        if key in GGUF_GLOBAL:
            _check(GGUF_GLOBAL[key], key, meta[key], lambda k: meta.get(k), where, fix, True)
        elif key.startswith(pre):
            hp = table.get(key[len(pre):])
            if hp is None:
                unknown.append(key)
            else:
                _check(hp, key, meta[key], get, where, fix, True)
    for suffix, hp in table.items():
        if hp.missing and all(k not in meta for k in (pre + suffix, *hp.also)):
            raise StrataError(f"{where} {pre}{suffix} is missing: {hp.missing}")
    if unknown:
        raise StrataError(f"{where} {unknown[0]} is not in strata's table of {arch} keys "
                          f"(strata.packs.hparams), so strata cannot tell whether it changes "
                          f"the logits: remove it with gguf-py's gguf_new_metadata.py, or add "
                          f"it to the table (used, refused or inert) with a test")


def hf_fields(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """config.json's fields as the HF table names them: the top level, and each field of the
    RoPE dict (rope_parameters, else the legacy rope_scaling) as "rope_parameters.<name>"."""
    out = {k: v for k, v in cfg.items() if k not in ROPE_DICTS}
    for d in ROPE_DICTS:
        rope = cfg.get(d)
        if rope is None:
            continue
        if not isinstance(rope, Mapping):
            raise StrataError(f"config.json's {d} is {_show(rope)}; it must be an object")
        for k, v in rope.items():
            out.setdefault(ROPE + k, v)
    return out


def audit_hf(cfg: Mapping[str, Any], where) -> None:
    """Refuse a config.json with a field strata would drop or a value it does not implement
    (one line naming the field); a model_type without a table is left to the reader. A
    multimodal release's text model (`text_config`, e.g. Qwen3.5-MoE's) is audited against its
    own model_type's table as well."""
    mt = cfg.get("model_type")
    table = HF.get(mt) if isinstance(mt, str) else None
    if table is None:
        return
    sub = cfg.get("text_config")
    if isinstance(sub, Mapping) and isinstance(sub.get("model_type"), str) \
            and sub["model_type"] in HF and sub["model_type"] != mt:
        audit_hf(sub, f"{where} (text_config)")
    flat = hf_fields(cfg)
    at = f"{where}: config.json's"
    fix = "strata cannot read this checkpoint"
    unknown = []
    for key, v in flat.items():
        hp = table.get(key)
        if hp is None:
            unknown.append(key)
        elif v is not None:
            _check(hp, key, v, flat.get, at, fix)
    for key, hp in table.items():
        if hp.missing and all(k not in flat for k in (key, *hp.also)):
            raise StrataError(f"{at} {key} is missing: {hp.missing}")
    if unknown:
        raise StrataError(f"{at} field {unknown[0]} is not in strata's table of "
                          f"{cfg.get('model_type')} fields (strata.packs.hparams), so strata "
                          f"cannot tell whether it changes the logits: remove it from "
                          f"config.json, or add it to the table (used, refused or inert) with "
                          f"a test")


def gguf_meta(r) -> Mapping[str, Any]:
    """A GGUFReader's metadata as key -> value, each value read when asked (the tokenizer's
    large arrays are never read here)."""
    return _Meta({name: f for name, f in r.fields.items() if not name.startswith("GGUF.")})


class _Meta(Mapping):
    def __init__(self, fields):
        self._f = fields

    def __getitem__(self, k):
        return self._f[k].contents()

    def __iter__(self):
        return iter(self._f)

    def __len__(self):
        return len(self._f)

    def __contains__(self, k):
        return k in self._f


def counts() -> dict[str, dict[str, int]]:
    """{table: {kind: n}} for every architecture's GGUF and HF tables (the report's numbers)."""
    out = {}
    for name, t in [*((f"gguf:{a}", t | GGUF_GLOBAL) for a, t in GGUF.items()),
                    *((f"hf:{m}", t) for m, t in HF.items() if m != "kimi_k2")]:
        out[name] = {k: sum(hp.kind == k for hp in t.values()) for k in (USED, REFUSED, INERT)}
    return out
