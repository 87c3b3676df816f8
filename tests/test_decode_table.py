"""The decoders' capabilities are stated once, in the format table; the decode package's name
tuples and its dispatch follow them (the bit-exact tests iterate those tuples, so a row that
claims a capability its decoder lacks fails there)."""
from strata.formats.table import FORMATS
from strata.kernels import decode


def test_name_tuples_are_read_from_the_table():
    assert decode.TRITON_FORMATS == tuple(n for n, f in FORMATS.items() if f.triton)
    assert decode.SCALED_CODE_FORMATS == tuple(n for n, f in FORMATS.items() if f.scaled_code)
    assert decode.FAST_CODE_FORMATS == tuple(n for n, f in FORMATS.items() if f.code_words)


def test_capabilities_are_consistent():
    for name, f in FORMATS.items():
        if f.scaled_code or f.code_words or f.tile_run:
            assert f.triton, f"{name}: a capability without a Triton decoder"
        if f.code_words:
            assert f.scaled_code and f.block == 32, name   # the word paths' 32-weight runs
        if f.scaled_code:
            assert decode.code_run(name) == f.block
        if f.triton and f.block > 1:
            # decode_tile_runs broadcasts one scale over tile_run weights: a whole sub-block
            assert f.tile_run > 0 and f.block % f.tile_run == 0, name
        if f.block == 1:
            assert f.tile_run == 0, f"{name}: plain formats have no scales"
