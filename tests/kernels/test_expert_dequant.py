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


# "words": the word paths (Q8_0/Q4_0 pairs, the super-block formats' super-blocks); "bytes":
# every format through the byte path
PATHS = [dict(words=True, superblocks=True), dict(words=False, superblocks=False)]


@pytest.mark.parametrize("pin", PATHS, ids=["words", "bytes"])
@pytest.mark.parametrize("fmts,D,F", CASES, ids=lambda c: "-".join(c) if isinstance(c, tuple)
                         else str(c))
def test_dequant_matches_reference(fmts, D, F, pin):
    with pin_tile(**pin):
        _check_dequant(fmts, D, F)


@pytest.mark.gpu
@pytest.mark.parametrize("pin", PATHS, ids=["words", "bytes"])
@pytest.mark.parametrize("fmts", [("Q4_K", "Q5_K", "Q6_K"), ("Q2_K", "Q3_K", "IQ4_XS"),
                                  ("Q8_0", "Q4_0", "Q6_K")], ids="-".join)
def test_dequant_gpu(fmts, pin):
    # quantized weights (the stock mixes' formats) on the device; down [512, 768] has 3
    # super-blocks a row, so Q6_K/Q3_K rows alternate word parity
    with pin_tile(**pin):
        _check_dequant(fmts, 512, 768, device="cuda", E=4)


def _check_dequant(fmts, D, F, device="cpu", E=3):
    experts = random_expert_set(E, D, F, *fmts, seed=5, device=device)
    counts = torch.tensor([2, 0, 1, 3][:E], device=device)   # expert 1 idle: left untouched
    for name in ("gate", "up", "down"):
        mat = getattr(experts.layout, name)
        out = torch.full((E, mat.rows, mat.cols), float("nan"), dtype=torch.bfloat16,
                         device=device)
        got = dequant_experts(experts, name, counts, out=out)
        ref = dequant_experts_torch(experts, name, counts)
        # bits, not values: -0 and +0 must not pass for each other
        assert torch.equal(got[counts > 0].view(torch.int16), ref[counts > 0].view(torch.int16))
        assert torch.isnan(got[1].float()).all(), "idle expert must cost nothing (not written)"
