"""The saved-KV flags of `strata prefill` and `strata generate`: --save-kv STATE writes the
prompt's KV after the read (strata.engine.kv_state); --resume STATE restores a saved prompt and
reads only the tokens given here, appended to it; --reuse STATE takes the prompt given whole and
reads only what follows the longest prefix it shares with the saved one.

    io = kv_io(args, pack, ids, from_text=...)   # what is restored, what is read, what is saved
    io.check_kv(kv)                              # this run's KV dtype against the state's
    io.total                                     # the length the plan and the KV are sized for
    n_saved = io.restore(cache)                  # the resident read's own cache
    engine.run(torch.tensor(io.new), **io.engine_kw())    # the streaming engine's
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from strata import filekind
from strata.atomic import check_output
from strata.errors import StrataError


def add_kv_flags(p) -> None:
    g = p.add_argument_group("saved KV (strata.engine.kv_state)")
    g.add_argument("--save-kv", metavar="STATE", default=None,
                   help="after the read, write the prompt's KV (every layer's, in the dtype the "
                        "run kept) and its tokens to STATE (safetensors, written whole or not "
                        "at all)")
    one = g.add_mutually_exclusive_group()
    one.add_argument("--resume", metavar="STATE", default=None,
                     help="restore a prompt saved with --save-kv and read only the prompt given "
                          "here, appended to it (text: tokenized without a leading BOS)")
    one.add_argument("--reuse", metavar="STATE", default=None,
                     help="the prompt is given whole: restore the longest prefix it shares with "
                          "the saved prompt and read only the rest")


def uses_kv_state(args) -> bool:
    return bool(args.save_kv or args.resume or args.reuse)


@dataclass
class KVIO:
    """One prompt's saved-KV plan: `n` positions restored from `state`, then `new` read;
    `tokens` all of them (what a --save-kv writes)."""
    pack: object
    state: object = None             # strata.engine.kv_state.KVState
    n: int = 0
    new: list[int] = field(default_factory=list)
    save: Path | None = None
    extra: int = 0                   # KV kept past the prompt (a decode's tokens)
    saved: object = None             # the SaveInfo of the write
    restore_s: float = 0.0

    @property
    def tokens(self) -> list[int]:
        return (self.state.tokens[:self.n] if self.state is not None else []) + self.new

    @property
    def total(self) -> int:
        return self.n + len(self.new) + self.extra

    def check_kv(self, kv: str) -> None:
        if self.state is not None:
            self.state.check(self.pack, kv)

    def restore(self, cache) -> None:
        if self.state is not None:
            self.restore_s = self.state.restore(cache, self.n)

    def write(self, cache, logits) -> None:
        """--save-kv: the cache's every position (restored and read) with the last logits."""
        if self.save is not None:
            from strata.engine.kv_state import save_state
            last = logits[-1] if logits is not None else None
            self.saved = save_state(self.save, cache, pack=self.pack,
                                    tokens=self.tokens[:cache.length], logits=last)

    def engine_kw(self, then=None) -> dict:
        """PrefillEngine.run's resume / extra / then for this plan; `then(session, logits)` runs
        after the save (a decode), its result the run's `then`."""
        def after(session, logits):
            self.write(session.kv, logits)
            return then(session, logits) if then is not None else None
        return {"resume": (self.state, self.n) if self.state is not None else None,
                "extra": self.extra, "then": after}

    def report(self, res=None) -> dict:
        out = {"restored": self.n, "read": len(self.new), "total": self.n + len(self.new)}
        if self.state is not None:
            out.update(state=self.state.path, saved_tokens=self.state.n_tokens,
                       restore_s=res.restore_s if res is not None else self.restore_s)
        if self.saved is not None:
            out.update(saved_to=self.saved.path, saved_bytes=self.saved.nbytes,
                       save_s=self.saved.seconds, saved_from_host_bytes=self.saved.host_bytes)
        return out


def kv_io(args, pack, ids: list[int], *, from_text: bool, extra: int = 0) -> KVIO:
    """The plan for `ids` (the prompt the flags gave; empty: none) under --resume / --reuse /
    --save-kv, the state opened and checked against the pack (its KV dtype: check_kv)."""
    from strata.engine.kv_state import KVState
    io = KVIO(pack, new=list(ids), extra=extra)
    if args.save_kv:
        inputs = [args.pack, args.resume or args.reuse]
        io.save = check_output(args.save_kv, "--save-kv", kind=filekind.SAFETENSORS,
                               inputs=inputs, force=getattr(args, "force", False))
    path = args.resume or args.reuse
    if not path:
        if not ids:
            raise StrataError("give a prompt (--prompt, --prompt-file, --tokens or "
                              "--prompt-tokens) or --resume STATE")
        return io
    flag = "--resume" if args.resume else "--reuse"
    state = KVState.open(path, pack=pack, flag=flag)
    io.state = state
    if args.resume:
        new = list(ids)
        bos = (pack.tokenizer or {}).get("add_bos") if from_text else None
        if bos is not None and new[:1] == [int(bos)]:
            new = new[1:]        # a continuation: the BOS begins the saved prompt, not this
        io.n, io.new = state.n_tokens, new
        if not new and not state.has_logits:
            raise StrataError(f"--resume {path} holds no logits to continue from; give the "
                              f"tokens that follow it")
    else:
        if not ids:
            raise StrataError("--reuse takes the prompt whole: give --prompt, --prompt-file or "
                              "--tokens")
        io.n = state.prefix(list(ids))
        io.new = list(ids)[io.n:]
    if io.n + len(io.new) + extra > pack.shape.max_pos:
        raise StrataError(f"{flag} {path}: {io.n:,} restored + {len(io.new):,} new + {extra:,} "
                          f"generated tokens exceed the model's context of "
                          f"{pack.shape.max_pos:,}")
    return io


def kv_line(r: dict) -> str:
    """One line of the summary for the report's `kv_state`."""
    parts = []
    if "state" in r:
        parts.append(f"restored {r['restored']:,} of {r['saved_tokens']:,} saved tokens from "
                     f"{r['state']} in {r['restore_s'] * 1e3:.1f} ms, read {r['read']:,} new")
    if "saved_to" in r:
        from strata.units import fmt_bytes
        parts.append(f"saved {r['total']:,} tokens' KV to {r['saved_to']} "
                     f"({fmt_bytes(r['saved_bytes'])}, {r['save_s'] * 1e3:.1f} ms, "
                     f"{fmt_bytes(r['saved_from_host_bytes'])} from host memory)")
    return "  kv state  " + "; ".join(parts)
