"""Lookup tables of the ggml formats, held once: the torch references and Triton decoders read
them here.

- KVALUES_IQ4NL: the 16 non-linear IQ4_NL levels a nibble indexes (ggml kvalues_iq4nl).
- KVALUES_MXFP4: the 16 e2m1 values a nibble indexes, doubled to integers (ggml kvalues_mxfp4);
  MXFP4's e8m0 scale is therefore decoded as *half* its power of two (ggml_e8m0_to_fp32_half).
- IQ3S_GRID: IQ3_S's 512 grid points, 4 magnitudes each (odd, 1..15), packed as ggml's
  iq3s_grid: byte j of word i is magnitude j of point i. tests/test_tables.py checks it equals
  the grid gguf-py decodes from its own packed copy.

- The IQ2_XXS / IQ2_XS / IQ2_S / IQ3_XXS / IQ1_S (= IQ1_M) grids are read from gguf-py's own
  packed copies when first asked for (`grid_values`), not held here: gguf-py is a dependency and
  its decoder is the oracle, so the two cannot drift apart.
- KSIGNS_IQ2XS: the 128 sign bytes of ggml's ksigns_iq2xs (7 stored sign bits, the 8th the
  parity that makes the count of minus signs even), computed from that rule.

`device_table(name, device)` gives the int32 tensor a Triton kernel takes as a pointer argument.
"""
from __future__ import annotations

import functools

import torch

KVALUES_IQ4NL = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)

KVALUES_MXFP4 = (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)

