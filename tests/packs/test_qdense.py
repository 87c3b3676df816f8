"""A GGUF's quantized dense matrices kept as their blocks in the pack (strata.packs.qdense): read
back bit for bit as the old fp32 import decoded them, on every architecture, rows reordered where
the architecture reorders them; the loader places them; a corrupted table is one line."""
import json

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from strata.archs.gguf_tensors import dense
from strata.archs.names import dense_specs
from strata.archs.registry import get_arch
from strata.engine.load import dense_on_devices
from strata.errors import StrataError
from strata.gguf_file import open_gguf
from strata.packs import Pack
from strata.packs.from_gguf import gguf_to_pack
from strata.packs.qdense import QuantDense, keep_blocks, row_permutation
from strata.packs.synth import Mix, synth_gguf, synth_pack
from strata.shapes import PRESETS

TINY_ARCHS = sorted(k for k in PRESETS if k.startswith("tiny-"))


def _mix(preset):
    s = PRESETS[preset]
    return s, Mix.stock("MXFP4_MOE" if "gpt-oss" in preset else "Q4_K_M", s)


@pytest.mark.parametrize("preset", TINY_ARCHS)
def test_blocks_read_back_as_the_fp32_import_decoded_them(tmp_path, preset):
    """Each block-format dense tensor of a mix's GGUF is kept as its blocks (uint8 in the file,
    named in dense_blocks, the pack smaller than the old fp32 by the difference), and reads back
    (`dense`) bit for bit as gguf-py's decode through the architecture's own transform (the old
    import); synth --pack keeps the same blocks; the pack is version 3."""
    s, mix = _mix(preset)
    g = synth_gguf(tmp_path / "m.gguf", s, mix, seed=2, progress=False)
    pk = Pack.open(gguf_to_pack(g, tmp_path / "m.pack", progress=False), verify=True)
    syn = Pack.open(synth_pack(tmp_path / "s.pack", s, mix, seed=2, progress=False), verify=True)
    assert pk.meta["pack_version"] == 3
    arch, r = get_arch(s.arch), open_gguf(g)
    tensors = {t.name: t for t in r.tensors}
    kept = 0
    for name, shp in dense_specs(s).items():
        if name not in tensors:
            continue
        t = tensors[name]
        want = arch.gguf_dense(name, dense(t, shp), s)     # the old import's values
        got = pk.dense(name)
        assert got.dtype == want.dtype and torch.equal(got, want), name
        assert torch.equal(syn.dense(name), got), name
        st = pk.dense_stored(name)
        if isinstance(st, QuantDense):
            kept += 1
            assert st.fmt == t.tensor_type.name and st.shape == tuple(shp)
            assert pk.meta["dense_blocks"][name] == {"fmt": st.fmt, "shape": list(shp)}
            assert isinstance(syn.dense_stored(name), QuantDense)
            assert torch.equal(syn.dense_stored(name).raw, st.raw), name
        else:
            assert t.tensor_type.name in ("F32", "F16", "BF16") or name not in \
                pk.meta.get("dense_blocks", {}), name
    assert kept > 0, f"{preset}: the mix kept no dense matrix as blocks"
    assert f"{kept} dense matrices as blocks" in repr(pk)     # what `strata pack` prints


def test_mixtral_rows_are_reordered_as_blocks():
    """Mixtral's q/k are stored rope-permuted: the import un-permutes rows; kept as blocks, the
    block rows are reordered the same way (a row permutation found from the transform), and a
    transform that changes values is not taken for one."""
    s = PRESETS["tiny-mixtral"]
    arch = get_arch(s.arch)
    rows = s.n_head * s.head_dim
    perm = row_permutation(lambda x: arch.gguf_dense("blk.0.attn_q.weight", x, s), rows)
    assert perm is not None and not torch.equal(perm, torch.arange(rows))
    assert torch.equal(torch.sort(perm).values, torch.arange(rows))
    assert row_permutation(lambda x: x * 2, 8) is None
    assert row_permutation(lambda x: x[:4], 8) is None
    assert torch.equal(row_permutation(lambda x: x, 8), torch.arange(8))
    raw = torch.randint(0, 256, (rows, 2 * 34), dtype=torch.uint8)    # Q8_0: 34 B a block
    raw[:, 0:2] = torch.tensor([0, 0x3C], dtype=torch.uint8)           # scale 1.0 (finite)
    raw[:, 34:36] = torch.tensor([0, 0x3C], dtype=torch.uint8)
    q = keep_blocks("Q8_0", raw.reshape(-1), (rows, 64),
                    lambda x: arch.gguf_dense("blk.0.attn_q.weight", x, s))
    plain = QuantDense("Q8_0", (rows, 64), raw).decode()
    assert torch.equal(q.decode(), arch.gguf_dense("blk.0.attn_q.weight", plain, s))


def test_loader_decodes_blocks_where_it_places_them(tmp_path):
    """dense_on_devices: a block matrix decoded (fp32 on the CPU) beside the plain tensors, every
    name kept, values those `dense` reads."""
    s, mix = _mix("tiny-glm4moe")
    pk = Pack.open(synth_pack(tmp_path / "s.pack", s, mix, seed=1, progress=False))
    stored = {n: pk.dense_stored(n) for n in pk.dense_names()}
    assert any(isinstance(x, QuantDense) for x in stored.values())
    out = dense_on_devices(stored, torch.float32, torch.device("cpu"))
    assert list(out) == list(stored)
    for n in stored:
        assert torch.equal(out[n], pk.dense(n)), n


