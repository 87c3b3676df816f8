"""Quant quality: one model in every stock mix strata writes, and the plain quants, against its
BF16 base: PPL, mean and p99 KL-divergence, same-top-1 agreement and bytes per weight, beside
the streamed tokens/s of the same reads.

The model (`--preset`, `--layers`) is synthesized (strata.packs.memory.MemoryPack: random BF16
experts, the dense weights in bf16): its PPL is that of random weights, so only the distances
from the base mean anything, and the plot's title says so. Each arm is the SAME weights
re-encoded (strata.packs.requant.Requant): the llama.cpp stock mixes (strata.packs.mixes: Q4_K_M,
Q5_K_M, Q3_K_M, Q2_K, IQ4_XS, MXFP4_MOE: per-layer expert types and every dense tensor's type)
and the plain quants Q8_0, Q5_0, Q4_0 (experts only, dense bf16, as `strata synth --quant`).
Encoders: ggml's reference quantizers where strata has them (Q8_0, Q4_0, Q5_0, Q5_1, MXFP4),
strata's round-to-nearest for the k-quants and IQ4 (strata.formats.rtn: no scale search, no
imatrix, so those arms read WORSE than llama.cpp's files of the same mix would); the CSV's
`quantizer` column names which.

The instruments are strata's own (`strata perplexity`'s reader and strata.instruments.measure):
the base is read once with its log-probs saved (`--kld-save`'s base file, llama.cpp's layout),
then every arm against it (`--kld`). Text: the repository's perplexity text
(tests/data/llama_perplexity/text.txt, argparse's module docstring) followed by the docstrings
of a fixed list of standard-library modules (strata.bench.text), until `--tokens` tokens
(the pack's synth tokenizer; UTF-8 bytes as ids where transformers is missing), cut into
windows of `--ctx`.

Streamed tokens/s: the windows' tokens over the seconds of the engine's reads (synchronized,
batches of windows as `strata perplexity` packs them; the scoring is not counted). It means
something only on a GPU under a budget that streams (`--vram`); on the CPU it is recorded and
the plot says CPU.

    python experiments/quant_quality.py --preset qwen3-30b-a3b --vram 12GiB      # GPU
    python experiments/quant_quality.py --preset gpt-oss-20b --vram 12GiB
    python experiments/quant_quality.py --smoke                                  # CPU, ~1 min
    python experiments/quant_quality.py --preset qwen3.5-35b-a3b --layers 8 --arms Q4_K_M \
        --delta-arms backend=fla         # a hybrid's delta-rule launch against the base's

`--delta-arms SPEC,...` adds, for a model with linear-attention layers, one arm per delta-rule
launch (strata.kernels.deltanet.launch, e.g. backend=fla): the BASE weights read under that
launch against the base read under strata's fp32-exact scan (backend=strata, the reference of
every arm), so its KLD is the launch's own error (fla-core's bf16 intermediates against
strata's fp32 ones), beside its tokens/s. The stock-mix arms read under the default launch
(auto: fla-core's on a GPU where it is installed), as a user's read would.

Follows strata.bench: one long-format CSV (figures ppl, kld_mean, kld_p99, top1_agreement,
bytes_per_weight, tokens_per_s; the config names the arm, quantizer, command, layers, text) and
one PNG, named quant_quality-<preset>-<device>.
"""
from __future__ import annotations

import argparse
import gc
import sys
import tempfile
import time
from pathlib import Path

import torch

from strata import bench
from strata.bench.text import text_of_tokens
from strata.errors import StrataError
from strata.kernels.deltanet.launch import launch_from_flag, pin_delta_launch
from strata.packs.memory import MemoryPack
from strata.packs.mixes import MIXES
from strata.packs.requant import Requant
from strata.packs.synth import ExpertFormats, Mix
from strata.shapes import get_preset
from strata.units import parse_size

ROOT = Path(__file__).resolve().parents[1]
PLAIN_QUANTS = ("Q8_0", "Q5_0", "Q4_0")
ARMS = PLAIN_QUANTS + MIXES
BASE = "BF16"


