"""What the engine's start imports: nothing that costs seconds and is never used.

torch.nn.attention.bias pulls in torch._dynamo (about 2 s of import on an idle CPU, 5 s on the
H200 machine beside the pinning threads: experiments/results cold_warm-…-fdc6190). The engine's
attention goes through PromptKV and never needs it, so building an engine must not import it, nor (on the GPU, where later chunks
take the flash op directly: strata.models.attention.lower_right_causal) reading a prompt."""
import subprocess
import sys

import torch


def test_engine_start_does_not_import_dynamo(tmp_path):
    code = (
        "import sys\n"
        "import torch\n"
        "from strata.packs.synth import ExpertFormats, synth_pack\n"
        "from strata.shapes import get_preset\n"
        "from tests.engine.test_streaming import engine\n"
        f"p = synth_pack({str(tmp_path / 't.pack')!r}, get_preset('tiny'), "
        "ExpertFormats.of('Q8_0'), seed=0, progress=False)\n"
        "n = lambda: sum(m.startswith('torch._dynamo') for m in sys.modules)\n"
        "eng = engine(p, ring=2)\n"
        "print('START', n())\n"
        "eng.run(torch.arange(40) % eng.shape.vocab, logits='last')   # three chunks\n"
        "print('READ', n())\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "START 0" in out.stdout, out.stdout
    if torch.cuda.is_available():   # later chunks go to the flash op (on the CPU: torch's route)
        assert "READ 0" in out.stdout, out.stdout
