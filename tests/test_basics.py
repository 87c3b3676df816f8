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


# DeepSeek-V3's header as packs have always written it (flat keys, in their order)
OLD_DEEPSEEK_V3_HEADER = {
    "arch": "deepseek2", "n_layer": 61, "d_model": 7168, "n_expert": 256, "top_k": 8,
    "d_expert": 2048, "n_head": 128, "n_kv_head": 128, "head_dim": 192, "vocab": 129280,
    "rope_theta": 10000.0, "rms_eps": 1e-06, "norm_topk_prob": True, "max_pos": 163840,
    "expert_bias": False, "expert_act": "silu", "swiglu_alpha": 1.702, "swiglu_limit": 7.0,
    "sliding_window": 0, "sliding_pattern": 2, "rope_scaling": "yarn", "rope_factor": 40.0,
    "rope_orig_ctx": 4096, "yarn_beta_fast": 32.0, "yarn_beta_slow": 1.0, "yarn_truncate": True,
    "yarn_attn": 1.0, "yarn_kq": 1.8738542070926265, "n_dense_lead": 3, "d_ff": 18432,
    "n_shared": 1, "router": "sigmoid", "n_group": 8, "topk_group": 4, "routed_scale": 2.5,
    "qk_norm": True, "attn_bias": False, "rope_dim": 0, "q_lora": 1536, "kv_lora": 512,
    "qk_rope": 64, "v_head_dim": 128}


def test_gpt_oss_options_live_in_the_shape_and_keep_the_header_keys():
    """The architectures' options are small dataclasses inside the shape (GPT-OSS's own, the
    window, YaRN, MLA, the dense FFNs, the router, the attention's details); the dict (a pack's
    header) keeps the flat keys packs have always carried, so packs written before read alike,
    and nested names ("opts.x", "window.size") change and read a group's field."""
    from strata.shapes import PRESETS, GptOssOptions, Mla, ModelShape, Window, Yarn
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
    assert (s.window, s.yarn) == (Window(128, 2), Yarn(32.0, 4096, truncate=False))
    assert (d["sliding_window"], d["rope_scaling"], d["rope_factor"]) == (128, "yarn", 32.0)
    ds = PRESETS["deepseek-v3"]
    assert ds.to_dict() == OLD_DEEPSEEK_V3_HEADER
    assert list(ds.to_dict()) == list(OLD_DEEPSEEK_V3_HEADER)
    assert ModelShape.from_dict(OLD_DEEPSEEK_V3_HEADER) == ds
    assert ds.mla == Mla(1536, 512, 64, 128) and ds.window is None and q.mla is None
    # a header from before the YaRN and GPT-OSS keys: those read as plain RoPE and silu experts
    older = {k: v for k, v in OLD_DEEPSEEK_V3_HEADER.items() if not k.startswith(
        ("rope_scaling", "rope_factor", "rope_orig", "yarn_", "expert_", "swiglu_"))}
    assert ModelShape.from_dict(older) == ds.with_(yarn=None)
    wider = ds.with_(**{"mla.kv_lora": 256, "router.scale": 1.0})
    assert (wider.field("mla.kv_lora"), wider.router.scale, wider.mla.q_lora) == (256, 1.0, 1536)
    assert q.field("window.size") == 0 and q.field("yarn.factor") == 1.0   # as its header
    with pytest.raises(StrataError, match="no window options to change"):
        q.with_(**{"window.size": 4})
