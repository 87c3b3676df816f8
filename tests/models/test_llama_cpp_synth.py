"""`strata synth` writes each architecture's GGUF as llama.cpp lays it out: llama.cpp loaded and ran
the tiny file of every architecture (tests/models/make_llama_cpp_synth.py made its logits; the
command is in synth.json), and strata's read of the same file meets them within the bounds
test_llama_cpp_logits.py derives for llama.cpp's converted files (its helpers: EMULATED with
llama.cpp's activation rounding done in torch, PLAIN for strata's own read).

The GGUFs are not committed: synth is deterministic, so each is re-synthesized here with the
maker's argv and must be byte for byte the file llama.cpp read (its sha256).
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from tests.models.fp32_bound import rel
from tests.models.make_llama_cpp_synth import FILES, synth
from tests.models.llama_emulation import _pack, file_reads

pytestmark = pytest.mark.usefixtures("one_thread")   # tests/conftest.py

DATA = Path(__file__).parent / "data" / "llama_cpp_synth"
INFO = json.loads((DATA / "synth.json").read_text())   # a missing fixture fails, never skips
NAMES = sorted(INFO["files"])
# every file is held to EMULATED, the Q4_K_M files' Q5_1 attn_output (at D 64 its Q5_K falls back
# to Q5_1) with q8_1's minimum term (test_llama_cpp_logits._q8_1)
EMULATED_NAMES = NAMES


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """name -> the re-synthesized GGUF (made once per module)."""
    d = tmp_path_factory.mktemp("synth-gguf")
    made = {}

    def get(name: str) -> Path:
        if name not in made:
            made[name] = d / f"{name}.gguf"
            synth(INFO["files"][name]["argv"] + [str(made[name])])
        return made[name]
    return get


@pytest.fixture(scope="module")
def reads(files, tmp_path_factory):
    d = tmp_path_factory.mktemp("synth-packs")
    cache = {}

    def get(name: str):
        if name not in cache:
            src = files(name)
            cache[name] = file_reads(_pack(src, d), src, INFO["files"][name]["tokens"],
                                     np.load(DATA / f"{name}.logits.npy"))
        return cache[name]
    return get


def test_the_fixtures_are_what_the_maker_wrote():
    """The folder's logits are the maker's (sha256), the maker's list is the one llama.cpp read,
    and every architecture has a file held to EMULATED."""
    got = {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(DATA.iterdir())
           if f.name != "synth.json"}
    assert got == INFO["sha256"]
    assert sorted(FILES) == NAMES
    from strata.archs.registry import ARCHS
    assert {FILES[n][0] for n in EMULATED_NAMES} >= {f"tiny-{a.name}" for a in ARCHS}


@pytest.mark.parametrize("name", NAMES)
def test_resynth_is_the_file_llama_cpp_read(files, name):
    """synth is deterministic: the same argv writes the same bytes."""
    assert hashlib.sha256(files(name).read_bytes()).hexdigest() == INFO["files"][name]["sha256"]


@pytest.mark.parametrize("name", EMULATED_NAMES)
def test_emulated_equals_llama_cpp(reads, name):
    """With llama.cpp's rounding of the activations done in torch, strata's read of the synth
    file is llama.cpp's forward up to fp32 order: within EMULATED."""
    r = reads(name)
    assert r.routed_alike == r.want.shape[0], "fp32 order changes a routing decision"
    assert rel(r.emulated.logits, r.want) < r.emulated_bound


@pytest.mark.parametrize("name", NAMES)
def test_plain_equals_llama_cpp(reads, name):
    """strata's own read (as `strata prefill --experts ref`) is llama.cpp's within PLAIN."""
    r = reads(name)
    assert r.rows == r.want.shape[0], f"row {r.rows} routes otherwise under the rounding"
    assert rel(r.plain.logits, r.want) < r.plain_bound
