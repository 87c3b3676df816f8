"""The one registry of architectures: each record keyed once by its strata, HF and GGUF names;
every part that differs by architecture is read from it."""
import pytest

from strata.packs.hparams import GGUF, HF
from strata.archs.registry import ARCHS, BY_GGUF, BY_HF, by_gguf, by_hf, get_arch
from strata.errors import StrataError
from strata.shapes import PRESETS


def test_each_name_names_one_record():
    for key in ("name", "hf_types", "gguf_archs"):
        names = [n for a in ARCHS for n in ((getattr(a, key),) if key == "name"
                                            else getattr(a, key))]
        assert len(names) == len(set(names)), key
    for a in ARCHS:
        assert get_arch(a.name) is a
        assert all(by_hf(t, "cfg") is a for t in a.hf_types)
        assert all(by_gguf(g, "f.gguf") is a for g in a.gguf_archs)


def test_the_records_hold_the_hparam_tables_and_presets():
    assert set(BY_GGUF) == set(GGUF) and set(BY_HF) == set(HF)
    for g, a in BY_GGUF.items():
        assert a.gguf_hparams is GGUF[g]
    for t, a in BY_HF.items():
        assert a.hf_table(t) is HF[t]
    assert sorted(n for a in ARCHS for n in a.presets) == sorted(PRESETS)
    for a in ARCHS:   # its presets set only the option groups it declares
        assert all(a.own_options(s) for s in a.presets.values()), a.name
        assert all(any(type(g) is t for s in a.presets.values() for g in s.option_groups())
                   for t in a.options), a.name


def test_unknown_names_are_one_line_listing_the_supported():
    with pytest.raises(StrataError, match="strata runs deepseek2, glm4moe, gpt-oss, minimax-m2, "
                                          "mixtral, qwen35moe, qwen3moe, qwen3next$"):
        get_arch("llama")
    with pytest.raises(StrataError, match=r"cfg: model_type 'bert'; strata packs deepseek_v3, "
                                          r"glm4_moe, gpt_oss, kimi_k2, minimax_m2, mixtral, "
                                          r"qwen3_5_moe, qwen3_5_moe_text, qwen3_moe, qwen3_next"):
        by_hf("bert", "cfg")
    with pytest.raises(StrataError, match=r"f.gguf is a 'phi3' model; strata packs GGUF files "
                                          r"of deepseek2, glm4moe, gpt-oss, llama, minimax-m2, "
                                          r"qwen35moe, qwen3moe, qwen3next"):
        by_gguf("phi3", "f.gguf")
    with pytest.raises(StrataError, match="model_type None"):
        by_hf(None, "cfg")


def test_the_dense_specs_are_the_records():
    from strata.archs.names import dense_specs, layer_specs
    for name, s in PRESETS.items():
        a = get_arch(s.arch)
        assert layer_specs(s, s.n_layer - 1) == a.layer_specs(s, s.n_layer - 1), name
        assert dense_specs(s) == a.dense_specs(s), name


@pytest.mark.parametrize("arch", ARCHS, ids=lambda a: a.name)
def test_a_config_without_its_fields_is_one_line_naming_the_file(arch):
    with pytest.raises(StrataError, match=r"^/m/config\.json: config\.json lacks \S+$"):
        arch.hf_shape({}, "/m/config.json")


def test_a_field_of_the_wrong_type_is_one_line_naming_the_file():
    from strata.archs.hf_config import config_fields
    with pytest.raises(StrataError, match=r"^x: config\.json has a value of the wrong type "
                                          r"\(invalid literal"):
        with config_fields("x"):
            int("seven")
    with pytest.raises(StrataError, match="x: config.json lacks hidden_size"):
        with config_fields("x"):
            {}["hidden_size"]
    with config_fields("x"):       # nothing raised: nothing said
        pass
