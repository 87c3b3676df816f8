"""strata.formats.dequantize / quantize against gguf-py (the oracle), bit for bit."""
import gguf
import numpy as np
import pytest
import torch

from strata.errors import StrataError
from strata.formats import dequantize, get_format, quantize
from blocks import random_matrix, same_bits

GGUF_DECODES = ["F16", "BF16", "Q8_0", "Q4_0", "Q5_0", "IQ4_NL", "Q4_K", "Q6_K", "IQ3_S", "MXFP4"]
GGUF_ENCODES = ["BF16", "Q8_0", "Q4_0", "Q5_0", "MXFP4"]


def gguf_dequantize(raw: torch.Tensor, name: str) -> torch.Tensor:
    return torch.from_numpy(gguf.quants.dequantize(raw.numpy(), gguf.GGMLQuantizationType[name]))


@pytest.mark.parametrize("name", GGUF_DECODES)
def test_dequantize_matches_gguf_random_blocks(name):
    fmt = get_format(name)
    raw = random_matrix(fmt, 7, 4 * max(fmt.block, 32), seed=3)
    assert same_bits(dequantize(raw, name), gguf_dequantize(raw, name))


@pytest.mark.parametrize("name", GGUF_ENCODES)
def test_quantize_matches_gguf(name):
    x = torch.randn(6, 256, generator=torch.Generator().manual_seed(5)) * 3
    x[0, :32] = 0                      # an all-zero block: d == 0
    x[1, 5] = 1e5                      # a block dominated by one outlier
    want = gguf.quants.quantize(x.numpy(), gguf.GGMLQuantizationType[name])
    got = quantize(x, name)
    assert np.array_equal(got.numpy(), want)


def test_errors_are_clear():
    with pytest.raises(StrataError, match="34-byte blocks"):
        dequantize(torch.zeros(2, 35, dtype=torch.uint8), "Q8_0")
    with pytest.raises(StrataError, match="unknown block format"):
        dequantize(torch.zeros(2, 34, dtype=torch.uint8), "Q9_0")
    with pytest.raises(StrataError, match="multiple of 32"):
        quantize(torch.zeros(2, 40), "Q8_0")
