"""The architectures strata runs, one record each (strata.archs.record.Arch), and the three
ways to find one: by strata name, by HF model_type, by GGUF general.architecture. An unknown
name is one line listing the supported ones.

Adding an architecture: its record (a module of strata.archs) named in ARCHS below, its model
file (strata.models), its presets (strata.shapes.PRESETS) and its parity test
(docs/architectures.md).
"""
from __future__ import annotations

from strata.archs.family import DEEPSEEK2, GLM4MOE
from strata.archs.gpt_oss import GPT_OSS
from strata.archs.minimax_m2 import MINIMAX_M2
from strata.archs.mixtral import MIXTRAL
from strata.archs.qwen35moe import QWEN35MOE
from strata.archs.qwen3moe import QWEN3MOE
from strata.archs.qwen3next import QWEN3NEXT
from strata.archs.record import Arch
from strata.errors import StrataError

ARCHS: tuple[Arch, ...] = (QWEN3MOE, MIXTRAL, GPT_OSS, GLM4MOE, DEEPSEEK2, MINIMAX_M2, QWEN3NEXT,
                           QWEN35MOE)

BY_NAME = {a.name: a for a in ARCHS}
BY_HF = {t: a for a in ARCHS for t in a.hf_types}
BY_GGUF = {g: a for a in ARCHS for g in a.gguf_archs}


def get_arch(name: str) -> Arch:
    """The record of strata arch `name` (ModelShape.arch)."""
    try:
        return BY_NAME[name]
    except KeyError:
        raise StrataError(f"architecture {name!r} is not supported; strata runs "
                          f"{', '.join(sorted(BY_NAME))}") from None


def by_hf(model_type, where) -> Arch:
    """The record whose HF model_type is `model_type`."""
    try:
        return BY_HF[model_type]
    except (KeyError, TypeError):
        raise StrataError(f"{where}: model_type {model_type!r}; strata packs "
                          f"{', '.join(sorted(BY_HF))} checkpoints") from None


def by_gguf(arch, where) -> Arch:
    """The record whose GGUF general.architecture is `arch`."""
    try:
        return BY_GGUF[arch]
    except (KeyError, TypeError):
        raise StrataError(f"{where} is a {arch!r} model; strata packs GGUF files of "
                          f"{', '.join(sorted(BY_GGUF))}") from None
