"""Triton kernels. Block decode helpers live in `strata.kernels.decode`."""
from strata.kernels.dequant import dequantize, dequantize_torch

__all__ = ["dequantize", "dequantize_torch"]
