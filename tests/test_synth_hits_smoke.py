"""benchmarks/synth_hits.py --smoke runs end to end and writes strata.bench rows."""
import importlib.util
from pathlib import Path

import torch

from strata import bench

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "synth_hits.py"


def test_synth_hits_smoke(tmp_path):
    spec = importlib.util.spec_from_file_location("synth_hits", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--smoke", "--out", str(tmp_path)]) == 0
    (csv_path,) = tmp_path.glob("synth-hits-smoke-*.csv")
    assert csv_path.with_suffix(".png").stat().st_size > 5_000
    rows = bench.read_csv(csv_path)
    assert {r["figure"] for r in rows} == set(mod.FIGURES)
    hits = [r for r in rows if r["figure"] == "hit_fraction"]
    assert len(hits) == 2 * 3                        # two q/k norm scales x 3 layers
    assert all(0 < r["value"] <= 1 and 0 < r["bound_value"] <= 1 for r in hits)


def test_qk_norm_scale_is_a_parameter_of_the_synthesizer():
    """synth_hits compares q/k norm scales by passing them to synth_pack: the scale reaches the
    q/k norm weights (1 + jitter around it) and leaves the other norms at 1."""
    from strata.packs.synth import QK_NORM_SCALE, synth_dense
    from strata.shapes import get_preset
    shape = get_preset("tiny")
    for scale in (QK_NORM_SCALE, 1.0):
        d = synth_dense(shape, qk_norm_scale=scale)
        for name in ("blk.0.attn_q_norm.weight", "blk.0.attn_k_norm.weight"):
            assert abs(d[name].float().mean().item() - scale) < 0.1 * scale
        assert abs(d["blk.0.attn_norm.weight"].float().mean().item() - 1.0) < 0.1
    assert torch.equal(synth_dense(shape)["blk.0.attn_q_norm.weight"],
                       synth_dense(shape, qk_norm_scale=QK_NORM_SCALE)["blk.0.attn_q_norm.weight"])
