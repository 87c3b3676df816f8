"""The pack file: round trips, memory mapping, and refusal of broken files."""
import json
import struct

import numpy as np
import pytest
import torch

from strata.errors import StrataError
from strata.packs import Pack, write_pack
from strata.packs.file import FILE_ALIGN, HEADER_CRC_KEY, META_KEY, sign_header
from tests.packs.helpers import TINY, mixed_layouts, random_dense, random_pack


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_round_trip_identical_bytes(tmp_path, tied):
    dense, blobs, lays = random_pack(tmp_path / "m.pack", tied=tied)
    pk = Pack.open(tmp_path / "m.pack", verify=True)
    assert pk.shape == TINY and pk.native and pk.tied == tied
    for i, lay in enumerate(lays):
        assert pk.layers[i].layout == lay and pk.layers[i].blob_size == lay.size
        ex = pk.experts(i)
        assert ex.dtype == torch.uint8 and tuple(ex.shape) == (TINY.n_expert, lay.size)
        assert np.array_equal(ex.numpy(), blobs[i])
        es = pk.expert_set(i)
        assert es.n_expert == TINY.n_expert and es.layout == lay
        e = TINY.n_expert - 1  # the last blob through the slot table
        o = int(es.slot_offset[e])
        assert np.array_equal(es.arena[o:o + lay.size].numpy(), blobs[i][e])
    assert pk.max_blob == max(l.size for l in lays) and pk.max_blob != min(l.size for l in lays)
    for n, t in dense.items():
        assert pk.dense(n).dtype == t.dtype and torch.equal(pk.dense(n), t), n
    assert set(pk.dense_names()) == set(dense)
    if tied:
        assert torch.equal(pk.dense("output.weight"), dense["token_embd.weight"])


def test_tensors_page_aligned_and_safetensors_readable(tmp_path):
    random_pack(tmp_path / "m.pack")
    pk = Pack.open(tmp_path / "m.pack")
    for n in pk._names():
        assert (pk._data_start + pk._header[n]["data_offsets"][0]) % FILE_ALIGN == 0, n
    from safetensors import safe_open
    with safe_open(str(tmp_path / "m.pack"), "pt") as f:  # a plain safetensors file too
        assert torch.equal(f.get_tensor("blk.1.experts"), pk.experts(1))


