"""experiments/decode_profile.py runs end to end on the CPU (a few tokens, the FFN stubbed and
the reference one) and reports its per-token and per-layer figures."""
from tests.scripts import load_script


def test_decode_profile_smoke(capsys):
    mod = load_script("experiments/decode_profile.py")
    for extra in (["--stub-ffn"], []):
        assert mod.main(["-n", "3", "--top", "3", *extra]) == 0
        out = capsys.readouterr().out
        assert out.startswith("2 forwards: ") and " ms a token, " in out, out[:400]
