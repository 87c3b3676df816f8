"""benchmarks/profile_read.py's flags: the resident read's are refused with --what ffn, MLA's
launch with a model without MLA, the delta rule's with a model without linear attention, an
unknown preset, format or launch: one line, exit 2, before the GPU
check (on this CPU machine a valid line reaches that check, also exit 2, naming CUDA)."""
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _main():
    spec = importlib.util.spec_from_file_location("profile_read",
                                                  ROOT / "benchmarks" / "profile_read.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.main


@pytest.mark.parametrize("argv,says", [
    (["--preset", "deepseek-v3"], "--preset set the resident read's model"),
    (["--mla-block", "4096"], "--mla-* set the resident read's model"),
    (["--what", "resident", "--preset", "nope"], "unknown preset 'nope'"),
    (["--what", "resident", "--mla-backend", "flash"], "qwen3-30b-a3b has no MLA"),
    (["--what", "resident", "--quant", "Q9_9"], "unknown block format 'Q9_9'"),
    (["--delta", "backend=fla"], "--delta set the resident read's model"),
    (["--ops", "20"], "--ops set the resident read's model"),
    (["--what", "resident", "--ops", "-3"], "--ops takes a count"),
    (["--what", "resident", "--delta", "split"], "qwen3-30b-a3b has no linear-attention"),
    (["--what", "resident", "--preset", "qwen3.5-35b-a3b", "--delta", "backend=cuda"],
     "backend must be one of"),
    (["--what", "resident", "--preset", "deepseek-v3", "--quant", "Q4_K_M"], "needs CUDA"),
    (["--what", "resident", "--preset", "deepseek-v3", "--quant", "Q4_K_M", "--mla-backend",
      "triton"], "needs CUDA")])
def test_bad_flags_are_one_line(argv, says, capsys):
    import torch
    if torch.cuda.is_available() and says == "needs CUDA":
        pytest.skip("a CUDA machine runs the profile")
    assert _main()(argv) == 2
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and says in out[0], out
