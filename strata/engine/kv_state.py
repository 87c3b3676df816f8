"""A prompt's KV on disk: saved after a read, restored before the next one so only new tokens
are read (`strata prefill --save-kv`, `--resume`, `--reuse`; `strata generate`).

The file is safetensors: per layer l and part (strata.engine.kv_stores: k, v / c, k_pe, and the
int8 scales) a tensor `kv.<l>.<part>` token-major over the positions the layer holds; per
linear-attention layer (a hybrid's: ModelShape.layer_kind "linear", which keeps a recurrent
state instead of KV) `state.<l>.conv` [K-1, C] and `state.<l>.S` [Hv, dk, dv] as they stand
after the prompt's last token; `logits` (fp32 [V], the last position's, so an identical prompt
needs no read at all); and a manifest in its metadata (`strata.kv`, JSON):

    format, strata     the file format (FORMAT) and the strata version that wrote it
    pack               crc (the pack header's checksum), arch, source: the identity checked
    tokenizer          source and crc32 of the pack's tokenizer (None without one)
    kv                 kind gqa | mla, heads, key_dim, value_dim, dtype, parts, windows
    tokens, n_tokens   the prompt's token ids
    starts             per layer the first position held (0; a sliding layer P - (W - 1); a
                       linear layer P: it holds none)
    linear             None, or {layers, conv: {dtype, shape}, S: {dtype, shape}}: the linear
                       layers and their state's dtypes (conv the activations', S fp32)

Shared prefix (--reuse) on a hybrid: a recurrent state cannot be cut back to an earlier
position, so it is reused only when the saved prompt is a whole prefix of the new one (or the
new one itself, whose logits the state holds); any other prompt is read whole (prefix: 0).

    info = save_state(path, cache, pack=, tokens=, logits=)     # atomic, host tensors as they are
    state = KVState.open(path, pack=pack, kv=dtype)    # refuses another pack/tokenizer/dtype
    n = state.prefix(tokens)        # positions to reuse for a prompt given whole
    state.restore(cache, n)         # into the engine's store, counted by the plan

The writer streams: a host-held PromptKV part is written from its pinned host tensor, a
resident part copied to the host one layer part at a time (never the whole KV at once).
"""
from __future__ import annotations

import json
import os
import struct
import time
import zlib
from dataclasses import dataclass, field

import torch

from strata import __version__, filekind
from strata.atomic import atomic_write
from strata.engine.kv_stores import (layer_pieces, restore, restore_states, reusable,
                                     state_layout, state_pieces, store_layout)
from strata.errors import StrataError

FORMAT = "strata-kv/1"
META_KEY = "strata.kv"
ST_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.int8: "I8",
             torch.float16: "F16"}


def pack_identity(pack) -> dict:
    """{crc, arch, source}: the pack header's own checksum (a pack built in memory: its shape's)."""
    header = getattr(pack, "_header", None)
    crc = None
    if header is not None:
        from strata.packs.file import HEADER_CRC_KEY
        crc = header.get("__metadata__", {}).get(HEADER_CRC_KEY)
    if crc is None:
        crc = f"{zlib.crc32(json.dumps(pack.shape.to_dict(), sort_keys=True).encode()):08x}"
    return {"crc": crc, "arch": pack.shape.arch, "source": str(getattr(pack, "source", ""))}


def tokenizer_identity(pack) -> dict | None:
    entry = getattr(pack, "tokenizer", None)
    if not entry:
        return None
    blob = (entry.get("json", "") + f"|bos={entry.get('add_bos')}").encode()
    return {"source": entry.get("source", ""), "crc": f"{zlib.crc32(blob):08x}"}


@dataclass
class SaveInfo:
    path: str
    nbytes: int          # bytes of the file
    seconds: float       # the write, from the call to the rename
    host_bytes: int      # bytes written straight from host-held KV
    n_tokens: int


