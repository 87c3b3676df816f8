"""MemoryPack.save writes a pack whose reader sees exactly the MemoryPack's bytes (the fast path
benchmarks use for a full-size pack file)."""
import torch

from strata.packs import Pack
from strata.packs.memory import MemoryPack
from strata.packs.synth import ExpertFormats, Mix
from strata.shapes import get_preset


def test_saved_pack_reads_back_the_same_bytes(tmp_path):
    shape = get_preset("tiny")
    mem = MemoryPack(shape, ExpertFormats.of("Q8_0"), seed=3, device="cpu")
    pack = Pack.open(mem.save(tmp_path / "m.pack", progress=False))
    assert [pl.blob_size for pl in pack.layers] == [pl.blob_size for pl in mem.layers]
    for i in range(shape.n_layer):
        assert torch.equal(pack.experts(i), mem.experts(i)), f"layer {i} experts differ"
    assert sorted(pack.dense_names()) == sorted(mem.dense_names())
    for name in mem.dense_names():
        a, b = pack.dense(name), mem.dense(name)
        assert a.dtype == b.dtype and torch.equal(a, b), name


def test_saved_mix_keeps_each_layers_blob_size(tmp_path):
    shape = get_preset("tiny")
    mem = MemoryPack(shape, Mix.stock("Q4_K_M", shape), seed=1, device="cpu")
    pack = Pack.open(mem.save(tmp_path / "mix.pack", progress=False))
    sizes = [pl.blob_size for pl in pack.layers]
    assert sizes == [pl.blob_size for pl in mem.layers] and len(set(sizes)) > 1
    assert pack.max_blob == mem.max_blob


def test_synth_without_transformers_text_writes_a_pack_without_tokenizer(tmp_path, monkeypatch,
                                                                         capsys):
    """The weights never need transformers (an optional extra): an older or missing one leaves the
    synthetic pack without a tokenizer, said on stderr, instead of failing the pack."""
    import sys
    from strata.packs.synth import synth_pack
    monkeypatch.setitem(sys.modules, "transformers.integrations.gguf", None)   # import fails
    pack = Pack.open(synth_pack(tmp_path / "t.pack", get_preset("tiny"), progress=False))
    assert pack.tokenizer is None
    assert "carries no tokenizer" in capsys.readouterr().err
