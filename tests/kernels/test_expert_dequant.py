"""dequant_experts (Triton) == dequant_experts_torch, bit for bit, for experts with tokens only."""
import pytest
import torch

from strata.kernels.moe.expert_dequant import dequant_experts, dequant_experts_torch
from strata.kernels.moe.random_experts import random_expert_set
from strata.kernels.moe.tiles import pin_tile

CASES = [(("BF16",), 64, 32), (("Q8_0", "Q4_0", "F16"), 64, 32),
         # rows of whole block pairs and 4-byte words: Q8_0/Q4_0 take the word path
         (("Q8_0", "Q4_0", "Q4_0"), 128, 192), (("Q4_0", "Q8_0", "Q8_0"), 192, 64),
         # the stock mixes' types (decode-once path for each new decoder)
         (("Q4_1", "Q5_1", "Q5_K"), 256, 256), (("Q2_K", "Q3_K", "IQ4_XS"), 256, 256),
         (("IQ2_XXS", "IQ2_XS", "IQ2_S"), 256, 256), (("IQ3_XXS", "IQ1_S", "IQ1_M"), 256, 256),
         # MXFP4 (gpt-oss's experts): the stream path, rows of 3 blocks (51 bytes) and of 2
         (("MXFP4", "MXFP4", "MXFP4"), 96, 64)]


# "words": the word paths (Q8_0/Q4_0 pairs, MXFP4 streams, the super-block formats'
# super-blocks); "bytes": every format through the byte path
PATHS = [dict(words=True, streams=True, superblocks=True),
         dict(words=False, streams=False, superblocks=False)]


@pytest.mark.parametrize("pin", PATHS, ids=["words", "bytes"])
@pytest.mark.parametrize("fmts,D,F", CASES, ids=lambda c: "-".join(c) if isinstance(c, tuple)
                         else str(c))
def test_dequant_matches_reference(fmts, D, F, pin):
    with pin_tile(**pin):
        _check_dequant(fmts, D, F)


# the word path's tile is a launch choice (TileConfig.word_tile): rows past the matrix's end
# (16 x 256 on 128 rows is exact, 128 x 128 on 64 rows masks half), columns past its end
# (256 on a 192-wide row masks a pair)
@pytest.mark.parametrize("tile", [(16, 256), (128, 128), (32, 192)], ids=lambda t: f"{t[0]}x{t[1]}")
def test_word_tiles_decode_the_same_bits(tile):
    with pin_tile(words=True, superblocks=False, word_tile=tile):
        _check_dequant(("Q8_0", "Q4_0", "Q4_0"), 128, 192)
        _check_dequant(("Q4_0", "Q8_0", "Q8_0"), 64, 256)


def test_word_tile_must_be_whole_pairs():
    from strata.errors import StrataError
    for bad in ((64, 32), (48, 64), (64, 100), "64x64"):
        with pytest.raises(StrataError):
            with pin_tile(word_tile=bad):
                pass


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