IQ3S_GRID = (
    0x01010101, 0x01010103, 0x01010105, 0x0101010b, 0x0101010f, 0x01010301, 0x01010303, 0x01010305,
    0x01010309, 0x0101030d, 0x01010501, 0x01010503, 0x0101050b, 0x01010707, 0x01010901, 0x01010905,
    0x0101090b, 0x0101090f, 0x01010b03, 0x01010b07, 0x01010d01, 0x01010d05, 0x01010f03, 0x01010f09,
    0x01010f0f, 0x01030101, 0x01030103, 0x01030105, 0x01030109, 0x01030301, 0x01030303, 0x0103030b,
    0x01030501, 0x01030507, 0x0103050f, 0x01030703, 0x0103070b, 0x01030909, 0x01030d03, 0x01030d0b,
    0x01030f05, 0x01050101, 0x01050103, 0x0105010b, 0x0105010f, 0x01050301, 0x01050307, 0x0105030d,
    0x01050503, 0x0105050b, 0x01050701, 0x01050709, 0x01050905, 0x0105090b, 0x0105090f, 0x01050b03,
    0x01050b07, 0x01050f01, 0x01050f07, 0x01070107, 0x01070303, 0x0107030b, 0x01070501, 0x01070505,
    0x01070703, 0x01070707, 0x0107070d, 0x01070909, 0x01070b01, 0x01070b05, 0x01070d0f, 0x01070f03,
    0x01070f0b, 0x01090101, 0x01090307, 0x0109030f, 0x01090503, 0x01090509, 0x01090705, 0x01090901,
    0x01090907, 0x01090b03, 0x01090f01, 0x010b0105, 0x010b0109, 0x010b0501, 0x010b0505, 0x010b050d,
    0x010b0707, 0x010b0903, 0x010b090b, 0x010b090f, 0x010b0d0d, 0x010b0f07, 0x010d010d, 0x010d0303,
    0x010d0307, 0x010d0703, 0x010d0b05, 0x010d0f03, 0x010f0101, 0x010f0105, 0x010f0109, 0x010f0501,
    0x010f0505, 0x010f050d, 0x010f0707, 0x010f0b01, 0x010f0b09, 0x03010101, 0x03010103, 0x03010105,
    0x03010109, 0x03010301, 0x03010303, 0x03010307, 0x0301030b, 0x0301030f, 0x03010501, 0x03010505,
    0x03010703, 0x03010709, 0x0301070d, 0x03010b09, 0x03010b0d, 0x03010d03, 0x03010f05, 0x03030101,
    0x03030103, 0x03030107, 0x0303010d, 0x03030301, 0x03030309, 0x03030503, 0x03030701, 0x03030707,
    0x03030903, 0x03030b01, 0x03030b05, 0x03030f01, 0x03030f0d, 0x03050101, 0x03050305, 0x0305030b,
    0x0305030f, 0x03050501, 0x03050509, 0x03050705, 0x03050901, 0x03050907, 0x03050b0b, 0x03050d01,
    0x03050f05, 0x03070103, 0x03070109, 0x0307010f, 0x03070301, 0x03070307, 0x03070503, 0x0307050f,
    0x03070701, 0x03070709, 0x03070903, 0x03070d05, 0x03070f01, 0x03090107, 0x0309010b, 0x03090305,
    0x03090309, 0x03090703, 0x03090707, 0x03090905, 0x0309090d, 0x03090b01, 0x03090b09, 0x030b0103,
    0x030b0301, 0x030b0307, 0x030b0503, 0x030b0701, 0x030b0705, 0x030b0b03, 0x030d0501, 0x030d0509,
    0x030d050f, 0x030d0909, 0x030d090d, 0x030f0103, 0x030f0107, 0x030f0301, 0x030f0305, 0x030f0503,
    0x030f070b, 0x030f0903, 0x030f0d05, 0x030f0f01, 0x05010101, 0x05010103, 0x05010107, 0x0501010b,
    0x0501010f, 0x05010301, 0x05010305, 0x05010309, 0x0501030d, 0x05010503, 0x05010507, 0x0501050f,
    0x05010701, 0x05010705, 0x05010903, 0x05010907, 0x0501090b, 0x05010b01, 0x05010b05, 0x05010d0f,
    0x05010f01, 0x05010f07, 0x05010f0b, 0x05030101, 0x05030105, 0x05030301, 0x05030307, 0x0503030f,
    0x05030505, 0x0503050b, 0x05030703, 0x05030709, 0x05030905, 0x05030b03, 0x05050103, 0x05050109,
    0x0505010f, 0x05050503, 0x05050507, 0x05050701, 0x0505070f, 0x05050903, 0x05050b07, 0x05050b0f,
    0x05050f03, 0x05050f09, 0x05070101, 0x05070105, 0x0507010b, 0x05070303, 0x05070505, 0x05070509,
    0x05070703, 0x05070707, 0x05070905, 0x05070b01, 0x05070d0d, 0x05090103, 0x0509010f, 0x05090501,
    0x05090507, 0x05090705, 0x0509070b, 0x05090903, 0x05090f05, 0x05090f0b, 0x050b0109, 0x050b0303,
    0x050b0505, 0x050b070f, 0x050b0901, 0x050b0b07, 0x050b0f01, 0x050d0101, 0x050d0105, 0x050d010f,
    0x050d0503, 0x050d0b0b, 0x050d0d03, 0x050f010b, 0x050f0303, 0x050f050d, 0x050f0701, 0x050f0907,
    0x050f0b01, 0x07010105, 0x07010303, 0x07010307, 0x0701030b, 0x0701030f, 0x07010505, 0x07010703,
    0x07010707, 0x0701070b, 0x07010905, 0x07010909, 0x0701090f, 0x07010b03, 0x07010d07, 0x07010f03,
    0x07030103, 0x07030107, 0x0703010b, 0x07030309, 0x07030503, 0x07030507, 0x07030901, 0x07030d01,
    0x07030f05, 0x07030f0d, 0x07050101, 0x07050305, 0x07050501, 0x07050705, 0x07050709, 0x07050b01,
    0x07070103, 0x07070301, 0x07070309, 0x07070503, 0x07070507, 0x0707050f, 0x07070701, 0x07070903,
    0x07070907, 0x0707090f, 0x07070b0b, 0x07070f07, 0x07090107, 0x07090303, 0x0709030d, 0x07090505,
    0x07090703, 0x07090b05, 0x07090d01, 0x07090d09, 0x070b0103, 0x070b0301, 0x070b0305, 0x070b050b,
    0x070b0705, 0x070b0909, 0x070b0b0d, 0x070b0f07, 0x070d030d, 0x070d0903, 0x070f0103, 0x070f0107,
    0x070f0501, 0x070f0505, 0x070f070b, 0x09010101, 0x09010109, 0x09010305, 0x09010501, 0x09010509,
    0x0901050f, 0x09010705, 0x09010903, 0x09010b01, 0x09010f01, 0x09030105, 0x0903010f, 0x09030303,
    0x09030307, 0x09030505, 0x09030701, 0x0903070b, 0x09030907, 0x09030b03, 0x09030b0b, 0x09050103,
    0x09050107, 0x09050301, 0x0905030b, 0x09050503, 0x09050707, 0x09050901, 0x09050b0f, 0x09050d05,
    0x09050f01, 0x09070109, 0x09070303, 0x09070307, 0x09070501, 0x09070505, 0x09070703, 0x0907070b,
    0x09090101, 0x09090105, 0x09090509, 0x0909070f, 0x09090901, 0x09090f03, 0x090b010b, 0x090b010f,
    0x090b0503, 0x090b0d05, 0x090d0307, 0x090d0709, 0x090d0d01, 0x090f0301, 0x090f030b, 0x090f0701,
    0x090f0907, 0x090f0b03, 0x0b010105, 0x0b010301, 0x0b010309, 0x0b010505, 0x0b010901, 0x0b010909,
    0x0b01090f, 0x0b010b05, 0x0b010d0d, 0x0b010f09, 0x0b030103, 0x0b030107, 0x0b03010b, 0x0b030305,
    0x0b030503, 0x0b030705, 0x0b030f05, 0x0b050101, 0x0b050303, 0x0b050507, 0x0b050701, 0x0b05070d,
    0x0b050b07, 0x0b070105, 0x0b07010f, 0x0b070301, 0x0b07050f, 0x0b070909, 0x0b070b03, 0x0b070d0b,
    0x0b070f07, 0x0b090103, 0x0b090109, 0x0b090501, 0x0b090705, 0x0b09090d, 0x0b0b0305, 0x0b0b050d,
    0x0b0b0b03, 0x0b0b0b07, 0x0b0d0905, 0x0b0f0105, 0x0b0f0109, 0x0b0f0505, 0x0d010303, 0x0d010307,
    0x0d01030b, 0x0d010703, 0x0d010707, 0x0d010d01, 0x0d030101, 0x0d030501, 0x0d03050f, 0x0d030d09,
    0x0d050305, 0x0d050709, 0x0d050905, 0x0d050b0b, 0x0d050d05, 0x0d050f01, 0x0d070101, 0x0d070309,
    0x0d070503, 0x0d070901, 0x0d09050b, 0x0d090907, 0x0d090d05, 0x0d0b0101, 0x0d0b0107, 0x0d0b0709,
    0x0d0b0d01, 0x0d0d010b, 0x0d0d0901, 0x0d0f0303, 0x0d0f0307, 0x0f010101, 0x0f010109, 0x0f01010f,
    0x0f010501, 0x0f010505, 0x0f01070d, 0x0f010901, 0x0f010b09, 0x0f010d05, 0x0f030105, 0x0f030303,
    0x0f030509, 0x0f030907, 0x0f03090b, 0x0f050103, 0x0f050109, 0x0f050301, 0x0f05030d, 0x0f050503,
    0x0f050701, 0x0f050b03, 0x0f070105, 0x0f070705, 0x0f07070b, 0x0f070b07, 0x0f090103, 0x0f09010b,
    0x0f090307, 0x0f090501, 0x0f090b01, 0x0f0b0505, 0x0f0b0905, 0x0f0d0105, 0x0f0d0703, 0x0f0f0101,
)
assert len(IQ3S_GRID) == 512


