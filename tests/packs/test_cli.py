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
