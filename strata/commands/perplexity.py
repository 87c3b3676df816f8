"""`strata perplexity PACK --file text.txt [--ctx 512] [--kld-save base.kld | --kld base.kld]`

llama-perplexity's protocol through a pack (strata.instruments): the text tokenized with the
pack's own tokenizer, cut into windows of --ctx tokens (each starting with BOS when the
vocabulary adds one), the second half of each window scored. Prints `[i]PPL,` per window on
stderr and `Final estimate: PPL = X +/- Y` on stdout; --json prints the numbers instead.

- `--kld-save base.kld` also writes the pack's log-probs over the scored tokens (llama.cpp's
  base layout, strata.instruments.kldfile); `--kld base.kld` reads this pack against such a base
  and prints llama.cpp's KL-divergence table and statistics. Without --file, --kld reads the
  base's own tokens.
- Without --vram every expert is resident; with --vram / --cache the streaming engine reads the
  windows (the budget flags of `strata prefill`).
- Windows are independent: `--batch-windows N` of them are read together as one batch of packed
  sequences (strata.models.packed: block-diagonal causal attention, positions restarting per
  window), so a streamed read moves the experts over PCIe once per batch, not once per window.
  The default fills the chunk: N = chunk // ctx, the chunk the plan picks for a prompt of
  min(all windows, --chunk or the scan's ceiling) tokens (streamed), or --chunk / 2048 tokens
  (llama.cpp's default batch) when resident. N = 1 reads each window as a prompt of its own.

The logits come through a `read(windows) -> logits` function made here; the instrument takes
any such function.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch

from strata.commands._args import (DTYPES, add_budget_flags, check_budget_flags, engine_config,
                                   resolve_experts)
from strata.errors import StrataError

DEFAULT_CTX = 512       # llama-perplexity's default window
RESIDENT_BATCH = 2048   # tokens a resident batch holds without --chunk (llama.cpp's n_batch)


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("perplexity", help="llama-perplexity's PPL and KL-divergence over a text",
                       description="Perplexity of a pack over a text, as llama-perplexity "
                                   "measures it (windows of --ctx tokens, the second half of "
                                   "each scored), and the KL-divergence from a base saved by "
                                   "another pack of the same model.")
    p.add_argument("pack", help="a pack file (strata pack / strata synth)")
    p.add_argument("--file", "-f", metavar="TEXT", default=None,
                   help="a UTF-8 text file, tokenized with the pack's own tokenizer (optional "
                        "with --kld: the base's tokens are read then)")
    p.add_argument("--ctx", "-c", type=int, default=None, metavar="N",
                   help=f"tokens per window, even (default {DEFAULT_CTX}; with --kld the base's)")
    p.add_argument("--chunks", type=int, default=None, metavar="N",
                   help="score only the first N windows (default all)")
    kl = p.add_mutually_exclusive_group()
    kl.add_argument("--kld-save", metavar="BASE", default=None,
                    help="also write this pack's log-probs of the scored tokens as a base file "
                         "(llama-perplexity --kl-divergence-base's layout + strata's identity)")
    kl.add_argument("--kld", metavar="BASE", default=None,
                    help="read this pack against a base file: KL-divergence, same top token, "
                         "Δp and PPL ratio as llama-perplexity --kl-divergence prints them")
    p.add_argument("--batch-windows", type=int, default=None, metavar="N",
                   help="windows read together as one batch of packed sequences (default: as "
                        "many as the chunk holds, chunk // ctx; 1: each window its own prompt)")
    p.add_argument("--force", action="store_true",
                   help="let --kld-save replace an existing file that is not a base file")
    add_budget_flags(p)
    p.add_argument("--devices", default=None, metavar="D,D,...",
                   help="devices of the participants (default cuda:0.. or cpu)")
    p.add_argument("--dtype", choices=["auto", *DTYPES], default="auto",
                   help="dense compute dtype (auto: bfloat16 on cuda, float32 on cpu)")
    p.add_argument("--verify", action="store_true",
                   help="check every tensor's checksum before reading (reads the whole pack)")
    p.add_argument("--no-warmup", action="store_true",
                   help="streamed: skip the warm-up that compiles every kernel variant first")
    p.add_argument("--json", action="store_true", help="print the numbers as JSON")
    return p


def read_text(path: str) -> str:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise StrataError(f"--file: no such file {path}") from None
    except IsADirectoryError:
        raise StrataError(f"--file: {path} is a folder; give a text file") from None
    except UnicodeDecodeError as e:
        raise StrataError(f"--file: {path} is not UTF-8 text (byte {e.start})") from None
    except OSError as e:
        raise StrataError(f"--file: cannot read {path} ({e.strerror or e})") from None
    if not text:
        raise StrataError(f"--file: {path} is empty; give some text")
    return text


def check_save(args) -> Path | None:
    """--kld-save's path, checked before any work: a folder that exists, not an input, and not
    an existing file of another kind (without --force)."""
    if not args.kld_save:
        return None
    from strata.atomic import check_output
    path = check_output(args.kld_save, "--kld-save", inputs=[args.pack, args.file],
                        force=args.force)
    if path.exists() and path.stat().st_size and not args.force:
        with open(path, "rb") as f:
            if f.read(8) != b"_logits_":
                raise StrataError(f"--kld-save {path} already exists and is not a base file; "
                                  f"give another path or --force to replace it")
    return path


def run(args) -> int:
    from strata.commands._prompt import open_checked
    from strata.instruments import report
    from strata.instruments.kldfile import Base, BaseWriter, vocab_sha256
    from strata.instruments.perplexity import measure
    from strata.instruments.windows import Windows, check_ctx
    from strata.tokenize import pack_tokenizer

    if args.file is None and args.kld is None:
        raise StrataError("give the text: --file TEXT (or --kld BASE, which reads the base's "
                          "own tokens)")
    if args.chunks is not None and args.chunks < 1:
        raise StrataError(f"--chunks must be at least 1, got {args.chunks}")
    if args.batch_windows is not None and args.batch_windows < 1:
        raise StrataError(f"--batch-windows must be at least 1, got {args.batch_windows}")
    text = read_text(args.file) if args.file is not None else None
    if args.ctx is not None:
        check_ctx(args.ctx)
    check_budget_flags(args)
    save_path = check_save(args)
    base = Base.open(args.kld) if args.kld else None
    note = None
    pack = open_checked(args)
    tok = pack_tokenizer(pack)
    vsha = vocab_sha256(pack.tokenizer)
    ctx = args.ctx or (base.ctx if base is not None else DEFAULT_CTX)
    even = args.ctx is not None or base is None     # a llama.cpp base may bring an odd window
    check_ctx(ctx, pack.shape.max_pos, even=even)
    # special tokens in the text are text, as llama-perplexity reads them (parse_special off)
    tokens = torch.tensor(tok.encode(text, specials=False), dtype=torch.int64) \
        if text is not None else None
    if tokens is not None and int(tokens.max()) >= pack.shape.vocab:
        raise StrataError(f"the tokenizer gave id {int(tokens.max())}, outside the model's "
                          f"vocabulary of {pack.shape.vocab}; the pack's tokenizer does not match "
                          f"its model")
    if base is not None:
        base.check(vocab_sha=vsha, n_vocab=pack.shape.vocab, ctx=args.ctx, tokens=tokens)
        if base.identity is None:   # said once every refusal is behind (one line each)
            note = (f"note: {args.kld} carries no tokenizer identity (llama-perplexity wrote "
                    f"it): only its vocabulary size" + (" and tokens are" if tokens is not None
                                                        else " is") + " checked")
        tokens = base.tokens
    windows = Windows.of(tokens, ctx, tok.add_bos, what=f"--file {args.file}" if args.file
                         else f"--kld {args.kld}", even=even,
                         min_windows=2 if base is None else 1)
    if args.chunks is not None and args.chunks < windows.n:
        windows = Windows(windows.tokens[:args.chunks * ctx], ctx, windows.bos)
    source = make_reader(args, pack, windows)
    if not args.json:
        if note:
            print(note, file=sys.stderr)
        print(f"perplexity: {windows.n} windows of {ctx} tokens ({windows.n_scored} scored "
              f"each) from {len(tokens):,} tokens (tokenizer {tok.source}), {source.name}, "
              f"experts {source.experts.name} ({source.experts.acts} activations), "
              f"{source.per_call} window{'s' if source.per_call > 1 else ''} a batch",
              file=sys.stderr, flush=True)
        if base is not None:
            print("\n" + report.KLD_HEADER, file=sys.stderr, flush=True)

    def on_window(i, ppl, sums):
        if args.json:
            return
        line = report.kld_row(i, sums.running()) if sums is not None else report.progress(i, ppl)
        print(line, file=sys.stderr, end="\n" if sums is not None else "", flush=True)

    if save_path is not None:
        identity = {"vocab_sha256": vsha, "tokenizer": tok.source, "add_bos": tok.add_bos,
                    "pack": Path(args.pack).name}
        with BaseWriter(save_path, windows, pack.shape.vocab, identity) as writer:
            res = measure(windows, source.read, per_call=source.per_call, save=writer,
                          on_window=on_window)
    else:
        res = measure(windows, source.read, per_call=source.per_call, base=base,
                      on_window=on_window)
    if not args.json and base is None:
        print(file=sys.stderr, flush=True)
    out = {"pack": str(args.pack), "file": args.file, "tokenizer": tok.source,
           "n_tokens": len(tokens), "reader": source.name, "experts": source.experts.name,
           "expert_acts": source.experts.acts, **res.to_dict(), **source.stats(),
           "kld_saved": str(save_path) if save_path else None, "kld_base": args.kld}
    if args.json:
        print(json.dumps(_finite(out)))
    elif res.kld is not None:
        print(report.kld_blocks(res.kld))
    else:
        print(report.final_line(res.ppl, res.ppl_err))
    return 0


def _finite(x):
    """NaN (an error with no spread, a correlation of fewer than ten tokens) as null: JSON has
    no NaN."""
    if isinstance(x, float) and math.isnan(x):
        return None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_finite(v) for v in x]
    return x


class Reader:
    """A logits source for the instrument: `read(ids [n, ctx]) -> [n, n_scored, V]` float32 on
    the model's device (the instrument's per-token work runs there too); `per_call` windows a
    call. One window is read by `one(ids [ctx])`; several by `batch(ids [n·ctx], Packed)` as
    packed sequences. `experts`: the expert FFN that runs (strata.models.moe; the report names
    it and its activations). `stats()` what the reads cost."""

    def __init__(self, name: str, one, windows, experts, *, batch=None, per_call: int = 1):
        self.name, self._one, self.first, self.ctx = name, one, windows.first, windows.ctx
        self.experts = experts
        self._batch, self.per_call = batch, per_call if batch is not None else 1
        self.extra: dict = {}

    def read(self, ids: torch.Tensor) -> torch.Tensor:
        from strata.models.packed import Packed
        n = ids.shape[0]
        with torch.inference_mode():
            if n > 1:
                lg = self._batch(ids.reshape(-1), Packed.of([self.ctx] * n))   # [n·ctx, V]
                return lg.view(n, self.ctx, -1)[:, self.first:self.ctx - 1].float()
            return torch.stack([self._one(row)[self.first:self.ctx - 1].float()
                                for row in ids])

    def stats(self) -> dict:
        return {"windows_per_batch": self.per_call, **self.extra}


def windows_per_batch(args, chunk: int, windows) -> int:
    """--batch-windows, else as many windows as `chunk` tokens hold (at least 1), at most all."""
    n = args.batch_windows if args.batch_windows is not None else max(1, chunk // windows.ctx)
    return max(1, min(n, windows.n))


def make_reader(args, pack, windows) -> Reader:
    """The resident model (no budget) or the streaming engine (--vram / --cache / --kv int8 /
    --kv-resident), as `strata prefill` chooses."""
    from strata.commands.prefill import _streaming
    return streamed_reader(args, pack, windows) if _streaming(args) else \
        resident_reader(args, pack, windows)


def resident_reader(args, pack, windows) -> Reader:
    from strata.commands.prefill import make_provider, resident_device
    from strata.engine.finite import FiniteGuard
    from strata.kernels.attention.kv_int8 import resolve_kv
    from strata.engine.engine_config import layer_blocks
    from strata.engine.load import load_model, resolve_device
    from strata.models.moe import ffn_named

    if ffn_named(args.experts).lands:
        raise StrataError(f"--experts {args.experts} needs the streaming engine: give --vram "
                          f"SIZE (or --cache)")
    args.device = resident_device(args)
    device = resolve_device(args.device)
    dtype = (torch.bfloat16 if device.type == "cuda" else torch.float32) \
        if args.dtype == "auto" else DTYPES[args.dtype]
    guard = FiniteGuard()
    ffn = resolve_experts(args.experts, device.type)
    model = load_model(pack, device=device, dtype=dtype, ffn=guard.wrap(ffn.forward()),
                       layer_blocks=layer_blocks(args))
    _, provider = make_provider(args, pack, device)
    kv = resolve_kv(args.kv, dtype)

    def one(ids, packed=None):
        cache = model.new_cache(capacity=ids.numel(), kv=kv)
        chunk = ids.numel() if packed is not None else args.chunk
        return model.prefill(ids, provider, chunk=chunk, cache=cache, logits="all",
                             observer=guard.begin(pack.shape.n_layer), packed=packed)
    per_call = windows_per_batch(args, args.chunk or RESIDENT_BATCH, windows)
    return Reader(f"resident on {device}", one, windows, ffn, batch=one, per_call=per_call)


def streamed_reader(args, pack, windows) -> Reader:
    from strata.commands._prompt import check_context
    from strata.commands._args import refuse_unfit_plan
    from strata.engine.prefill import PrefillEngine

    from strata.memory.scan import SCAN_MAX
    from strata.models.packed import Packed

    ctx = windows.ctx
    if args.batch_windows is not None:
        want = min(args.batch_windows, windows.n) * ctx
    else:   # fill the chunk: plan for as many windows as the scan may take in one
        cap = args.chunk or args.prefill or SCAN_MAX
        want = max(1, min(windows.n, cap // ctx)) * ctx
    want = min(want, args.max_prompt) if args.max_prompt else want
    want = max(want, ctx)
    cfg = engine_config(args, want, progress=False)
    check_context(cfg.max_prompt, pack.shape, "--max-prompt")
    refuse_unfit_plan(pack, cfg, want)
    engine = PrefillEngine(pack, cfg, early=getattr(args, "_early", None))
    plan = engine.plan(want)
    per_call = windows_per_batch(args, min(plan.chunk, want), windows)
    if per_call > 1 and per_call * ctx > plan.chunk:
        raise StrataError(f"--batch-windows {per_call} at --ctx {ctx} makes batches of "
                          f"{per_call * ctx} tokens, longer than the planned chunk of "
                          f"{plan.chunk}; give --batch-windows {max(1, plan.chunk // ctx)} or less")
    if per_call > 1 and per_call * ctx < want:
        # the batch the chunk holds is shorter than planned for: read through its own plan
        # (the one the warm-up makes for it); a batch always fits the chunk of its plan
        plan = engine.plan(per_call * ctx)
        per_call = max(1, min(per_call, plan.chunk // ctx))
    packed = Packed.of([ctx] * per_call) if per_call > 1 else None
    warm = 0.0 if args.no_warmup else engine.warmup(per_call * ctx, packed=packed)
    extra = {"warmup_s": warm, "bytes_streamed": 0, "copy_s": 0.0, "wait_s": 0.0, "batches": 0,
             "chunk": plan.chunk, "ring": plan.ring}

    def one(ids, packed=None):
        # every batch through the plan made for the fullest one (a last, shorter batch too)
        res = engine.run(ids, logits="all", packed=packed,
                         plan=plan if packed is not None else None)
        extra["bytes_streamed"] += res.stats.bytes_streamed
        extra["copy_s"] += res.stats.copy_s
        extra["wait_s"] += res.stats.wait_s
        extra["batches"] += 1
        extra["prefill_chunk"], extra["prefill_ring"] = res.chunk, res.ring
        return res.logits
    r = Reader(f"streamed on {', '.join(str(p.device) for p in engine.parts)}", one, windows,
               cfg.ffn, batch=one, per_call=per_call)
    r.extra = extra
    return r
