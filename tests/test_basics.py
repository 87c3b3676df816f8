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


def test_gpt_oss_options_live_in_the_shape_and_keep_the_header_keys():
    """GPT-OSS's options are one dataclass inside the shape; the dict (a pack's header) keeps
    the flat keys packs have always carried, so packs written before read alike."""
    from strata.shapes import PRESETS, GptOssOptions, ModelShape
    s = PRESETS["gpt-oss-20b"]
    assert s.opts == GptOssOptions() and s.expert_bias
    d = s.to_dict()
    assert "opts" not in d
    assert {k: d[k] for k in ("expert_bias", "expert_act", "swiglu_alpha", "swiglu_limit")} == \
        {"expert_bias": True, "expert_act": "swiglu_oai", "swiglu_alpha": 1.702,
         "swiglu_limit": 7.0}
    assert list(d).index("expert_bias") == list(d).index("max_pos") + 1   # the old order
    assert ModelShape.from_dict(d) == s
    q = PRESETS["qwen3-30b-a3b"]
    assert q.opts is None and not q.expert_bias and ModelShape.from_dict(q.to_dict()) == q
    assert q.to_dict()["expert_act"] == "silu"
    limited = s.with_(**{"opts.swiglu_limit": 2.0})
    assert limited.opts.swiglu_limit == 2.0 and limited.field("opts.swiglu_limit") == 2.0
    assert ModelShape.from_dict(limited.to_dict()) == limited
