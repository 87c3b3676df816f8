"""experiments/long_prompt.py --smoke: every cell reads (bf16/int8, all resident and a streamed
window), the CSV carries tokens/s and the KV bytes streamed, and the PNG is written."""
from __future__ import annotations

import csv
import json
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_long_prompt_smoke(tmp_path):
    spec = importlib.util.spec_from_file_location("long_prompt", ROOT / "experiments" / "long_prompt.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--smoke", "--out", str(tmp_path)]) == 0
    rows = list(csv.DictReader(open(tmp_path / "long_prompt-smoke.csv")))
    tps = [r for r in rows if r["figure"] == "tokens_per_s"]
    assert len(tps) == 4 and all(float(r["value"]) > 0 for r in tps), tps
    kv = [float(r["value"]) for r in rows if r["figure"] == "kv_bytes"]
    assert sorted(kv)[:2] == [0.0, 0.0] and max(kv) > 0     # all-resident cells stream no KV
    assert (tmp_path / "long_prompt-smoke.png").exists()
    # the engine's own warm-up by default, its cost beside the read; nothing left to the read
    assert all(json.loads(r["config"])["warm"] == "engine" for r in tps)
    assert len([r for r in rows if r["figure"] == "warmup_s" and float(r["value"]) > 0]) == 4
    assert [float(r["value"]) for r in rows if r["figure"] == "variants_missed"] == [0.0] * 4