def tokenize(shape, n_tokens: int):
    """(token ids int64 [>= n_tokens], tokenizer name, repeats): synth's tokenizer, or the
    text's UTF-8 bytes where it cannot be built (no transformers on the machine)."""
    from strata.packs.synth_vocab import synth_tokenizer
    entry = synth_tokenizer(shape.vocab)
    if entry is not None:
        from strata.tokenize import TextTokenizer
        tok = TextTokenizer(entry)
        encode, name = (lambda t: tok.encode(t, specials=False)), "synth"
    else:
        encode, name = (lambda t: [b % shape.vocab for b in t.encode("utf-8")]), "utf-8 bytes"
    _, ids, reps = text_of_tokens(encode, n_tokens)
    return torch.tensor(ids[:n_tokens], dtype=torch.int64), name, reps


def reader_args(args) -> argparse.Namespace:
    """`strata perplexity`'s own flags for these reads (its parser, its defaults)."""
    from strata.commands import perplexity as pcmd
    ap = argparse.ArgumentParser()
    pcmd.add_parser(ap.add_subparsers())
    argv = ["perplexity", "memory", "--ctx", str(args.ctx), "--vram", args.vram,
            "--device", args.device]
    if args.experts:
        argv += ["--experts", args.experts]
    if args.smoke:        # the CPU runs no kernels to compile: the warm-up would only re-read
        argv += ["--no-warmup"]
    return ap.parse_args(argv)


def read_arm(pack, windows, rargs, *, save=None, base=None):
    """(instrument Result, read seconds, reader stats): `strata perplexity`'s streamed reader
    over `pack`, every window scored, the engine's reads timed apart from the scoring."""
    from strata.commands.perplexity import make_reader
    from strata.instruments.perplexity import measure
    source = make_reader(rargs, pack, windows)
    dev = rargs.device
    spent = [0.0]

    def timed(ids):
        if dev.startswith("cuda"):
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = source.read(ids)
        if dev.startswith("cuda"):
            torch.cuda.synchronize()
        spent[0] += time.perf_counter() - t0
        return out
    res = measure(windows, timed, per_call=source.per_call, save=save, base=base)
    stats = source.stats()
    del source
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return res, spent[0], stats


def measure(args, rec: bench.Recorder) -> None:
    from strata.instruments.kldfile import Base, BaseWriter
    from strata.instruments.windows import Windows
    full = get_preset(args.preset)
    shape = full.with_(n_layer=min(args.layers, full.n_layer)) if args.layers else full
    arms = [a.strip().upper() for a in args.arms.split(",")] if args.arms else list(ARMS)
    for a in arms:
        if a not in ARMS:
            raise StrataError(f"--arms: unknown arm {a!r}; choose from {', '.join(ARMS)}")
    launches = [d.strip() for d in args.delta_arms.split(",")] if args.delta_arms else []
    if launches and shape.linear is None:
        raise StrataError(f"--delta-arms: {args.preset} has no linear-attention layers")
    for spec in launches:                  # a bad spec or fla-core missing: one line, first
        launch_from_flag(spec, "--delta-arms")
    tokens, tok_name, reps = tokenize(shape, args.tokens)
    windows = Windows.of(tokens, args.ctx, None, what="the text")
    rargs = reader_args(args)
    on_gpu = args.device.startswith("cuda")
    base = MemoryPack(shape, ExpertFormats.of(BASE), seed=args.seed,
                      distinct=args.distinct, device="cuda" if on_gpu else "cpu")
    common = dict(model=args.preset, layers=shape.n_layer, ctx=args.ctx, windows=windows.n,
                  scored_tokens=windows.n * windows.n_scored, tokenizer=tok_name,
                  text_repeats=reps, weights="synthesized", vram=args.vram, device=args.device,
                  command=args.command)
    print(f"[quantq] {args.preset} x {shape.n_layer} layers, {windows.n} windows of {args.ctx} "
          f"tokens ({tok_name}), arms {', '.join(arms)}", flush=True)
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "base.kld"
        ident = {"vocab_sha256": "synth", "tokenizer": tok_name, "add_bos": None,
                 "pack": f"{args.preset} {BASE}"}
        # the reference keeps strata's fp32-exact delta rule (auto would take fla-core's for
        # a bf16 read on CUDA): the arms are measured from the most exact read of the base
        with BaseWriter(path, windows, shape.vocab, ident) as writer, \
                pin_delta_launch(backend="strata"):
            res, secs, st = read_arm(Requant(base, ExpertFormats.of(BASE)), windows, rargs,
                                     save=writer)
        record(rec, BASE, res, secs, st, Requant(base, ExpertFormats.of(BASE)), windows,
               on_gpu, common)
        ref = Base.open(path)
        for arm in arms:
            fmts = Mix.stock(arm, shape) if arm in MIXES else ExpertFormats.of(arm)
            pack = Requant(base, fmts, device="cuda" if on_gpu else "cpu")
            t0 = time.perf_counter()
            try:
                res, secs, st = read_arm(pack, windows, rargs, base=ref)
            except StrataError as e:   # a plan that does not fit this budget: say so, go on
                rec.add("tokens_per_s", 0.0, "tok/s", bound=f"does not fit: {e}", arm=arm,
                        **common)
                continue
            record(rec, arm, res, secs, st, pack, windows, on_gpu, common)
            print(f"[quantq] {arm}: {time.perf_counter() - t0:.1f} s", flush=True)
            rec.flush()
            del pack
        for spec in launches:
            with pin_delta_launch(launch_from_flag(spec, "--delta-arms")):
                res, secs, st = read_arm(Requant(base, ExpertFormats.of(BASE)), windows, rargs,
                                         base=ref)
            record(rec, f"{BASE} delta[{spec}]", res, secs, st,
                   Requant(base, ExpertFormats.of(BASE)), windows, on_gpu, common)
            rec.flush()


