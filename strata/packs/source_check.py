"""Hold a pack to the source it says it came from (`strata verify PACK --source SRC`): SRC's
metadata digest must equal the pack's record (strata.packs.provenance) and the shape strata's
reader derives from SRC must equal the pack's."""
from __future__ import annotations

import json
from pathlib import Path

from strata.errors import StrataError
from strata.gguf_file import open_gguf
from strata.packs.from_gguf import gguf_shape
from strata.packs.from_hf import hf_folder_shape
from strata.packs.provenance import check_record, gguf_record, hf_record


def source_record(src) -> dict:
    """The record of a source path: a GGUF file or a HF folder (its config.json)."""
    src = Path(src)
    if not src.exists():
        raise StrataError(f"--source {src}: no such file or folder; give the GGUF file or HF "
                          f"folder the pack was made from")
    if src.is_dir():
        return hf_record(_config(src))
    return gguf_record(open_gguf(src))


def _config(folder: Path) -> dict:
    p = folder / "config.json"
    try:
        cfg = json.loads(p.read_text())
    except (OSError, ValueError, UnicodeDecodeError) as e:
        raise StrataError(f"{p} cannot be read as JSON ({e}); give the folder the pack was "
                          f"made from") from None
    if not isinstance(cfg, dict):
        raise StrataError(f"{p} holds no JSON object; give the folder the pack was made from")
    return cfg


def check_source(pack, src) -> dict:
    """Hold the pack to the source it says it came from (see the module doc); returns the
    record. One line naming what differs, else nothing."""
    rec = check_record(pack)
    if rec is None:
        raise StrataError(f"{pack.path} records no source metadata (made by synth or an older "
                          f"strata): nothing to check {src} against; re-create it with strata pack")
    got = source_record(src)
    if got["kind"] != rec["kind"]:
        raise StrataError(f"{pack.path} was made from a {rec['kind']} source, {src} is "
                          f"{got['kind']}")
    if got["sha256"] != rec["sha256"]:
        a, b = rec["hparams"], got["hparams"]
        diff = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
        what = (f"{diff[0]} is {b.get(diff[0])!r} there, {a.get(diff[0])!r} when packed"
                if diff else "an array key (the tokenizer's, say) differs")
        raise StrataError(f"{src}'s metadata is not the one {pack.path} was made from: {what}; "
                          f"re-pack it from this file")
    want = _shape_of(src)
    have = pack.shape.to_dict()
    diff = [k for k in sorted(set(want) | set(have)) if want.get(k) != have.get(k)]
    if diff:
        k = diff[0]
        raise StrataError(f"{pack.path}'s shape says {k} = {have.get(k)!r} but {src}'s "
                          f"hyperparameters give {want.get(k)!r}; re-pack it with this strata")
    return rec


def _shape_of(src: Path) -> dict:
    """The shape strata's reader derives from a source (the same call `strata pack` makes)."""
    src = Path(src)
    if src.is_dir():
        return hf_folder_shape(src).to_dict()
    return gguf_shape(open_gguf(src), src).to_dict()
