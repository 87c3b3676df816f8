"""Where a pack's hyperparameters came from: the source's metadata, digested when it is packed.

A pack made by `strata pack` records (in its header metadata, under "source_meta", covered by the
header checksum like every other entry):

    kind      "gguf" | "hf"
    sha256    of the source's whole metadata: every GGUF key-value pair (tokenizer arrays too) in
              key order, or config.json parsed and re-serialized with sorted keys
    keys      how many keys that digest covers
    hparams   the scalar key-values (GGUF: every non-array key; HF: config.json) - small

`strata verify PACK --source SRC` re-reads SRC: its digest must equal the record (else the first
key whose value differs is named), and the shape SRC's reader derives must equal the pack's (a
pack whose shape was edited, or made by another strata that read a key differently, fails with
the field named). Without --source, verify checks that the record is whole and says which file
it came from. Packs written without a record (synth, memory packs, older strata) say so.
Holding a pack to its source (which needs the readers) is strata.packs.source_check's.
"""
from __future__ import annotations

import hashlib
import json

from strata.errors import StrataError

KEY = "source_meta"


def _plain(v):
    """A GGUF field's contents as JSON-able data (bytes as hex, numpy scalars as Python)."""
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, (bytes, bytearray)):
        return v.hex()
    if hasattr(v, "item"):
        return v.item()
    return v


def _digest(items: dict) -> str:
    return hashlib.sha256(json.dumps(items, sort_keys=True, default=str).encode()).hexdigest()


def gguf_record(reader) -> dict:
    """The record of a GGUF's metadata (a gguf.GGUFReader)."""
    items = {name: _plain(f.contents()) for name, f in reader.fields.items()}
    scalars = {k: v for k, v in items.items() if not isinstance(v, list)}
    return {"kind": "gguf", "sha256": _digest(items), "keys": len(items), "hparams": scalars}


def hf_record(cfg: dict) -> dict:
    """The record of a HF folder's config.json (parsed)."""
    return {"kind": "hf", "sha256": _digest(cfg), "keys": len(cfg), "hparams": cfg}


def check_record(pack) -> dict | None:
    """The pack's record (None when it has none), after checking it is whole: the fields there,
    of the right types (a record edited into nonsense is refused in one line)."""
    rec = pack.meta.get(KEY)
    if rec is None:
        return None
    ok = (isinstance(rec, dict) and rec.get("kind") in ("gguf", "hf")
          and isinstance(rec.get("sha256"), str) and len(rec["sha256"]) == 64
          and isinstance(rec.get("hparams"), dict) and isinstance(rec.get("keys"), int))
    if not ok:
        raise StrataError(f"{pack.path}: its source metadata record is malformed; re-create the "
                          f"pack with strata pack")
    return rec