def record(rec, arm, res, secs, st, pack, windows, on_gpu, common) -> None:
    """The arm's rows: quality (base: PPL only, its KLD is 0 by definition) and speed."""
    cfg = dict(arm=arm, quantizer=pack.quantizers(), **common)
    rec.add("ppl", res.ppl, "PPL", bound="synthesized weights: only the distance from the base "
            "means anything", ppl_err=res.ppl_err, **cfg)
    if res.kld is not None:
        k = res.kld
        rec.add("kld_mean", k["kld"]["mean"], "nats", kld_err=k["kld"]["err"], **cfg)
        rec.add("kld_p99", k["kld"]["percentiles"]["99"], "nats", **cfg)
        rec.add("top1_agreement", k["same_top"]["p"], "fraction", err=k["same_top"]["err"],
                **cfg)
    rec.add("bytes_per_weight", pack.bytes_per_weight(), "B/weight", **cfg)
    tps = windows.n * windows.ctx / secs if secs else 0.0
    rec.add("tokens_per_s", tps, "tok/s", timer=bench.WALL_TIMER,
            bound="" if on_gpu else "CPU: not a streamed-speed figure",
            bytes_streamed=st.get("bytes_streamed"), batches=st.get("batches"),
            windows_per_batch=st.get("windows_per_batch"), chunk=st.get("chunk"),
            ring=st.get("ring"), **cfg)
    kld = f", KLD {res.kld['kld']['mean']:.4g}" if res.kld is not None else ""
    print(f"[quantq] {arm}: PPL {res.ppl:.4g}{kld}, {pack.bytes_per_weight():.3f} B/weight, "
          f"{tps:,.0f} tok/s", flush=True)


