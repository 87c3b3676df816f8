"""Bad input, table-driven: every row is a command, its exit code and words its one stderr line
must hold. In-process `main()` calls (fast); a subprocess for the broken pipe. No row may leave
a traceback, a second stderr line, or a partial output file."""
from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

from strata.cli import main
from strata.packs.synth import ExpertFormats, synth_gguf, synth_pack
from strata.shapes import get_preset

TINY = get_preset("tiny")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("bad")
    f = {"dir": d}
    f["pack"] = synth_pack(d / "t.pack", TINY, ExpertFormats.of("Q8_0"), progress=False)
    f["gguf"] = synth_gguf(d / "t.gguf", TINY, ExpertFormats.of("Q8_0"), progress=False)
    import numpy as np
    np.save(d / "l.npy", np.zeros(3, np.float32))
    f["npy"] = d / "l.npy"
    f["gguf_npy"] = d / "g.npy"            # a GGUF by its bytes, whatever its name says
    f["gguf_npy"].write_bytes(Path(f["gguf"]).read_bytes())
    hf = d / "hf"
    hf.mkdir()
    (hf / "config.json").write_text('{"model_type": "qwen3_moe", "hidden_size": ')   # cut short
    f["hf"] = hf
    import strata.packs.synth_gguf as writer   # the synth GGUF's metadata, less rope.freq_base
    real = writer.metadata
    writer.metadata = lambda s: {k: v for k, v in real(s).items() if k != "rope.freq_base"}
    try:
        f["norope"] = synth_gguf(d / "norope.gguf", TINY, ExpertFormats.of("Q8_0"),
                                 progress=False)
    finally:
        writer.metadata = real
    return f


def _enospc(*a, **k):
    raise OSError(errno.ENOSPC, "No space left on device")