def save_state(path, cache, *, pack, tokens, logits: torch.Tensor | None) -> SaveInfo:
    """Write `cache`'s KV (every position it read) with its manifest to `path`, whole or not at
    all. `tokens`: the ids those positions hold; `logits`: the last position's (fp32 [V])."""
    t0 = time.perf_counter()
    shape = pack.shape
    lay = store_layout(cache, shape)
    P = cache.length
    if len(tokens) != P:
        raise StrataError(f"the KV holds {P} positions but {len(tokens)} tokens were given")
    entries, starts = [], []
    layers = getattr(cache, "mine", range(shape.n_layer))
    for l in range(shape.n_layer):
        if l not in layers:
            raise StrataError("a pipeline stage keeps only its own layers' KV; save it from "
                              "the single-process engine")
        start, pieces = layer_pieces(cache, l)
        starts.append(start)
        for name, parts in zip(lay["parts"], pieces):
            entries.append((f"kv.{l}.{name}", parts))
    entries += [(name, [t]) for name, t in state_pieces(cache)]
    if logits is not None:
        entries.append(("logits", [logits.reshape(-1).float()]))
    manifest = {"format": FORMAT, "strata": __version__, "pack": pack_identity(pack),
                "tokenizer": tokenizer_identity(pack), "kv": lay,
                "tokens": [int(t) for t in tokens], "n_tokens": P, "starts": starts,
                "linear": state_layout(cache)}
    header, at = {}, 0
    for name, parts in entries:
        rows = sum(p.shape[0] for p in parts)
        p0 = parts[0]
        nb = rows * _row_numel(p0) * p0.element_size()
        header[name] = {"dtype": ST_DTYPES[p0.dtype], "shape": [rows, *p0.shape[1:]],
                        "data_offsets": [at, at + nb]}
        at += nb
    header["__metadata__"] = {META_KEY: json.dumps(manifest)}
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    host = 0
    with atomic_write(path) as tmp, open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for _, parts in entries:
            for p in parts:
                if p.numel() == 0:
                    continue
                if p.device.type == "cpu":
                    host += p.numel() * p.element_size()
                f.write(_host_bytes(p))
    nbytes = 8 + len(raw) + at
    return SaveInfo(str(path), nbytes, time.perf_counter() - t0, host, P)


def _host_bytes(t: torch.Tensor):
    """A tensor's bytes as a buffer on the host (a host tensor's own memory when contiguous;
    a device one's copied once)."""
    t = t.detach().to("cpu").contiguous()
    return t.reshape(-1).view(torch.uint8).numpy().data


def _row_numel(t: torch.Tensor) -> int:
    n = 1
    for d in t.shape[1:]:
        n *= d
    return n