@pytest.mark.gpu
def test_blocks_decode_on_the_gpu_as_on_the_cpu(tmp_path):
    """blocks_on_device on CUDA: fp32 bit for bit the CPU decode, bf16 that rounded."""
    from strata.engine.load import blocks_on_device
    s, mix = _mix("tiny-glm4moe")
    pk = Pack.open(synth_pack(tmp_path / "s.pack", s, mix, seed=1, progress=False))
    qs = [x for x in (pk.dense_stored(n) for n in pk.dense_names()) if isinstance(x, QuantDense)]
    assert qs
    for q in qs:
        cpu = q.decode()
        assert torch.equal(blocks_on_device(q, "cuda", torch.float32).cpu(), cpu)
        assert torch.equal(blocks_on_device(q, "cuda", torch.bfloat16).cpu().view(torch.int16),
                           cpu.to(torch.bfloat16).view(torch.int16))


def _edit_blocks(path, edit):
    """Rewrite the pack's dense_blocks table through `edit` and re-sign the header."""
    from strata.packs.file import META_KEY, sign_header
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    h = json.loads(raw[8:8 + n])
    h.pop("__metadata__").pop("strata.header_crc32", None)
    meta_all = json.loads(raw[8:8 + n])["__metadata__"]
    meta_all.pop("strata.header_crc32", None)
    meta = json.loads(meta_all[META_KEY])
    edit(meta["dense_blocks"])
    meta_all[META_KEY] = json.dumps(meta, sort_keys=True)
    h["__metadata__"] = meta_all
    new = json.dumps(sign_header(h)).encode()
    assert len(new) <= n
    path.write_bytes(raw[:8] + new + b" " * (n - len(new)) + raw[8 + n:])


@pytest.mark.parametrize("edit,words", [
    (lambda b: b[next(iter(b))].update(fmt="NOPE"), "malformed"),
    (lambda b: b[next(iter(b))].update(shape=[3, 64]), "not the"),
    (lambda b: b.update({"token_embd.weight": {"fmt": "Q4_0", "shape": [1, 32]}}), "not the"),
])
def test_a_corrupted_blocks_table_is_one_line(tmp_path, edit, words):
    s, mix = _mix("tiny-glm4moe")
    p = synth_pack(tmp_path / "s.pack", s, mix, seed=1, progress=False)
    _edit_blocks(p, edit)
    with pytest.raises(StrataError, match=words):
        Pack.open(p)


def test_a_version_2_pack_still_reads(tmp_path, monkeypatch):
    """A pack written before blocks (version 2: every dense tensor a float) opens and reads."""
    import strata.packs.writer as writer
    from strata.packs.synth import ExpertFormats
    monkeypatch.setattr(writer, "PACK_VERSION", 2)
    p = synth_pack(tmp_path / "v2.pack", PRESETS["tiny"], ExpertFormats.of("Q8_0"), seed=1,
                   progress=False)
    pk = Pack.open(p, verify=True)
    assert pk.meta["pack_version"] == 2 and "dense_blocks" not in pk.meta
    assert all(not isinstance(pk.dense_stored(n), QuantDense) for n in pk.dense_names())
    assert np.isfinite(pk.dense("token_embd.weight").float().numpy()).all()


@settings(max_examples=25, deadline=None)
@given(fmt=st.sampled_from(["Q4_K", "Q6_K", "Q8_0", "Q5_0", "IQ4_XS", "Q2_K"]),
       rows=st.integers(1, 24), blocks=st.integers(1, 2), seed=st.integers(0, 2**31 - 1))
def test_blocks_reordered_decode_as_the_values_reordered(fmt, rows, blocks, seed):
    """For any row permutation a transform makes, keep_blocks' reordered blocks decode to the
    transform of the decoded values, bit for bit; a transform that also scales is refused."""
    from strata.formats import get_format
    from strata.packs.randblocks import random_matrix
    f = get_format(fmt)
    cols = blocks * f.block
    raw = torch.from_numpy(random_matrix(fmt, rows, cols, 0.02, seed)).reshape(-1)
    order = torch.randperm(rows, generator=torch.Generator().manual_seed(seed))
    q = keep_blocks(fmt, raw, (rows, cols), lambda x: x[order])
    values = QuantDense(f.name, (rows, cols), raw.reshape(rows, -1)).decode()
    assert q is not None and torch.equal(q.decode(), values[order])
    assert keep_blocks(fmt, raw, (rows, cols), lambda x: -x[order]) is None


def test_blocks_on_device_decodes_as_the_reader(tmp_path):
    """blocks_on_device's Triton decode (the interpreter here, the GPU there): fp32 bit for bit
    the reader's decode, bf16 that rounded."""
    from strata.engine.load import blocks_on_device
    s, mix = _mix("tiny-glm4moe")
    pk = Pack.open(synth_pack(tmp_path / "s.pack", s, mix, seed=1, progress=False))
    qs = {x.fmt: x for x in (pk.dense_stored(n) for n in pk.dense_names())
          if isinstance(x, QuantDense)}
    assert qs
    for q in qs.values():                   # one matrix a format
        assert torch.equal(blocks_on_device(q, "cpu", torch.float32), q.decode())
        assert torch.equal(blocks_on_device(q, "cpu", torch.bfloat16).view(torch.int16),
                           q.decode().to(torch.bfloat16).view(torch.int16))