# (id, argv with {pack} {gguf} {npy} {hf} {norope} {dir} placeholders, exit, words, patch)
# patch: (module attribute, replacement) applied for the row.
ROWS = [
    ("pack-o-missing-folder", "pack {gguf} -o {dir}/no/such/x.pack", 2, ["folder", "does not exist"], None),
    ("pack-o-onto-folder", "pack {gguf} -o {dir}", 2, ["is a folder"], None),
    ("pack-onto-its-source", "pack {gguf} -o {gguf}", 2, ["input itself", "--force"], None),
    ("pack-onto-npy", "pack {gguf} -o {npy}", 2, ["NumPy", "--force"], None),
    ("pack-a-pack", "pack {pack} -o {dir}/p2.pack", 2, ["already a strata pack", "verify"], None),
    ("pack-full-disk", "pack {gguf} -o {dir}/full.pack", 2, ["no space left", "full.pack"],
     ("strata.packs.writer._blob_bytes", _enospc)),
    ("pack-broken-config", "pack {hf} -o {dir}/hf.pack", 2, ["config.json", "not valid JSON"], None),
    ("pack-hf-bogus-quant", "pack {hf} -o {dir}/hf.pack --quant BOGUS", 2, ["BOGUS"], None),
    ("pack-gguf-no-rope", "pack {norope} -o {dir}/nr.pack", 2, ["rope.freq_base", "missing"], None),
    ("synth-o-missing-folder", "synth --preset tiny -o {dir}/no/x.gguf", 2, ["does not exist"], None),
    ("synth-o-onto-folder", "synth --preset tiny -o {dir}", 2, ["is a folder"], None),
    ("synth-pack-o-missing-folder", "synth --preset tiny --pack -o {dir}/no/x.pack", 2, ["does not exist"], None),
    ("synth-gguf-over-pack", "synth --preset tiny -o {pack}", 2, ["strata pack", "--force"], None),
    ("synth-full-disk", "synth --preset tiny -o {dir}/full.gguf", 2, ["no space left", "full.gguf"],
     ("gguf.GGUFWriter.write_tensor_data", _enospc)),
    ("synth-pack-full-disk", "synth --preset tiny --pack -o {dir}/full2.pack", 2, ["no space left"],
     ("strata.packs.writer._blob_bytes", _enospc)),
    ("synth-hits-tokens-0", "synth --preset tiny -o {dir}/h.gguf --report-hits --hits-tokens 0", 2,
     ["--hits-tokens", "at least 1"], None),
    ("synth-hits-csv-missing-folder",
     "synth --preset tiny -o {dir}/h.gguf --report-hits --hits-csv {dir}/no/h.csv", 2,
     ["--hits-csv", "does not exist"], None),
    ("synth-bogus-quant-pack", "synth --preset tiny --quant BOGUS --pack -o {dir}/b.pack", 2, ["BOGUS"], None),
    ("prefill-a-gguf", "prefill {gguf} --tokens 1", 2, ["GGUF file, not a pack", "strata pack"], None),
    ("prefill-a-npy", "prefill {npy} --tokens 1", 2, ["NumPy", "not a pack"], None),
    ("prefill-dump-missing-folder", "prefill {pack} --tokens 1 --dump-logits {dir}/no/x.npy", 2,
     ["--dump-logits", "does not exist"], None),
    ("prefill-dump-onto-pack", "prefill {pack} --tokens 1 --dump-logits {pack}.npy --vram 2GiB", 0,
     [], None),   # a new .npy beside the pack is fine
    ("prefill-dump-onto-gguf", "prefill {pack} --tokens 1 --dump-logits {gguf_npy}", 2,
     ["GGUF", "--force"], None),
    ("prefill-dump-full-disk", "prefill {pack} --tokens 1,2 --dump-logits {dir}/full.npy", 2,
     ["no space left", "full.npy"], ("numpy.save", _enospc)),
    ("prefill-stream-dump-full-disk", "prefill {pack} --tokens 1,2 --vram 2GiB --dump-logits {dir}/f2.npy",
     2, ["no space left"], ("numpy.save", _enospc)),
    ("prefill-batch-negative", "prefill {pack} --tokens 1 --vram 2GiB --batch -1", 2, ["--batch", "at least 1"], None),
    ("prefill-plane-resident", "prefill {pack} --tokens 1 --experts plane", 2, ["--experts plane", "--vram"], None),
    ("prefill-plane-int8-resident", "prefill {pack} --tokens 1 --experts plane-int8", 2, ["--experts plane-int8 needs", "--vram"], None),
    ("prefill-max-prompt-0", "prefill {pack} --tokens 1 --vram 2GiB --max-prompt 0", 2, ["--max-prompt"], None),
    ("prefill-max-prompt-short", "prefill {pack} --tokens 1,2,3 --vram 2GiB --max-prompt 2", 2,
     ["--max-prompt", "3 tokens"], None),
    ("prefill-cache-over-vram", "prefill {pack} --tokens 1 --vram 2GiB --cache 3GiB", 2,
     ["--cache", "more than --vram"], None),
    ("prefill-longer-than-context", "prefill {pack} --prompt-tokens 40961", 2, ["context", "40960"], None),
    ("prefill-stream-longer-than-context", "prefill {pack} --prompt-tokens 40961 --vram 2GiB", 2,
     ["context"], None),
    ("prefill-host-ram", "prefill {pack} --tokens 1,2 --vram 12GiB", 2,
     ["host memory", "does not fit"], ("strata.budget.host_available", lambda: 1 << 10)),
    ("prefill-ring-0", "prefill {pack} --tokens 1 --vram 2GiB --ring 0", 2, ["--ring"], None),
    ("prefill-chunk-0", "prefill {pack} --tokens 1 --chunk 0", 2, ["--chunk"], None),
    ("plan-quant-with-pack", "plan --pack {pack} --quant BOGUS", 2, ["--quant", "--preset"], None),
    ("plan-a-gguf", "plan --pack {gguf}", 2, ["GGUF file, not a pack"], None),
    ("plan-cache-over-vram", "plan --preset tiny --vram 2GiB --cache 3GiB", 2, ["more than --vram"], None),
    ("plan-forced-chunk-names-ring", "plan --preset qwen3-30b-a3b --vram 6GiB --chunk 16384", 2,
     ["--ring", "fits with"], None),
    ("plan-prompt-longer-than-context", "plan --preset qwen3-30b-a3b --prompt-tokens 262145", 2,
     ["context"], None),
    ("plan-kv-does-not-fit", "plan --preset qwen3-30b-a3b --vram 4GiB --prompt-tokens 40960", 2,
     ["KV cache of 40,960 tokens", "--max-prompt"], None),
    ("verify-a-gguf", "verify {gguf}", 2, ["GGUF file, not a pack"], None),
    ("prefill-save-kv-missing-folder", "prefill {pack} --tokens 1,2 --device cpu --save-kv "
     "{dir}/nope/s.kv", 2, ["--save-kv", "does not exist"], None),
    ("prefill-save-kv-onto-pack", "prefill {pack} --tokens 1,2 --device cpu --save-kv {pack}", 2,
     ["--save-kv", "the input itself"], None),
    ("prefill-resume-missing", "prefill {pack} --tokens 1,2 --device cpu --resume {dir}/no.kv",
     2, ["--resume", "no such file"], None),
    ("prefill-resume-a-pack", "prefill {pack} --tokens 1,2 --device cpu --resume {pack}", 2,
     ["not a saved KV state"], None),
    ("prefill-resume-and-reuse", "prefill {pack} --tokens 1 --resume {npy} --reuse {npy}", 2,
     ["not allowed with"], None),
    ("prefill-save-kv-distributed", "prefill {pack} --tokens 1,2 --distributed --save-kv "
     "{dir}/s.kv", 2, ["--save-kv", "--distributed"], None),
    ("generate-n-0", "generate {pack} --tokens 1,2 --device cpu -n 0", 2, ["-n"], None),
    ("generate-no-prompt", "generate {pack} --device cpu", 2, ["give a prompt", "--resume"], None),
    ("generate-temperature-negative", "generate {pack} --tokens 1 --device cpu --temperature -1",
     2, ["--temperature"], None),
    ("plan-ctrl-c", "plan --preset tiny", 130, ["interrupted"],
     ("strata.commands.plan.make_plan", lambda a: (_ for _ in ()).throw(KeyboardInterrupt))),
]


