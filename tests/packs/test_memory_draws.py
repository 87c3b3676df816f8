"""MemoryPack's dense draws keep a hybrid's DeltaNet layers stable: ssm_a (= -exp(A_log)) is
negative in every head, as synth_pack draws it, so a long read stays finite. With ssm_a drawn
like a weight (around 0), half the heads grew their state by e^g a token and a qwen3.5-35b-a3b
read turned to NaN from token ~1900 (the GPU's router then routed those rows past the experts)."""
import pytest
import torch

from strata.engine.load import load_model, resident_provider
from strata.models.moe import expert_ffn
from strata.packs.memory import MemoryPack
from strata.packs.synth import ExpertFormats
from strata.packs.synth_draws import SSM_A_RANGE
from strata.shapes import get_preset

HYBRIDS = ["tiny-qwen35moe", "tiny-qwen3next"]


@pytest.mark.parametrize("preset", HYBRIDS)
def test_ssm_a_decays_in_every_head(preset):
    shape = get_preset(preset)
    mem = MemoryPack(shape, ExpertFormats.of("Q8_0"), seed=5, device="cpu")
    names = [n for n in mem.dense_names() if n.endswith("ssm_a")]
    assert len(names) == sum(shape.layer_kind(l) == "linear" for l in range(shape.n_layer)) > 0
    lo, hi = SSM_A_RANGE
    for name in names:
        a = mem.dense(name)
        assert a.dtype == torch.float32 and a.shape == (shape.linear.n_v_head,), name
        assert ((a <= -lo) & (a >= -hi)).all(), (name, a)


def test_long_read_stays_finite():
    """2048 tokens through tiny-qwen35moe's three DeltaNet layers on the CPU: the last logits are
    finite (the drawn decays keep every head's state bounded)."""
    shape = get_preset("tiny-qwen35moe")
    mem = MemoryPack(shape, ExpertFormats.of("Q8_0"), seed=0, device="cpu")
    model = load_model(mem, dtype=torch.float32, ffn=expert_ffn("torch"))
    tok = torch.randint(0, shape.vocab, (2048,), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        y = model.prefill(tok, resident_provider(mem), logits="last")
    assert torch.isfinite(y).all()
