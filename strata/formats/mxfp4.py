"""MXFP4 (OCP microscaling): 32 e2m1 weights sharing one e8m0 power-of-two scale, 17 bytes."""
from __future__ import annotations

import numpy as np
import torch

from strata.formats._util import nibbles
from strata.formats.tables import KVALUES_MXFP4


def e8m0_to_fp32_half(e: torch.Tensor) -> torch.Tensor:
    """ggml_e8m0_to_fp32_half: 2**(e-128) as fp32 (subnormal for e < 2), exact."""
    e = e.to(torch.int32)
    bits = torch.where(e < 2, torch.full_like(e, 0x00200000) << e, (e - 1) << 23)
    return bits.view(torch.float32)


def dequantize_mxfp4(blocks: torch.Tensor) -> torch.Tensor:
    """MXFP4 [n, 17]: e8m0 e; qs[16] nibbles (ggml order) index the doubled e2m1 values.
    w = d * kv[q] with d = 2**(e-128) (half the e8m0 scale, since kv is doubled)."""
    d = e8m0_to_fp32_half(blocks[:, :1])
    kv = torch.tensor(KVALUES_MXFP4, dtype=torch.float32, device=blocks.device)
    return d * kv[nibbles(blocks[:, 1:]).long()]


def quantize_mxfp4(x: torch.Tensor) -> torch.Tensor:
    """gguf-py / ggml quantize_row_mxfp4_ref: e = floor(log2(amax)) - 2 + 127 (0 when amax == 0),
    then each weight takes the nearest doubled e2m1 value (first on ties).

    log2 runs through numpy's float32 log2, the one gguf-py uses: near a power of two the floor of
    a rounded log2 depends on the implementation, and gguf-py's bytes are the contract.
    """
    amax = x.abs().amax(dim=1, keepdim=True)
    a = amax.cpu().numpy()
    with np.errstate(divide="ignore"):
        e = np.where(a > 0, np.floor(np.log2(a)) - 2 + 127, 0).astype(np.uint8)
    e = torch.from_numpy(e).to(x.device)
    d = e8m0_to_fp32_half(e)                                            # [n, 1]
    kv = torch.tensor(KVALUES_MXFP4, dtype=torch.float32, device=x.device)
    err = (d[:, :, None] * kv - x[:, :, None]).abs()                    # [n, 32, 16]
    q = err.argmin(dim=2).to(torch.int32)
    qs = q[:, :16] | (q[:, 16:] << 4)
    return torch.cat([e, qs.to(torch.uint8)], dim=1)