def _patch(monkeypatch, spec):
    if spec is None:
        return
    target, repl = spec
    mod, _, attr = target.rpartition(".")
    import importlib
    try:
        obj = importlib.import_module(mod)
    except ModuleNotFoundError:
        m2, _, cls = mod.rpartition(".")
        obj = getattr(importlib.import_module(m2), cls)
    monkeypatch.setattr(obj, attr, repl)


@pytest.mark.parametrize("row", ROWS, ids=[r[0] for r in ROWS])
def test_bad_input(row, files, monkeypatch, capsys):
    _, argv, want_rc, words, patch = row
    argv = argv.format(**{k: str(v) for k, v in files.items()}).split()
    before = set(os.listdir(files["dir"]))
    _patch(monkeypatch, patch)
    try:
        rc = main(argv)
    except SystemExit as e:    # argparse's own refusals exit 2 from the parser
        rc = e.code
    err = capsys.readouterr().err
    lines = [l for l in err.replace("\r", "\n").splitlines() if l.startswith("strata")]
    assert rc == want_rc, err
    if want_rc:
        assert len(lines) == 1, err
        assert "Traceback" not in err
        for w in words:
            assert w in lines[0], (w, lines[0])
    left = {n for n in set(os.listdir(files["dir"])) - before if "partial" in n}
    assert not left, f"partial files left behind: {left}"


def test_rows_cover_the_issue():
    """The issue's list: each kind of mistake has a row (a guard against rows silently dropped)."""
    ids = {r[0] for r in ROWS}
    for need in ("pack-o-missing-folder", "pack-o-onto-folder", "synth-pack-o-missing-folder",
                 "pack-full-disk", "synth-full-disk", "prefill-dump-full-disk",
                 "prefill-dump-missing-folder", "pack-broken-config", "synth-hits-tokens-0",
                 "synth-hits-csv-missing-folder", "prefill-host-ram", "plan-ctrl-c",
                 "prefill-batch-negative", "prefill-max-prompt-0", "prefill-cache-over-vram",
                 "prefill-longer-than-context", "plan-quant-with-pack", "pack-gguf-no-rope",
                 "pack-onto-its-source", "synth-gguf-over-pack"):
        assert need in ids, need


def test_dump_logits_checked_before_the_prompt(files, monkeypatch, capsys):
    """An unwritable --dump-logits path fails before any prompt work (the model is never built)."""
    import strata.engine.prefill as engine
    import strata.engine.load as load
    monkeypatch.setattr(load, "load_model", lambda *a, **k: pytest.fail("prompt ran"))
    monkeypatch.setattr(engine, "PrefillEngine", lambda *a, **k: pytest.fail("engine built"))
    blocker = files["dir"] / "plain-file"
    blocker.write_text("x")
    for extra in ([], ["--vram", "2GiB"]):     # resident and streamed
        assert main(["prefill", str(files["pack"]), "--tokens", "1", *extra,
                     "--dump-logits", str(blocker / "x.npy")]) == 2
        assert "is not a folder" in capsys.readouterr().err


def test_read_only_dump_folder_refused_first(files, monkeypatch, capsys):
    import strata.engine.load as load
    monkeypatch.setattr(load, "load_model", lambda *a, **k: pytest.fail("prompt ran"))
    ro = files["dir"] / "ro"
    ro.mkdir(exist_ok=True)
    ro.chmod(0o500)
    try:
        if os.access(ro, os.W_OK):
            pytest.skip("running as a user who can write a read-only folder (root)")
        assert main(["prefill", str(files["pack"]), "--tokens", "1",
                     "--dump-logits", str(ro / "x.npy")]) == 2
        assert "not writable" in capsys.readouterr().err
    finally:
        ro.chmod(0o700)


def test_broken_pipe_is_one_line(files):
    """`strata plan | head`: the reader goes away; one line on stderr, exit 2, no traceback."""
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    p = subprocess.Popen([sys.executable, "-c", "import sys; from strata.cli import main; "
                          "sys.exit(main(['plan', '--preset', 'qwen3-30b-a3b']))"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    p.stdout.close()   # before the plan is printed: its first write meets a closed pipe
    err = p.stderr.read().decode()
    rc = p.wait(timeout=120)
    assert rc == 2, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "closed" in err