def _rewrite_meta(path, edit, sign=True):
    """Edit the header; `sign` re-computes its checksum (so the deeper checks are reached)."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    meta = json.loads(header["__metadata__"][META_KEY])
    edit(header, meta)
    header["__metadata__"][META_KEY] = json.dumps(meta)
    if sign:
        header = sign_header(header)
    new = json.dumps(header).encode()
    assert len(new) <= n, "test edits must not grow the header"
    new += b" " * (n - len(new))
    path.write_bytes(raw[:8] + new + raw[8 + n:])


def _set(d, keys, v):
    for k in keys[:-1]:
        d = d[k]
    d[keys[-1]] = v


BROKEN = {
    "max_blob": lambda h, m: _set(m, ["max_blob"], 256),
    "blob_size": lambda h, m: _set(m, ["layers", 0, "blob_size"], m["layers"][0]["blob_size"] + 256),
    "layout-format": lambda h, m: _set(m, ["layers", 0, "layout", "gate", "format"], "Q4_0"),
    "layer-count": lambda h, m: _set(m, ["shape", "n_layer"], 3),
    "expert-count": lambda h, m: _set(m, ["shape", "n_expert"], 4),
    "d_model": lambda h, m: _set(m, ["shape", "d_model"], 32),
    "tied-flag": lambda h, m: _set(m, ["tied"], True),
    "version": lambda h, m: _set(m, ["pack_version"], 99),
    "tensor-span": lambda h, m: _set(h, ["blk.0.attn_norm.weight", "shape"], [32]),
}


@pytest.mark.parametrize("what", list(BROKEN))
def test_disagreeing_metadata_refused(tmp_path, what):
    random_pack(tmp_path / "m.pack")
    _rewrite_meta(tmp_path / "m.pack", BROKEN[what])
    with pytest.raises(StrataError):
        Pack.open(tmp_path / "m.pack")


@pytest.mark.parametrize("cut", [4, 100, -1, -FILE_ALIGN], ids=["8B-header", "mid-header", "last-byte",
                                                              "last-page"])
def test_truncated_refused(tmp_path, cut):
    random_pack(tmp_path / "m.pack")
    raw = (tmp_path / "m.pack").read_bytes()
    (tmp_path / "m.pack").write_bytes(raw[:cut])
    with pytest.raises(StrataError, match="truncated|shorter|not a readable"):
        Pack.open(tmp_path / "m.pack")


def test_corrupted_header_and_data(tmp_path):
    random_pack(tmp_path / "m.pack")
    p = tmp_path / "m.pack"
    raw = bytearray(p.read_bytes())
    raw2 = bytearray(raw)
    raw2[10] ^= 0xFF  # inside the JSON
    p.write_bytes(bytes(raw2))
    with pytest.raises(StrataError, match="corrupted"):
        Pack.open(p)
    raw[-5] ^= 0x01  # one bit of the last expert blob: only the tensor checksum sees it
    p.write_bytes(bytes(raw))
    Pack.open(p, verify=False)
    with pytest.raises(StrataError, match="blk.1.experts fails its checksum"):
        Pack.open(p, verify=True)
    with pytest.raises(StrataError, match="blk.1.experts fails its checksum"):
        Pack.open(p)   # a small pack: every tensor is checked on open


def test_unsigned_metadata_edit_refused(tmp_path):
    """top_k 2 -> 3 with the header left unsigned: the header checksum refuses it."""
    random_pack(tmp_path / "m.pack")
    _rewrite_meta(tmp_path / "m.pack", lambda h, m: _set(m, ["shape", "top_k"], 3), sign=False)
    with pytest.raises(StrataError, match="header fails its checksum"):
        Pack.open(tmp_path / "m.pack", verify=False)


def test_version_1_refused_with_repack_advice(tmp_path):
    random_pack(tmp_path / "m.pack")

    def v1(h, m):
        m["pack_version"] = 1
        del h["__metadata__"][HEADER_CRC_KEY]
    _rewrite_meta(tmp_path / "m.pack", v1, sign=False)
    with pytest.raises(StrataError, match="version 1 has no header checksum.*re-create it"):
        Pack.open(tmp_path / "m.pack")


def test_not_a_pack(tmp_path):
    from safetensors.torch import save_file
    save_file({"x": torch.zeros(3)}, str(tmp_path / "plain.safetensors"))
    with pytest.raises(StrataError, match="strata pack metadata"):
        Pack.open(tmp_path / "plain.safetensors")
    with pytest.raises(StrataError, match="no pack"):
        Pack.open(tmp_path / "missing.pack")


def test_writer_refuses_bad_input(tmp_path):
    lays = mixed_layouts(TINY)
    dense = random_dense(TINY)
    blobs = [np.zeros((TINY.n_expert, l.size), np.uint8) for l in lays]
    with pytest.raises(StrataError, match="expected"):
        write_pack(tmp_path / "a", TINY, dense, [blobs[0][:, :-1]] + blobs[1:], lays, True,
                   progress=False)
    bad = dict(dense)
    bad["blk.0.attn_q.weight"] = bad["blk.0.attn_q.weight"][:, :3]
    with pytest.raises(StrataError, match="attn_q"):
        write_pack(tmp_path / "b", TINY, bad, blobs, lays, True, progress=False)
    del bad["blk.0.attn_q.weight"]
    with pytest.raises(StrataError, match="missing"):
        write_pack(tmp_path / "c", TINY, bad, blobs, lays, True, progress=False)
    assert not list(tmp_path.iterdir()), "a failed write leaves no file behind"


def test_layer_blobs_streamed_from_callables(tmp_path):
    lays = mixed_layouts(TINY)
    calls = []

    def make(i):
        def f():
            calls.append(i)
            return torch.full((TINY.n_expert, lays[i].size), i + 1, dtype=torch.uint8)
        return f
    write_pack(tmp_path / "m.pack", TINY, random_dense(TINY), [make(i) for i in range(2)], lays,
               native=False, progress=False)
    pk = Pack.open(tmp_path / "m.pack", verify=True)
    assert calls == [0, 1] and not pk.native
    assert int(pk.experts(1).min()) == 2 == int(pk.experts(1).max())
