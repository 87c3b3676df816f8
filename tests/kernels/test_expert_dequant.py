"""dequant_experts (Triton) == dequant_experts_torch, bit for bit, for experts with tokens only."""
import pytest
import torch

from strata.kernels.expert_dequant import dequant_experts, dequant_experts_torch
from strata.kernels.synth import random_expert_set
from strata.kernels.tiles import pin_tile

CASES = [(("BF16",), 64, 32), (("Q8_0", "Q4_0", "F16"), 64, 32),
         # rows of whole block pairs and 4-byte words: Q8_0/Q4_0 take the word path
         (("Q8_0", "Q4_0", "Q4_0"), 128, 192), (("Q4_0", "Q8_0", "Q8_0"), 192, 64),
         # the stock mixes' types (decode-once path for each new decoder)
         (("Q4_1", "Q5_1", "Q5_K"), 256, 256), (("Q2_K", "Q3_K", "IQ4_XS"), 256, 256),
         (("IQ2_XXS", "IQ2_XS", "IQ2_S"), 256, 256), (("IQ3_XXS", "IQ1_S", "IQ1_M"), 256, 256)]


@pytest.mark.parametrize("words", [True, False], ids=["words", "bytes"])
@pytest.mark.parametrize("fmts,D,F", CASES, ids=lambda c: "-".join(c) if isinstance(c, tuple)
                         else str(c))
def test_dequant_matches_reference(fmts, D, F, words):
    with pin_tile(words=words):
        _check_dequant(fmts, D, F)


def _check_dequant(fmts, D, F):
    experts = random_expert_set(3, D, F, *fmts, seed=5)
    counts = torch.tensor([2, 0, 1])                       # expert 1 idle: left untouched
    for name in ("gate", "up", "down"):
        mat = getattr(experts.layout, name)
        out = torch.full((3, mat.rows, mat.cols), float("nan"), dtype=torch.bfloat16)
        got = dequant_experts(experts, name, counts, out=out)
        ref = dequant_experts_torch(experts, name, counts)
        assert torch.equal(got[counts > 0], ref[counts > 0])
        assert torch.isnan(got[1].float()).all(), "idle expert must cost nothing (not written)"