def plot(rows: list[dict], path) -> None:
    """KLD (mean, p99) and top-1 agreement against bytes per weight, one point per arm; tokens/s
    per arm beside them, each bar labelled with its plan's chunk (under a small budget the arms'
    plans differ) or "does not fit". The title names the model, its layers, that the weights are synthetic,
    and the device (CPU: tokens/s not meaningful)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by, plans = {}, {}
    for r in rows:
        by.setdefault(r["config"]["arm"], {})[r["figure"]] = r["value"]
        if r["figure"] == "tokens_per_s":   # each arm's own plan under the budget, or why none
            cf = r["config"]
            plans[cf["arm"]] = f"chunk {cf['chunk']}" if cf.get("chunk") else \
                ("does not fit" if str(r.get("bound", "")).startswith("does not fit") else "")
    arms = list(by)
    c = rows[0]["config"]
    gpu = rows[0]["gpu"]
    cpu = not str(c.get("device", "")).startswith("cuda")
    fig, ax = plt.subplots(1, 3, figsize=(15, 4.6))
    for a in arms:
        v = by[a]
        if "kld_mean" in v:
            x = v["bytes_per_weight"]
            ax[0].scatter([x], [v["kld_mean"]], marker="o")
            ax[0].scatter([x], [v["kld_p99"]], marker="^", color="gray")
            ax[0].annotate(a, (x, v["kld_mean"]), fontsize=7, xytext=(3, 3),
                           textcoords="offset points")
            ax[1].scatter([x], [v["top1_agreement"]])
            ax[1].annotate(a, (x, v["top1_agreement"]), fontsize=7, xytext=(3, 3),
                           textcoords="offset points")
    ax[0].set_yscale("log")
    ax[0].set_xlabel("bytes per weight")
    ax[0].set_ylabel("KLD from the BF16 base (nats): o mean, ^ p99")
    ax[1].set_xlabel("bytes per weight")
    ax[1].set_ylabel("same top-1 token as the base")
    tps = [by[a].get("tokens_per_s", 0.0) for a in arms]
    ax[2].bar(range(len(arms)), tps)
    for i, a in enumerate(arms):
        ax[2].annotate(plans.get(a, ""), (i, tps[i]), fontsize=6, ha="center", rotation=90,
                       xytext=(0, 3), textcoords="offset points")
    ax[2].set_xticks(range(len(arms)), arms, rotation=30, fontsize=7)
    ax[2].set_ylabel("tokens/s" + (" (CPU: not a streamed speed)" if cpu else " streamed"))
    for a in ax:
        a.grid(alpha=0.3)
    fig.suptitle(f"{c['model']} x {c['layers']} layers, SYNTHESIZED weights (random BF16 base, "
                 f"re-encoded per arm): quality vs its base, ctx {c['ctx']}, "
                 f"{c['scored_tokens']:,} scored tokens, --vram {c['vram']} on {gpu}"
                 + ("  [CPU: tokens/s not meaningful]" if cpu else ""), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    ap = bench.parser(__doc__, out=ROOT / "experiments" / "results", warmup=0, repeats=1)
    ap.add_argument("--smoke", action="store_true",
                    help="CPU: the small preset, 2 layers, a short text (checks the script)")
    ap.add_argument("--preset", default="qwen3-30b-a3b", help="model shape (default qwen3-30b-a3b)")
    ap.add_argument("--layers", type=int, default=None, help="first N layers (default all)")
    ap.add_argument("--vram", default="12GiB", help="the reads' budget (default 12GiB)")
    ap.add_argument("--tokens", type=int, default=8192, help="text tokens read (default 8192)")
    ap.add_argument("--ctx", type=int, default=512, help="tokens per window (default 512)")
    ap.add_argument("--arms", default=None,
                    help=f"comma-separated subset of {','.join(ARMS)} (default all)")
    ap.add_argument("--delta-arms", default=None, metavar="SPEC,...",
                    help="a hybrid's delta-rule launches read against the base's (e.g. "
                         "backend=fla): the BASE weights under each")
    ap.add_argument("--experts", default=None, help="--experts of the reads (default auto)")
    ap.add_argument("--device", default=None, help="cuda or cpu (default cuda if available)")
    ap.add_argument("--distinct", type=int, default=8,
                    help="distinct experts per layer variant in the base (MemoryPack)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.smoke:
        args.preset = "tiny-qwen35moe" if args.delta_arms else "small"
        args.layers = args.layers or 2
        args.tokens, args.ctx, args.vram = min(args.tokens, 256), 32, "2GiB"
        args.distinct = min(args.distinct, 4)
    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    parse_size(args.vram)                     # a bad size: one line, before any work
    args.command = bench.command_line(argv)
    tag = "smoke" if args.smoke else bench.gpu_name().replace(" ", "_")
    return bench.main(args, "quant_quality", measure, script=__file__, argv=argv,
                      stem=f"quant_quality-{args.preset}-{tag}", plot=plot,
                      summary=lambda rows: None)


if __name__ == "__main__":
    sys.exit(main())
