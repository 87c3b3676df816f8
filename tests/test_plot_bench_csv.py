"""benchmarks/plot_bench_csv.py draws a `strata bench -o csv` file and refuses others in a line."""
from strata.commands.bench import to_csv
from tests.scripts import load_script


def _row(P, tps):
    return dict(model="m", pack_bytes=1, vram="1 GiB", kv="auto", delta="", prefix_attention="",
                dense_layers="",
                planned_for=32768, cache_bytes=1, peak_vram="", test=f"pp{P}",
                n_tokens=P, chunk=P, ring=4, reps=1, tokens_per_s=tps, tokens_per_s_sd=0.0,
                seconds=P / tps, bytes_streamed=1, kv_streamed=0, h2d_gbps=50.0, pcie_bound_tokens_per_s=2 * tps,
                compute_floor_tokens_per_s=3 * tps, bound_tokens_per_s=2 * tps, of_bound=0.5, warmup_s=0.1, wait_s=0.0,
                floor_experts_s=0.1, floor_attention_s=0.1, floor_linear_s=0.0,
                floor_dense_s=0.1, linear_at_dense_s=None)


def test_draws_a_bench_csv(tmp_path):
    src = tmp_path / "b.csv"
    src.write_text(to_csv([_row(8192, 1000.0), _row(32768, 2000.0)]))
    assert load_script("benchmarks/plot_bench_csv.py").main([str(src)]) == 0
    assert src.with_suffix(".png").stat().st_size > 0


def test_refuses_another_csv(tmp_path, capsys):
    src = tmp_path / "x.csv"
    src.write_text("a,b\n1,2\n")
    mod = load_script("benchmarks/plot_bench_csv.py")
    assert mod.main([str(src)]) == 2
    assert mod.main([str(tmp_path / "missing.csv")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(e.startswith("plot_bench_csv: ") for e in err)
