"""Fuzzed GGUF and pack headers (a bounded, seeded Hypothesis loop, run in CI): every flip or cut
is refused with a StrataError, or reads the very same model. Never a traceback, never a hang
(each example has a deadline), never a silently different model.

Packs carry a header checksum and per-tensor CRC32s, so for a pack "the same model" is exact:
the same header, the same metadata, every tensor's bytes. A GGUF carries no checksum: a flip
inside a metadata value the tensors do not constrain (rope base, rms epsilon, context length,
top-k within E, a name) cannot be detected by any reader; there the test asserts what the tensors
do pin: the packed tensors are byte-identical and the tensor-determined shape fields (layers,
widths, experts, heads, vocabulary) are unchanged, or the file is refused.
"""
from __future__ import annotations

import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from strata.errors import StrataError
from strata.packs import Pack
from strata.packs.from_gguf import gguf_to_pack
from strata.packs.synth import ExpertFormats, synth_gguf, synth_pack
from strata.shapes import get_preset

TINY = get_preset("tiny")
FUZZ = settings(max_examples=60, deadline=10_000, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])
PINNED_BY_TENSORS = ("n_layer", "d_model", "n_expert", "d_expert", "n_head", "n_kv_head",
                     "head_dim", "vocab")


@pytest.fixture(scope="module")
def originals(tmp_path_factory):
    d = tmp_path_factory.mktemp("fuzz")
    pack = synth_pack(d / "o.pack", TINY, ExpertFormats.of("Q8_0"), progress=False)
    gguf = synth_gguf(d / "o.gguf", TINY, ExpertFormats.of("Q4_0", down="Q8_0"), progress=False)
    ref = gguf_to_pack(gguf, d / "ref.pack", progress=False)
    return d, pack.read_bytes(), gguf.read_bytes(), Pack.open(pack), Pack.open(ref)


def _tensors(p: Pack) -> dict:
    return {n: bytes(p._raw(n).numpy()) for n in p._names()}


def _flip(raw: bytes, where: list[tuple[int, int]], limit: int) -> bytes:
    b = bytearray(raw)
    for pos, mask in where:
        b[pos % limit] ^= mask
    return bytes(b)


flips = st.lists(st.tuples(st.integers(0, 1 << 30), st.integers(1, 255)), min_size=1, max_size=3)


@FUZZ
@given(where=flips)
def test_pack_header_flips(originals, where):
    d, raw, _, orig, _ = originals
    (n,) = struct.unpack("<Q", raw[:8])
    path = d / "f.pack"
    path.write_bytes(_flip(raw, where, 8 + n))
    try:
        p = Pack.open(path)
    except StrataError:
        return
    # opened: it must be the same model, byte for byte
    assert p.meta == orig.meta and p._header == orig._header
    assert _tensors(p) == _tensors(orig)


@FUZZ
@given(cut=st.integers(0, 1 << 30))
def test_pack_truncated(originals, cut):
    d, raw, *_ = originals
    path = d / "t.pack"
    path.write_bytes(raw[:cut % len(raw)])
    with pytest.raises(StrataError):
        Pack.open(path)


@FUZZ
@given(where=flips)
def test_gguf_header_flips(originals, where):
    d, _, graw, _, ref = originals
    # the metadata and the tensor table: everything before the first tensor's data
    head = graw.index(b"blk.0.ffn_down_exps.weight") + 512
    path = d / "f.gguf"
    path.write_bytes(_flip(graw, where, head))
    out = d / "f.pack"
    try:
        got = Pack.open(gguf_to_pack(path, out, progress=False))
    except StrataError:
        return
    for k in PINNED_BY_TENSORS:
        assert getattr(got.shape, k) == getattr(ref.shape, k), k
    assert _tensors(got) == _tensors(ref)


@FUZZ
@given(cut=st.integers(0, 1 << 30))
def test_gguf_truncated(originals, cut):
    d, _, graw, *_ = originals
    path = d / "t.gguf"
    path.write_bytes(graw[:cut % len(graw)])
    with pytest.raises(StrataError):
        gguf_to_pack(path, d / "t.pack", progress=False)
