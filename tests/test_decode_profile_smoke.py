"""experiments/decode_profile.py runs end to end on the CPU (a few tokens, the FFN stubbed and
the reference one) and reports its per-token and per-layer figures."""
import torch

import strata.models.moe as moe
from tests.scripts import load_script


def test_decode_profile_smoke(capsys):
    mod = load_script("experiments/decode_profile.py")
    real, threads = moe.moe_ffn_ref, torch.get_num_threads()
    for extra in (["--stub-ffn"], []):
        assert mod.main(["-n", "3", "--top", "3", *extra]) == 0
        out = capsys.readouterr().out
        assert out.startswith("2 forwards: ") and " ms a token, " in out, out[:400]
        # the stub and the one thread were this run's: the process gets its own back (a stub
        # left in place made a later test in the same worker read every expert as zero)
        assert moe.moe_ffn_ref is real and torch.get_num_threads() == threads
