"""`strata verify PACK --source SRC` covers the hyperparameters (strata.packs.provenance): a pack
records its source's metadata digest; the source it was made from passes, a source with one key
changed is refused naming the key, and a pack whose shape disagrees with what its source's
hyperparameters give (its header re-signed, so the checksums alone pass) is refused naming the
shape field."""
from __future__ import annotations

import json

import pytest

from strata.cli import main
from strata.packs import Pack
from tests.models.hf_tiny import TINY, hf_state, make_hf_model
from tests.models.hf_gguf import write_gguf
from tests.packs.test_pack_file import _rewrite_meta


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """(GGUF, its pack, HF folder, its pack) of one tiny Qwen3-MoE."""
    d = tmp_path_factory.mktemp("prov")
    hf = make_hf_model(TINY, seed=0)
    hf.save_pretrained(d / "hf")
    g = write_gguf(hf_state(hf), TINY, d / "m.gguf")
    assert main(["pack", str(g), "-o", str(d / "g.pack")]) == 0
    assert main(["pack", str(d / "hf"), "-o", str(d / "h.pack")]) == 0
    return g, d / "g.pack", d / "hf", d / "h.pack"


def one_line(capsys) -> str:
    cap = capsys.readouterr()
    err = cap.err.replace("\r", "\n")     # progress bars redraw with carriage returns
    lines = [ln for ln in err.splitlines() if ln.strip() and "%|" not in ln]
    assert len(lines) == 1 and "Traceback" not in cap.err, cap.err
    return lines[-1]


def test_the_record_is_in_the_pack(sources):
    for pack, kind in ((sources[1], "gguf"), (sources[3], "hf")):
        rec = Pack.open(pack).meta["source_meta"]
        assert rec["kind"] == kind and len(rec["sha256"]) == 64 and rec["keys"] > 5


def test_the_source_it_came_from_passes(sources, capsys):
    g, gp, h, hp = sources
    for pack, src in ((gp, g), (hp, h)):
        assert main(["verify", str(pack), "--source", str(src), "--json"]) == 0
        rep = json.loads(capsys.readouterr().out)
        assert rep["source_meta"]["checked_against"] == str(src)


def test_a_changed_gguf_key_is_named(sources, tmp_path, capsys):
    _, gp, _, _ = sources
    other = write_gguf(hf_state(make_hf_model(TINY, seed=0)), TINY.with_(top_k=3),
                       tmp_path / "o.gguf")
    assert main(["verify", str(gp), "--source", str(other)]) == 2
    line = one_line(capsys)
    assert "qwen3moe.expert_used_count" in line and "3" in line


def test_a_changed_config_field_is_named(sources, tmp_path, capsys):
    import shutil
    _, _, h, hp = sources
    other = tmp_path / "hf"
    shutil.copytree(h, other)
    cfg = json.loads((other / "config.json").read_text())
    cfg["rms_norm_eps"] = 1e-5
    (other / "config.json").write_text(json.dumps(cfg))
    assert main(["verify", str(hp), "--source", str(other)]) == 2
    assert "rms_norm_eps" in one_line(capsys)


def test_a_shape_its_source_does_not_give_is_named(sources, tmp_path, capsys):
    """The header re-signed after the edit: the checksums pass, the hyperparameters do not."""
    import shutil
    g, gp, _, _ = sources
    pack = tmp_path / "p.pack"
    shutil.copy(gp, pack)
    _rewrite_meta(pack, lambda h, m: m["shape"].__setitem__("rope_theta", 10.0))
    assert main(["verify", str(pack)]) == 0       # its own checksums hold
    capsys.readouterr()
    assert main(["verify", str(pack), "--source", str(g)]) == 2
    assert "rope_theta" in one_line(capsys)


def test_a_pack_without_a_record(tmp_path, capsys):
    pack = tmp_path / "s.pack"
    assert main(["synth", "--preset", "tiny", "--pack", "-o", str(pack)]) == 0
    capsys.readouterr()
    assert main(["verify", str(pack)]) == 0
    assert "no source metadata recorded" in capsys.readouterr().out
    assert main(["verify", str(pack), "--source", str(pack)]) == 2
    assert "records no source metadata" in one_line(capsys)
