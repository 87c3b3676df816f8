"""`strata plan` for the DeepSeek / GLM-4.5 presets: what a 12 / 24 / 80 GiB card streams per
chunk at Q4_K with the KV of a 32K prompt (the table in docs/families.md).

Dense weights stay resident in bf16 (attention, the 3 leading dense FFNs, shared experts,
embeddings and head): DeepSeek-V3 31.9 GiB, Kimi-K2 21.8 GiB, GLM-4.5 31.4 GiB, so one 12 or
24 GiB card has no room for an expert cache (one line, exit 2, naming the dense bytes); an
80 GiB card reads 32K-token chunks through a full ring; three 24 GiB cards split the layers.
"""
import json

import pytest

from strata.cli import main


def plan(capsys, preset, *vram):
    argv = ["plan", "--preset", preset, "--quant", "Q4_K", "--max-prompt", "32768", "--json"]
    for v in vram:
        argv += ["--vram", v]
    rc = main(argv)
    out = capsys.readouterr()
    return rc, (json.loads(out.out) if rc == 0 else out.err)


@pytest.mark.parametrize("preset,dense_gib", [("deepseek-v3", "31.88"), ("kimi-k2", "21.83"),
                                              ("glm-4.5", "31.36")])
def test_one_small_card_has_no_room_for_the_dense_weights(capsys, preset, dense_gib):
    for v in ("12GiB", "24GiB"):
        rc, err = plan(capsys, preset, v)
        assert rc == 2 and "no room for an expert cache" in err
        assert f"dense weights {dense_gib} GiB" in err and err.count("\n") == 1


@pytest.mark.parametrize("preset,ring", [("deepseek-v3", 21), ("kimi-k2", 21), ("glm-4.5", 40)])
def test_an_80_gib_card_reads_32k_chunks(capsys, preset, ring):
    rc, d = plan(capsys, preset, "80GiB")
    assert rc == 0 and d["fits"] and d["chunk"] == 32768 and d["ring"] == ring


def test_three_24_gib_cards_split_deepseek_v3(capsys):
    rc, d = plan(capsys, "deepseek-v3", "24GiB", "24GiB", "24GiB")
    assert rc == 0 and d["fits"] and len(d["participants"]) == 3
    assert d["chunk"] == 25088 and d["ring"] == 21


def test_a_stock_mix_plans_as_its_synthesized_pack(capsys, tmp_path):
    """--quant takes a stock mix: each layer's expert formats as the mix lays them, so `strata
    plan --preset P --quant Q4_K_M` is the plan of the pack `strata synth --mix Q4_K_M` writes
    (its layers' blobs differ: Q5_0 and, in the bumped layer, a Q8_0 down), all but its name."""
    pack = tmp_path / "t.pack"
    assert main(["synth", "--preset", "tiny-qwen3moe", "--mix", "Q4_K_M", "--layers", "2",
                 "--pack", "-o", str(pack)]) == 0
    capsys.readouterr()
    run = ["--vram", "2GiB", "--cache", "32MiB", "--prompt-tokens", "300", "--json"]
    got = {}
    for src in (["--pack", str(pack)],
                ["--preset", "tiny-qwen3moe", "--quant", "Q4_K_M", "--layers", "2"]):
        assert main(["plan", *src, *run]) == 0
        got[src[0]] = json.loads(capsys.readouterr().out)
    a, b = got["--pack"], got["--preset"]
    assert b.pop("model") == "tiny-qwen3moe Q4_K_M (first 2 layers)" and a.pop("model")
    # how this host would pin the experts: a pack file's question only
    assert a.pop("host")["experts_bytes"] > 0 and "host" not in b
    assert a == b
