"""experiments/kv_resume.py --smoke: the resume, decode and questions cells run on the CPU, the
resumed logits equal the full read's, every question reuses the whole document, and the CSV and
PNG are written."""
from __future__ import annotations

import csv
import json
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_kv_resume_smoke(tmp_path):
    spec = importlib.util.spec_from_file_location("kv_resume", ROOT / "experiments" / "kv_resume.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--smoke", "--out", str(tmp_path), "--state-dir", str(tmp_path)]) == 0
    rows = list(csv.DictReader(open(tmp_path / "kv_resume-smoke.csv")))
    val = {r["figure"]: float(r["value"]) for r in rows}
    for fig in ("state_bytes", "full_read_s", "save_s", "load_s", "resume_first_s", "resume_s",
                "resume_speedup", "decode_tokens_per_s", "doc_read_s"):
        assert val[fig] > 0, fig
    assert val["resume_max_rel"] == 0.0 and val["resume_argmax_agree"] == 1.0
    ttft = [r for r in rows if r["figure"] == "ttft_s"]
    assert len(ttft) == 3 and all(json.loads(r["config"])["reused"] == 24 for r in ttft)
    for part in ("open", "setup", "restore", "read", "teardown"):   # each question's time, apart
        got = [float(r["value"]) for r in rows if r["figure"] == f"ttft_{part}_s"]
        assert len(got) == 3 and all(0 <= v <= t for v, t in
                                     zip(got, (float(r["value"]) for r in ttft)))
    assert (tmp_path / "kv_resume-smoke.png").exists()
    assert not list(tmp_path.glob("*.kv"))      # the states are removed after their cells


def test_kv_resume_parts(tmp_path, capsys):
    """--parts questions: the questions alone (no resume or decode rows); decode without resume
    is refused."""
    import pytest
    spec = importlib.util.spec_from_file_location("kv_resume",
                                                  ROOT / "experiments" / "kv_resume.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--smoke", "--parts", "questions", "--out", str(tmp_path),
                     "--state-dir", str(tmp_path)]) == 0
    figs = {r["figure"] for r in csv.DictReader(open(tmp_path / "kv_resume-smoke.csv"))}
    assert "ttft_s" in figs and "doc_read_s" in figs
    assert not figs & {"resume_s", "decode_tokens_per_s"}
    with pytest.raises(SystemExit) as e:
        mod.main(["--smoke", "--parts", "decode", "--out", str(tmp_path)])
    assert e.value.code == 2 and "decode with resume" in capsys.readouterr().err
