"""The lookup tables strata holds once equal gguf-py's (and ggml's, for the entries pinned)."""
import numpy as np
import torch
from gguf.quants import IQ3_S, IQ4_NL, MXFP4

from strata.formats.tables import IQ3S_GRID, KVALUES_IQ4NL, KVALUES_MXFP4, iq3s_grid_values


def test_iq3s_grid_equals_gguf_py():
    IQ3_S.init_grid()
    want = IQ3_S.grid.reshape(512, 4).astype(np.int32)
    assert np.array_equal(iq3s_grid_values().numpy(), want)


def test_iq3s_grid_pins_ggml_words():
    # first and last words of ggml-common.h's iq3s_grid, as ggml writes them
    assert IQ3S_GRID[:4] == (0x01010101, 0x01010103, 0x01010105, 0x0101010b)
    assert IQ3S_GRID[-1] == 0x0f0f0101
    assert len(set(IQ3S_GRID)) == 512


def test_level_tables_equal_gguf_py():
    assert KVALUES_IQ4NL == IQ4_NL.kvalues
    assert KVALUES_MXFP4 == MXFP4.kvalues


def test_ksigns_equal_gguf_py():
    from gguf.quants import IQ2_XXS
    from strata.formats.tables import KSIGNS_IQ2XS
    assert bytes(KSIGNS_IQ2XS) == IQ2_XXS.ksigns


def test_grids_pin_ggml_words():
    # first words of ggml-common.h's iq2xxs/iq2xs/iq2s/iq1s grids and iq3xxs_grid (bytes of a
    # word are its weights, lowest first): gguf-py's packed copies decode to ggml's values
    from strata.formats.tables import GRIDS, grid_values
    assert grid_values("IQ2_XXS")[0].tolist() == [8] * 8                    # 0x0808080808080808
    assert grid_values("IQ2_XXS")[1].tolist() == [43] + [8] * 7             # 0x080808080808082b
    assert grid_values("IQ2_XS")[511].tolist() == [43] * 8                  # 0x2b2b2b2b2b2b2b2b
    assert grid_values("IQ2_S")[1023].tolist() == [43] * 8
    assert grid_values("IQ3_XXS")[0].tolist() == [4] * 4                    # 0x04040404
    assert grid_values("IQ1_S")[0].tolist() == [-1] * 8                     # 0xffffffffffffffff
    for name, (_, points, width) in GRIDS.items():
        g = grid_values(name)
        assert g.shape == (points, width) and len(torch.unique(g, dim=0)) == points, name


def test_table_sizes_equal_gguf_py():
    import gguf
    from strata.formats import FORMATS
    for f in FORMATS.values():
        t = gguf.GGMLQuantizationType[f.name] if f.name in gguf.GGMLQuantizationType.__members__ \
            else None
        if t is None:                                   # Q2_0: newer than gguf-py 0.19
            continue
        assert int(t) == f.ggml_type and gguf.GGML_QUANT_SIZES[t] == (f.block, f.block_bytes), f.name


def test_iq_table_parts_at_their_offsets():
    from strata.formats.tables import GRIDS, IQ3S_GRID, _TABLES, grid_values, iq_table_offset
    t = _TABLES["iq"]()
    assert t[:512].tolist() == list(IQ3S_GRID)                  # IQ3_S alone is a prefix
    for name, (_, points, width) in GRIDS.items():
        off = iq_table_offset(name)
        assert torch.equal(t[off:off + points * width], grid_values(name).reshape(-1)), name
    assert len(t) == iq_table_offset("IQ1_S") + 2048 * 8