@dataclass
class KVState:
    """A saved state, opened lazily (the tensors are read when restored)."""
    path: str
    manifest: dict
    _file: object = field(repr=False, default=None)
    flag: str = "--resume"      # the flag that named it, for messages
    _map: tuple | None = field(repr=False, default=None)   # (file bytes, data start, header)

    @classmethod
    def open(cls, path, *, pack=None, kv: str | None = None, flag: str = "--resume"
             ) -> "KVState":
        """Open `path` and refuse, in one line, a state that is not one, or one saved from
        another pack, tokenizer or KV dtype (`kv`: this run's resolved dtype)."""
        from safetensors import safe_open
        where = f"{flag} {path}"
        k = filekind.kind(path)
        if k == filekind.MISSING:
            raise StrataError(f"{where}: no such file")
        if k != filekind.SAFETENSORS:
            raise StrataError(f"{where} is {filekind.NAMES[k]}, not a saved KV state (strata "
                              f"prefill --save-kv writes one)")
        try:
            f = safe_open(str(path), framework="pt")
            meta = json.loads((f.metadata() or {})[META_KEY])
        except Exception as e:   # safetensors' own error type, a missing key, bad JSON
            raise StrataError(f"{where} is not a saved KV state ({type(e).__name__}); strata "
                              f"prefill --save-kv writes one") from None
        if meta.get("format") != FORMAT:
            raise StrataError(f"{where} has format {meta.get('format')!r}; this strata reads "
                              f"{FORMAT}: save it again")
        state = cls(str(path), meta, f, flag)
        if pack is not None:
            state.check(pack, kv)
        return state

    @property
    def tokens(self) -> list[int]:
        return list(self.manifest["tokens"])

    @property
    def n_tokens(self) -> int:
        return int(self.manifest["n_tokens"])

    @property
    def kv(self) -> str:
        return self.manifest["kv"]["dtype"]

    def check(self, pack, kv: str | None) -> None:
        m, flag = self.manifest, f"{self.flag} {self.path}"
        mine = pack_identity(pack)
        if m["pack"]["crc"] != mine["crc"]:
            raise StrataError(f"{flag} was saved from another pack ({m['pack']['arch']}, "
                              f"{m['pack']['source'] or 'no source'}, header crc "
                              f"{m['pack']['crc']}; this one's is {mine['crc']}); read the "
                              f"prompt again through this pack")
        tok = tokenizer_identity(pack)
        if m["tokenizer"] != tok:
            theirs = (m["tokenizer"] or {}).get("source") or "none"
            raise StrataError(f"{flag} was saved with another tokenizer ({theirs}; this pack's "
                              f"is {(tok or {}).get('source') or 'none'}); its tokens mean other "
                              f"text here")
        if kv is not None and self.kv != kv:
            raise StrataError(f"{flag} keeps {self.kv} KV but this run keeps {kv}; give --kv "
                              f"{self.kv} (or read the prompt again)")

    def prefix(self, tokens: list[int]) -> int:
        """Positions of this state a prompt given whole may reuse: the longest common prefix,
        shortened to leave at least one token to read unless the prompt is the saved one
        (whose logits the state holds), and to 0 where a sliding layer no longer holds what
        that prefix needs or a linear layer's state stands elsewhere than at its end
        (strata.engine.kv_stores.reusable)."""
        saved = self.tokens
        n = 0
        for a, b in zip(saved, tokens):
            if a != b:
                break
            n += 1
        if n == len(tokens) and not (n == len(saved) and self.has_logits):
            n -= 1      # the prompt ends inside the saved one: its last token is read again
        m = self.manifest
        if not reusable(n, len(saved), m["starts"], m["kv"]["windows"]):
            return 0
        return max(n, 0)

    @property
    def has_logits(self) -> bool:
        return "logits" in self._file.keys()

    def logits(self) -> torch.Tensor:
        """The saved prompt's last-position logits, fp32 [1, V]."""
        return self._file.get_tensor("logits").float()[None]

    def rows(self, layer: int, part: int, a: int, b: int) -> torch.Tensor:
        """Positions a..b of `layer`'s part `part`, token-major (read from the file)."""
        m = self.manifest
        start = m["starts"][layer]
        if a < start:
            raise StrataError(f"{self.path}: layer {layer} holds positions from {start}; "
                              f"position {a} is gone (a sliding layer)")
        name = f"kv.{layer}.{m['kv']['parts'][part]}"
        whole = self._mapped(name)
        if whole is None:           # not aligned for a view: safetensors reads a copy
            return self._file.get_slice(name)[a - start:b - start]
        return whole[a - start:b - start]

    def _mapped(self, name: str) -> torch.Tensor | None:
        """Tensor `name` as a view of the file mapped once (torch.from_file, private: pages are
        read as they are touched), so a restore copies each position once, file to store, where
        a safetensors slice is a copy first; None where its offset does not align to its dtype
        (safetensors does not pad between tensors)."""
        if self._map is None:
            with open(self.path, "rb") as f:
                n = struct.unpack("<Q", f.read(8))[0]
                header = json.loads(f.read(n))
            buf = torch.from_file(self.path, shared=False, size=os.path.getsize(self.path),
                                  dtype=torch.uint8)
            self._map = (buf, 8 + n, header)
        buf, data, header = self._map
        e = header[name]
        dtype = _DTYPES.get(e["dtype"])
        a, b = e["data_offsets"]
        if dtype is None or (data + a) % dtype.itemsize:
            return None
        return buf[data + a:data + b].view(dtype).view(e["shape"])

    def state(self, layer: int, name: str) -> torch.Tensor:
        """`layer`'s saved recurrent state `name` (conv | S), whole (read from the file)."""
        return self._file.get_tensor(f"state.{layer}.{name}")

    def restore(self, cache, n: int) -> float:
        """Positions 0..n-1 into the empty `cache` (and, where the model has linear layers,
        their recurrent state, which stands at n = the saved length only); returns the seconds
        the read waited for it. A PromptKV's host-held rows are still being written when it
        returns: one thread copies them beside the read, each layer's first stage waiting for
        its rows (strata.engine.kv_stores.restore)."""
        if n > self.n_tokens:
            raise StrataError(f"{self.path} holds {self.n_tokens} positions, not {n}")
        linear = self.manifest.get("linear")
        if n and linear and n != self.n_tokens:
            raise StrataError(f"{self.path} holds the recurrent state of layers "
                              f"{linear['layers']} after its {self.n_tokens} positions only, "
                              f"not after {n}")
        if n and bool(linear) != (getattr(cache, "states", None) is not None):
            raise StrataError(f"{self.path} {'holds' if linear else 'lacks'} a recurrent state "
                              f"that this run's cache {'lacks' if linear else 'keeps'}")
        t0 = time.perf_counter()
        if n:
            restore(cache, n, self.rows)
            restore_states(cache, self.state)
        return time.perf_counter() - t0


# safetensors' dtype names -> torch's (the ones a state's KV parts are saved in)
_DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32,
           "I8": torch.int8, "U8": torch.uint8}
