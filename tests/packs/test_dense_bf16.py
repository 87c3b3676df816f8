"""`strata pack --dense-bf16` / `strata synth --pack --dense-bf16`: a pack whose dense tensors are
stored rounded to bf16, the values a CUDA read computes with (its upload casts every dense tensor
to bf16), in half the bytes of the fp32 a GGUF's quantized dense tensors decode to."""
import numpy as np
import pytest
import torch

from strata.engine.pinning import upload
from strata.packs import Pack
from strata.packs.from_gguf import gguf_to_pack
from strata.packs.synth import ExpertFormats, Mix, synth_gguf, synth_pack
from strata.shapes import PRESETS


@pytest.mark.parametrize("preset,mix", [("tiny-glm4moe", "Q4_K_M"), ("tiny-qwen3moe", None)])
def test_bf16_dense_pack_is_what_a_cuda_read_uploads_of_the_fp32_pack(tmp_path, preset, mix):
    """Every dense tensor of the --dense-bf16 pack is bf16 and equals, bit for bit, the fp32
    pack's tensor as the engine's upload casts it (upload's CPU path: the same pieces and cast);
    the experts are the same bytes; synth --pack --dense-bf16 writes the pack `strata pack
    --dense-bf16` makes of synth's GGUF; the metadata says the tensors were rounded; the pack is
    smaller by the dense bytes halved."""
    s = PRESETS[preset]
    fmts = Mix.stock(mix, s) if mix else ExpertFormats.of("Q8_0")
    gguf = synth_gguf(tmp_path / "m.gguf", s, fmts, seed=3, progress=False)
    f32 = Pack.open(gguf_to_pack(gguf, tmp_path / "f32.pack", progress=False), verify=True)
    b16 = Pack.open(gguf_to_pack(gguf, tmp_path / "b16.pack", progress=False,
                                 dense_dtype="BF16"), verify=True)
    syn = Pack.open(synth_pack(tmp_path / "syn.pack", s, fmts, seed=3, progress=False,
                               dense_dtype="BF16"), verify=True)
    assert b16.meta.get("dense_rounded") == "BF16" and "dense_rounded" not in f32.meta
    names = f32.dense_names()
    assert sorted(b16.dense_names()) == sorted(names) == sorted(syn.dense_names())
    assert any(f32.dense(n).dtype == torch.float32 for n in names)   # something was rounded
    ups = upload({n: f32.dense(n) for n in names}, "cpu", torch.bfloat16)
    mine = upload({n: b16.dense(n) for n in names}, "cpu", torch.bfloat16)
    for n in names:
        assert b16.dense(n).dtype == torch.bfloat16, n
        assert torch.equal(b16.dense(n), f32.dense(n).to(torch.bfloat16)), n
        assert torch.equal(mine[n].view(torch.int16), ups[n].view(torch.int16)), n
        assert torch.equal(syn.dense(n), b16.dense(n)), n
    for i in range(s.n_layer):
        a, b = np.asarray(f32.experts(i)), np.asarray(b16.experts(i))
        assert np.array_equal(a, b) and np.array_equal(b, np.asarray(syn.experts(i))), i
    saved = sum(f32.dense(n).numel() * (f32.dense(n).element_size() - 2) for n in names)
    assert saved > 0
    size = lambda p: p.path.stat().st_size   # noqa: E731
    assert size(f32) - size(b16) >= saved - len(names) * 4096   # each tensor page-aligned


def test_dense_bf16_refused_where_it_does_not_apply(tmp_path, capsys):
    """--dense-bf16 on a GGUF-writing synth, or on a Hugging Face folder's pack: one line, exit 2,
    nothing written."""
    from strata.cli import main
    out = tmp_path / "m.gguf"
    assert main(["synth", "--preset", "tiny", "--dense-bf16", "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--dense-bf16" in err and "--pack" in err and len(err.strip().splitlines()) == 1
    assert not out.exists()
    hf = tmp_path / "hf"
    hf.mkdir()
    assert main(["pack", str(hf), "--dense-bf16", "-o", str(tmp_path / "x.pack")]) == 2
    err = capsys.readouterr().err
    assert "--dense-bf16" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "x.pack").exists()
