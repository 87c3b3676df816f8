"""The lookup tables strata holds once equal gguf-py's (and ggml's, for the entries pinned)."""
import numpy as np
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
