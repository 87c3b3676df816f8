"""`strata synth` and `strata pack` end to end through the CLI."""
from strata.cli import main
from strata.packs import Pack


def test_synth_then_pack(tmp_path, capsys):
    g, p, csv = tmp_path / "t.gguf", tmp_path / "t.pack", tmp_path / "hits.csv"
    assert main(["synth", "--preset", "small", "--layers", "1", "--quant", "Q4_0", "--quant-down",
                 "Q8_0", "-o", str(g), "--report-hits", "--hits-tokens", "64",
                 "--hits-csv", str(csv)]) == 0
    out = capsys.readouterr().out
    assert "layer   0" in out and "hit" in out
    assert csv.read_text().splitlines()[0].startswith("layer,tokens")
    assert main(["pack", str(g), "-o", str(p), "--verify"]) == 0
    pk = Pack.open(p)
    assert pk.shape.n_layer == 1 and pk.layers[0].layout.down.fmt.name == "Q8_0"


def test_cli_errors_are_one_line(tmp_path, capsys):
    assert main(["synth", "--preset", "nope", "-o", str(tmp_path / "x.gguf")]) == 2
    assert "unknown preset" in capsys.readouterr().err
    assert main(["pack", str(tmp_path / "missing"), "-o", str(tmp_path / "x.pack")]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main(["synth", "--preset", "tiny", "--quant", "Q2_0", "--pack",
                 "-o", str(tmp_path / "q2.pack")]) == 2   # Q2_0 rows need 64-multiples: D=64 ok, F=32 not
    assert "Q2_0" in capsys.readouterr().err


# --- verify, checksums on open, the NaN/Inf guard, plan = prefill, one CPU expert path --------
import json  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from strata.packs import write_pack  # noqa: E402
from strata.packs.synth import ExpertFormats, synth_pack  # noqa: E402
from strata.shapes import get_preset  # noqa: E402

TINY = get_preset("tiny")


@pytest.fixture(scope="module")
def tiny_pack(tmp_path_factory):
    return synth_pack(tmp_path_factory.mktemp("cli") / "t.pack", TINY, ExpertFormats.of("Q8_0"),
                      progress=False)


def _flipped(src, dst, name, byte):
    pk = Pack.open(src)
    a, _ = pk._header[name]["data_offsets"]
    raw = bytearray(src.read_bytes())
    raw[pk._data_start + a + byte] ^= 0x10
    dst.write_bytes(bytes(raw))
    return dst


def test_verify_names_the_tensor(tiny_pack, tmp_path, capsys, monkeypatch):
    assert main(["verify", str(tiny_pack)]) == 0
    assert "OK" in capsys.readouterr().out
    bad = _flipped(tiny_pack, tmp_path / "q.pack", "blk.1.experts", 7)      # one quant byte
    assert main(["verify", str(bad)]) == 2
    assert "blk.1.experts fails its checksum" in capsys.readouterr().err
    bad2 = _flipped(tiny_pack, tmp_path / "s.pack", "blk.0.experts", 1)     # an fp16 scale byte
    monkeypatch.setattr("strata.packs.file.VERIFY_ON_OPEN", 0)   # as for a big pack
    assert main(["prefill", str(bad2), "--tokens", "1,2,3", "--verify"]) == 2
    assert "blk.0.experts fails its checksum" in capsys.readouterr().err


def _nan_pack(src, dst):
    """The tiny pack with layer 1's gate scales set to fp16 inf (valid checksums: a model that
    overflows, not a corrupted file)."""
    pk = Pack.open(src)
    dense = {n: pk.dense(n).clone() for n in pk.dense_names()}
    blobs = [pk.experts(i).clone() for i in range(TINY.n_layer)]
    off = pk.layers[1].layout.gate.offset
    blobs[1][:, off:off + 2] = torch.tensor([0x00, 0x7C], dtype=torch.uint8)   # fp16 +inf
    return write_pack(dst, pk.shape, dense, blobs, [pl.layout for pl in pk.layers], pk.native,
                      progress=False)


@pytest.mark.parametrize("stream", [False, True], ids=["resident", "streamed"])
def test_nan_fails_the_prompt_naming_the_layer(tiny_pack, tmp_path, capsys, stream):
    bad = _nan_pack(tiny_pack, tmp_path / "nan.pack")
    extra = ["--vram", "2GiB", "--cache", "1MiB", "--ring", "2", "--chunk", "4"] if stream else []
    assert main(["prefill", str(bad), "--tokens", "1,2,3,4,5", *extra]) == 2
    err = [l for l in capsys.readouterr().err.replace("\r", "\n").splitlines()
           if l.startswith("strata")]     # progress bars aside: one line
    assert len(err) == 1 and "layer 1" in err[0] and "NaN/Inf" in err[0], err


def test_nan_restores_the_cache(tiny_pack, tmp_path):
    from strata.engine.finite import NonFiniteError
    from strata.engine.prefill import EngineConfig, PrefillEngine
    bad = _nan_pack(tiny_pack, tmp_path / "nan.pack")
    eng = PrefillEngine(bad, EngineConfig(vram=2 << 30, cache=1 << 20, ring=2, chunk=4,
                                          max_prompt=8, device="cpu", ffn="ref"))
    before = eng.cache.buffer.clone()
    with pytest.raises(NonFiniteError, match="layer 1"):
        eng.run(torch.tensor([1, 2, 3, 4, 5]))
    assert torch.equal(eng.cache.buffer, before)


@pytest.mark.parametrize("flags", [
    ["--cache", "1MiB", "--ring", "2", "--chunk", "16"],
    ["--vram", "12GiB"],                                    # CPU: the cache capped, auto scan
    ["--vram", "2GiB", "--ring", "4", "--prefill", "auto:512", "--max-prompt", "600"],
], ids=["forced", "auto-capped", "ring-max-prompt"])
def test_plan_equals_prefill(tiny_pack, capsys, flags):
    """The same flags give the same plan in `strata plan` and `strata prefill`."""
    common = ["--device", "cpu", *flags]
    if "--vram" not in flags:
        common += ["--vram", "2GiB"]
    assert main(["plan", "--pack", str(tiny_pack), "--prompt-tokens", "40", *common,
                 "--json"]) == 0
    planned = json.loads(capsys.readouterr().out)
    assert main(["prefill", str(tiny_pack), "--prompt-tokens", "40", *common, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["peak_vram_bytes"] == [None]     # the CPU: no GPU peak to report
    ran = report["plan"]
    for k in ("chunk", "ring", "ring_slots", "ring_bytes", "bytes_needed", "room", "rule",
              "fits", "full_ring", "probes"):
        assert planned[k] == ran[k], k
    # strata plan adds the rig's vram/layers/dense to each participant; the rest is the plan's
    assert [{f: p[f] for f in ran["participants"][0]} for p in planned["participants"]] == \
        ran["participants"]


def test_cpu_vram_is_a_budget_not_an_allocation(tiny_pack):
    """--vram 12GiB on the CPU for a ~230 KB model: the cache holds every expert plus a chunk's
    working set, kilobytes, not 12 GB."""
    from strata.engine.prefill import EngineConfig, PrefillEngine
    eng = PrefillEngine(tiny_pack, EngineConfig(vram=12 << 30, max_prompt=64, device="cpu",
                                                ffn="ref"))
    assert eng.cache.buffer.numel() < 64 << 20
    pk = Pack.open(tiny_pack)
    assert eng.cache.layout.n_slots == TINY.n_layer * TINY.n_expert   # every expert resident
    assert pk.max_blob * TINY.n_expert * TINY.n_layer <= eng.cache.buffer.numel()


FP32_REL = 1e-5   # one expert path (the fp32 reference) on both sides: only summation order


def test_resident_and_streamed_agree_by_default_on_cpu(tiny_pack, tmp_path, capsys):
    a, b = tmp_path / "a.npy", tmp_path / "b.npy"
    toks = ",".join(str(t) for t in range(3, 250, 7))
    assert main(["prefill", str(tiny_pack), "--tokens", toks, "--device", "cpu",
                 "--dump-logits", str(a)]) == 0
    assert main(["prefill", str(tiny_pack), "--tokens", toks, "--device", "cpu", "--vram", "2GiB",
                 "--cache", "64KiB",
                 "--ring", "2", "--chunk", "8", "--dump-logits", str(b), "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["experts"] == "ref" and out["bytes_streamed"] > 0
    la, lb = np.load(a), np.load(b)
    rel = np.abs(la - lb).max() / np.abs(la).max()
    assert rel < FP32_REL, rel
    assert (la.argmax(-1) == lb.argmax(-1)).all()


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="needs a CUDA device (runs on the GPU machine)")


@pytest.mark.gpu
@needs_cuda
def test_gpu_plan_equals_prefill_and_guards(tiny_pack, tmp_path, capsys):
    """On the GPU: the same flags, the same plan; NaN fails the prompt naming the layer; a --vram
    beyond the card is refused before anything is allocated."""
    flags = ["--device", "cuda", "--vram", "2GiB", "--cache", "64KiB", "--ring", "2", "--chunk", "8",
             "--experts", "torch"]
    assert main(["plan", "--pack", str(tiny_pack), "--prompt-tokens", "40", *flags, "--json"]) == 0
    planned = json.loads(capsys.readouterr().out)
    assert main(["prefill", str(tiny_pack), "--prompt-tokens", "40", *flags, "--json"]) == 0
    ran = json.loads(capsys.readouterr().out)["plan"]
    assert {k: planned[k] for k in ("chunk", "ring", "bytes_needed", "room", "rule")} == \
        {k: ran[k] for k in ("chunk", "ring", "bytes_needed", "room", "rule")}
    bad = _nan_pack(tiny_pack, tmp_path / "nan.pack")
    assert main(["prefill", str(bad), "--tokens", "1,2,3,4,5", *flags]) == 2
    assert "layer 1" in capsys.readouterr().err
    free, total = torch.cuda.mem_get_info()
    too_big = f"{(total >> 30) + 64}GiB"
    assert main(["prefill", str(tiny_pack), "--tokens", "1,2", "--vram", too_big]) == 2
    assert "does not fit" in capsys.readouterr().err


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf"), None],
                         ids=["nan", "inf", "-inf", "finite"])
@pytest.mark.parametrize("where", ["input", "output"])
def test_finite_guard_flags_exactly_the_bad_layer(bad, where):
    from strata.engine.finite import FiniteGuard, NonFiniteError

    g = FiniteGuard().begin(3)
    ffn = g.wrap(lambda x, ids, w, e, **kw: x * 2)
    ids = torch.zeros(4, 2, dtype=torch.int64)

    def layers():
        for l in range(3):
            g.routed(l, ids, None)
            x = torch.ones(4, 8)
            if bad is not None and l == 2 and where == "input":
                x[1, 3] = bad
            y = ffn(x, None, None, None)
            if bad is not None and l == 2 and where == "output":
                y[2, 5] = bad
            g.layer_done(l, x + y)
    if bad is None:
        layers()
    else:
        with pytest.raises(NonFiniteError, match="layer 2: " + (
                "the hidden state entering" if where == "input" else "its experts' output")):
            layers()