def iq3s_grid_values() -> torch.Tensor:
    """int32 [512, 4]: the magnitudes of each grid point, in weight order."""
    w = torch.tensor(IQ3S_GRID, dtype=torch.int64)
    return ((w[:, None] >> torch.arange(0, 32, 8)) & 0xFF).to(torch.int32)


# ggml name -> (gguf-py class name, points, weights per point)
GRIDS = {"IQ2_XXS": ("IQ2_XXS", 256, 8), "IQ2_XS": ("IQ2_XS", 512, 8), "IQ2_S": ("IQ2_S", 1024, 8),
         "IQ3_XXS": ("IQ3_XXS", 256, 4), "IQ1_S": ("IQ1_S", 2048, 8), "IQ1_M": ("IQ1_S", 2048, 8)}

KSIGNS_IQ2XS = tuple(i | ((bin(i).count("1") & 1) << 7) for i in range(128))


@functools.lru_cache(maxsize=None)
def grid_values(name: str) -> torch.Tensor:
    """int32 [points, weights per point]: the grid of i-quant `name` (IQ1 grids hold -1, 0, 1;
    IQ2 grids 8, 25, 43; IQ3_XXS 4..62), from gguf-py's packed copy."""
    from gguf import quants
    cls_name, points, width = GRIDS[name]
    cls = getattr(quants, cls_name)
    cls.init_grid()
    g = torch.from_numpy(cls.grid.reshape(points, width).copy())
    assert torch.equal(g, g.round()), name   # small integers, exact in fp32
    return g.to(torch.int32)


