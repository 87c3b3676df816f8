"""dequant_experts (Triton) == dequant_experts_torch, bit for bit, for experts with tokens only."""
import pytest
import torch

from strata.kernels.expert_dequant import dequant_experts, dequant_experts_torch
from strata.kernels.synth import random_expert_set


@pytest.mark.parametrize("fmts", [("BF16",), ("Q8_0", "Q4_0", "F16")], ids=lambda f: "-".join(f))
def test_dequant_matches_reference(fmts):
    experts = random_expert_set(3, 64, 32, *fmts, seed=5)
    counts = torch.tensor([2, 0, 1])                       # expert 1 idle: left untouched
    for name in ("gate", "up", "down"):
        got = dequant_experts(experts, name, counts)
        ref = dequant_experts_torch(experts, name, counts)
        assert torch.equal(got[counts > 0], ref[counts > 0])
        assert torch.isnan(got[1].float()).all(), "idle expert must cost nothing (not written)"
