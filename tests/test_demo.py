"""`strata demo` (the README's first command) runs end to end and streams."""
import json

from strata.cli import main


def test_demo_streams(capsys):
    assert main(["demo", "--json", "--tokens", "300"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["n_tokens"] == 300 and r["bytes_streamed"] > 0
    assert r["plan"]["fits"] and isinstance(r["prefill_ring"], int)
    assert 0 < r["cache_hits"] < r["routed"]
