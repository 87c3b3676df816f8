"""fla-core's five kernels import without the rest of fla-core (strata.kernels.deltanet.fla_import):
no torch._dynamo, no fla layers or models, torch.compiler.disable as it was, and a later
`import fla` in the same process is fla's own package over the same kernel modules."""
import subprocess
import sys

from strata.kernels.deltanet.fla_rule import FLA_VERSION
from tests.kernels.test_deltanet_chunk import needs_fla

LEAN = """
import sys, warnings
import torch
held = torch.compiler.disable
from strata.kernels.deltanet.fla_rule import fla_kernels
ks = fla_kernels()
print("DYNAMO", any(m.startswith("torch._dynamo") for m in sys.modules))
print("FLA", sum(m.startswith("fla") for m in sys.modules))
print("LAYERS", "fla.layers" in sys.modules, "STANDIN", "fla" in sys.modules)
print("DISABLE", torch.compiler.disable is held)
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import fla
    from fla.ops.common import chunk_delta_h
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule
print("LATER", fla.__version__, callable(chunk_gated_delta_rule),
      chunk_delta_h.chunk_gated_delta_rule_fwd_kernel_h_blockdim64 is ks["scan"])
"""


def _fresh(code: str) -> str:
    """`code`'s standard output in a fresh interpreter (what it imports is its own)."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


@needs_fla
def test_the_five_kernels_import_without_the_rest_of_fla():
    stdout = _fresh(LEAN)
    lines = dict(line.split(" ", 1) for line in stdout.splitlines() if " " in line)
    assert lines["DYNAMO"] == "False", stdout
    # the five modules and what they import: a few dozen, where fla's own __init__s load ~270
    assert int(lines["FLA"]) < 60, stdout
    assert lines["LAYERS"] == "False STANDIN False", stdout
    assert lines["DISABLE"] == "True", stdout
    assert lines["LATER"] == f"{FLA_VERSION} True True", stdout


@needs_fla
def test_an_imported_fla_is_used_as_it_is():
    """Where the process imported fla itself, its modules are taken as they are."""
    code = ("import sys, warnings\nwarnings.simplefilter('ignore')\nimport fla\n"
            "from strata.kernels.deltanet.fla_rule import fla_kernels\n"
            "from fla.ops.common import chunk_delta_h\n"
            "print('SAME', fla_kernels()['scan'] is "
            "chunk_delta_h.chunk_gated_delta_rule_fwd_kernel_h_blockdim64, "
            "sys.modules['fla'] is fla)\n")
    stdout = _fresh(code)
    assert "SAME True True" in stdout, stdout
