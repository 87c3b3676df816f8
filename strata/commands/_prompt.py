"""The prompt of `strata prefill` / `bench` and what comes out of it: token ids from --tokens,
--prompt, --prompt-file or --prompts-file (refused in one line when they do not fit the pack),
the pack opened as asked, and the logits written whole or not at all."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from strata import filekind
from strata.atomic import atomic_write, check_output
from strata.errors import StrataError


TEXT_LINE = "text:"


def read_prompts_file(path: str, pack, seed: int) -> tuple[list[list[int]], list[bool]]:
    """--prompts-file: one prompt per line (token ids with commas, a length alone, or `text:`
    and the text, tokenized by the pack's tokenizer); the prompts and which of them were text."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        why = getattr(e, "strerror", None) or e
        raise StrataError(f"--prompts-file {path}: cannot read it ({why}); give a UTF-8 text "
                          f"file with one prompt per line") from None
    vocab = pack.shape.vocab
    prompts, texts, tok = [], [], None
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        where = f"--prompts-file {path} line {n}"
        if line.startswith(TEXT_LINE):
            from strata.tokenize import pack_tokenizer
            said = line[len(TEXT_LINE):].strip()
            if not said:
                raise StrataError(f"{where}: `text:` holds no text; give the prompt after it")
            tok = tok or pack_tokenizer(pack)
            ids = tok.encode(said)
            check_context(len(ids), pack.shape, where)
            if any(i >= vocab for i in ids):
                raise StrataError(f"{where}: the tokenizer gave an id outside the model's "
                                  f"vocabulary of {vocab}; the pack's tokenizer does not match "
                                  f"its model")
            prompts.append(ids)
            texts.append(True)
            continue
        texts.append(False)
        if "," in line:
            try:
                ids = parse_tokens(line)
            except StrataError as e:
                raise StrataError(f"{where}: {e}") from None
            bad = [t for t in ids if not 0 <= t < vocab]
            if bad:
                raise StrataError(f"{where}: id {bad[0]} is outside the vocabulary [0, {vocab})")
            prompts.append(ids)
            continue
        if not line.isdigit() or int(line) < 1:
            raise StrataError(f"{where}: {line[:40]!r} is neither token ids (`1,2,3`), a length "
                              f"N >= 1 nor `text: ...`")
        g = torch.Generator().manual_seed(seed + n)
        prompts.append(torch.randint(0, vocab, (int(line),), generator=g).tolist())
    if not prompts:
        raise StrataError(f"--prompts-file {path} holds no prompt; give one per line")
    return prompts, texts


def parse_tokens(text: str) -> list[int]:
    parts = [t for t in text.replace(" ", "").split(",") if t != ""]
    if not parts:
        raise StrataError("--tokens is empty; give comma-separated token ids, e.g. --tokens 1,2,3")
    try:
        return [int(t, 10) for t in parts]
    except ValueError:
        bad = next(t for t in parts if not t.lstrip("-").isdigit())
        raise StrataError(f"--tokens: {bad!r} is not a token id; give comma-separated integers") from None


def prompt_tokens(args, vocab: int) -> list[int]:
    if args.tokens is not None:
        return parse_tokens(args.tokens)
    if args.prompt_tokens < 1:
        raise StrataError(f"--prompt-tokens must be at least 1, got {args.prompt_tokens}")
    g = torch.Generator().manual_seed(args.seed)
    return torch.randint(0, vocab, (args.prompt_tokens,), generator=g).tolist()


def prompt_ids(args, pack) -> tuple[list[int], dict | None]:
    """The prompt's token ids and, for text, what the report shows of it ({source, tokenizer,
    n_tokens, shown}: the first and last few tokens). Text longer than the model's context, or
    ids outside its vocabulary, are refused in one line."""
    if args.prompt is None and args.prompt_file is None:
        return prompt_tokens(args, pack.shape.vocab), None
    from strata.tokenize import pack_tokenizer, show_tokens
    if args.prompt_file is not None:
        src = f"--prompt-file {args.prompt_file}"
        try:
            text = Path(args.prompt_file).read_text(encoding="utf-8")
        except FileNotFoundError:
            raise StrataError(f"--prompt-file: no such file {args.prompt_file}") from None
        except IsADirectoryError:
            raise StrataError(f"--prompt-file: {args.prompt_file} is a folder; give a text "
                              f"file") from None
        except UnicodeDecodeError as e:
            raise StrataError(f"--prompt-file: {args.prompt_file} is not UTF-8 text (byte "
                              f"{e.start}); convert it or give --tokens") from None
    else:
        src, text = "--prompt", args.prompt
    if not text:
        raise StrataError(f"{src} is empty; give some text")
    tok = pack_tokenizer(pack)
    ids = tok.encode(text)
    if not ids:
        raise StrataError(f"{src} tokenizes to no tokens; give some text")
    check_context(len(ids), pack.shape, src)
    big = [i for i in ids if i >= pack.shape.vocab]
    if big:
        raise StrataError(f"{src}: the tokenizer gave id {big[0]}, outside the model's "
                          f"vocabulary of {pack.shape.vocab}; the pack's tokenizer does not "
                          f"match its model")
    return ids, {"source": src, "tokenizer": tok.source, "n_tokens": len(ids),
                 "shown": show_tokens(tok, ids)}


def prompt_line(info: dict) -> str:
    return (f"prompt: {info['n_tokens']:,} tokens from {info['source']} (tokenizer "
            f"{info['tokenizer']}): {info['shown']}")


def dump_path(args) -> Path | None:
    """--dump-logits as the .npy path np.save would write, checked before the prompt runs."""
    if not args.dump_logits:
        return None
    path = str(args.dump_logits)
    path = path if path.endswith(".npy") else path + ".npy"   # what np.save writes
    return check_output(path, "--dump-logits", kind=filekind.NPY, inputs=[args.pack],
                        force=args.force)


def save_logits(path: Path, logits: torch.Tensor) -> str:
    """float32 [T, V] .npy, written to a temp file and renamed (whole or not at all)."""
    out = np.ascontiguousarray(logits.float().cpu().numpy())
    with atomic_write(path) as tmp, open(tmp, "wb") as f:
        np.save(f, out)
    return str(path)


def open_checked(args):
    """The pack (--verify: every tensor's checksum first), after refusing a --delta pin its
    model cannot act on (before any plan or load)."""
    from strata.engine.prompt_plan import check_delta_pin
    from strata.packs import Pack
    pack = Pack.open(args.pack, verify=True if getattr(args, "verify", False) else None)
    check_delta_pin(pack.shape)
    return pack


def check_context(n_tokens: int, shape, flag: str = "the prompt") -> None:
    if n_tokens > shape.max_pos:
        raise StrataError(f"{flag} has {n_tokens} tokens, longer than the model's context of "
                          f"{shape.max_pos} tokens; shorten it")


def prompts_summary(first: str, reports: list[dict]) -> str:
    """--prompts-file: one line per prompt, after the first prompt's full summary `first` (a
    prompt read after a saved one says how many positions it restored)."""
    lines = [first, "  prompts   (one engine, loaded once)"]
    for i, r in enumerate(reports):
        seqs = f" ({r['sequences']} prompts)" if "sequences" in r else ""
        kv = r.get("kv_state") or {}
        after = f" after {kv['restored']:,} restored" if kv.get("restored") else ""
        lines.append(f"    {i + 1:>3}: {r['n_tokens']:>7,} tokens{seqs}{after}  "
                     f"{r['tokens_per_s']:>10,.1f} tokens/s  {r['seconds']:.3f} s (run "
                     f"{r.get('run_s', r['seconds']):.3f} s)  chunk "
                     f"{r['prefill_chunk']} ring {r['prefill_ring']}  warm-up "
                     f"{r['warmup_s']:.3f} s")
    return "\n".join(lines)