def _iq_parts() -> list[tuple[str, torch.Tensor]]:
    """The parts of the one i-quant table a Triton decoder reads, in order: IQ3_S's packed words
    first (so a table of IQ3_S alone is a prefix of it), then one int32 per grid weight."""
    parts = [("IQ3_S", torch.tensor(IQ3S_GRID, dtype=torch.int32))]
    return parts + [(g, grid_values(g).reshape(-1)) for g in GRIDS if g != "IQ1_M"]


IQ_TABLE_SIZES = {"IQ3_S": 512, **{g: p * w for g, (_, p, w) in GRIDS.items() if g != "IQ1_M"}}


def iq_table_offset(name: str) -> int:
    """Where format `name`'s grid starts in device_table("iq") (IQ1_M reads IQ1_S's)."""
    name = "IQ1_S" if name == "IQ1_M" else name
    off = 0
    for part in IQ_TABLE_SIZES:
        if part == name:
            return off
        off += IQ_TABLE_SIZES[part]
    raise KeyError(name)


_TABLES = {
    "iq4nl": lambda: torch.tensor(KVALUES_IQ4NL, dtype=torch.int32),
    "mxfp4": lambda: torch.tensor(KVALUES_MXFP4, dtype=torch.int32),
    # packed words as int32 (values < 2**31: every byte <= 15)
    "iq3s": lambda: torch.tensor(IQ3S_GRID, dtype=torch.int32),
    "ksigns": lambda: torch.tensor(KSIGNS_IQ2XS, dtype=torch.int32),
    # every i-quant grid in one table (Triton takes one table pointer whatever the mix of formats
    # in a GEMM): IQ3_S's words, then each grid point-major [points * width], at iq_table_offset
    "iq": lambda: torch.cat([t for _, t in _iq_parts()]),
}


@functools.lru_cache(maxsize=None)
def _device_table(name: str, device: str) -> torch.Tensor:
    return _TABLES[name]().to(device)


def device_table(name: str, device) -> torch.Tensor:
    """The int32 table `name` ('iq4nl', 'mxfp4', 'iq3s', 'ksigns', 'iq') on `device`, made once
    per device."""
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:  # "cuda" means the current device: name it
        dev = torch.device("cuda", torch.cuda.current_device())
    return _device_table(name, str(dev))
