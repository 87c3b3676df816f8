import pytest

from strata.blob import BlobLayout
from strata.errors import StrataError
from strata.formats import get_format
from strata.shapes import get_preset
from strata.units import parse_size


@pytest.mark.parametrize("text,n", [("12GiB", 12 << 30), ("800MiB", 800 << 20), ("4096", 4096),
                                    ("1.5GB", 1_500_000_000)])
def test_parse_size(text, n):
    assert parse_size(text) == n


@pytest.mark.parametrize("bad", ["12 parsecs", "", "GiB", "-3"])
def test_parse_size_rejects(bad):
    with pytest.raises(StrataError, match="cannot read size"):
        parse_size(bad)


def test_seed_blob_sizes_match_spec():
    # SPEC reference table: Q2_0 max_blob 1,382,400 and Q8_0 5,222,400 on the seed shape.
    s = get_preset("seed-512e")
    assert BlobLayout.make(s.d_model, s.d_expert, "Q2_0").size == 1_382_400
    assert BlobLayout.make(s.d_model, s.d_expert, "Q8_0").size == 5_222_400


def test_format_errors_are_clear():
    with pytest.raises(StrataError, match="unknown block format"):
        get_format("Q9_9")
    with pytest.raises(StrataError, match="multiple of 256"):
        get_format("Q4_K").row_bytes(100)
