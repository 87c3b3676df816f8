"""llama.cpp's anchor for kv_resume's questions (issue 41 item 4): ten questions on one 64K
document through llama-server's prompt cache, time to first token each, and its slot save and
restore, on the same GGUF strata reads.

    PYTHONPATH=. python experiments/llama_server_cache.py --gguf M.gguf --bin BUILD/bin \\
        --budget 12GiB [--doc-tokens 65536 --questions 10 --question-tokens 64] \\
        [--strata-csv kv_resume-GPU.csv] --out DIR

llama-server runs as `llama-server -m M.gguf -ngl 99 -ncmoe N -lm LM -fa on -c CTX --parallel 1
-ub UB -b UB --slot-save-path TMP` (LM --load-mode, `none` by default: the -ncmoe experts pinned
in host memory, where a mapped file leaves them pageable) on its own port of 127.0.0.1 (the command, less the port, in every
row); N is the smallest that fits --budget by the file's sizes (strata.bench.llama_cpp, as
llama_side fits llama-bench) and grows while the server's own log says its GPU buffers pass the
budget. CTX defaults to document + question + 1 token. The prompts are token ids (a list as
/completion's "prompt"), drawn with torch.Generator().manual_seed(0) as kv_resume draws its own:
--skip ids first (kv_resume's --prompt + --question, whose resume prompt comes before its
document), then the document, then each question, so both sides read the same tokens.

    doc_read_s    the document alone, n_predict 1, cache_prompt true (an empty cache)
    ttft_s        per question: document + its question, n_predict 1, cache_prompt true; the
                  wall seconds from request to answer, with llama-server's timings in the row
                  (prompt_n the tokens it read, prompt_ms, cache_n the tokens the cache gave)
    slot_save_s, slot_restore_s, slot_bytes
                  POST /slots/0?action=save|restore of the slot after the last question (wall
                  seconds; the server's save_ms / restore_ms in the row) and the file's size

One CSV through strata.bench (figure `ttft_s` and `doc_read_s` as kv_resume names them) and a
PNG of ttft per question, beside strata's when --strata-csv names a kv_resume CSV. Build the
tools with benchmarks/llama_cpp.sh build; `benchmarks/llama_cpp.sh cache` runs both sides.
"""
from __future__ import annotations

import shlex
import sys
import tempfile
from pathlib import Path

import torch

from strata import bench
from strata.bench.llama_cpp import buffers_from_log, gguf_sizes, gpu_mib, ncmoe_for_budget
from strata.bench.llama_server import LlamaServer, gguf_vocab
from strata.errors import StrataError
from strata.units import parse_size

ROOT = Path(__file__).resolve().parents[1]


def main(argv=None) -> int:
    ap = bench.parser(__doc__, out=ROOT / "experiments" / "results")
    ap.set_defaults(label="llama.cpp")
    ap.add_argument("--gguf", type=Path, required=True)
    ap.add_argument("--bin", type=Path, required=True, help="the folder holding llama-server")
    ap.add_argument("--budget", default="12GiB", help="VRAM budget llama.cpp's GPU part fits")
    ap.add_argument("--doc-tokens", type=int, default=65536)
    ap.add_argument("--questions", type=int, default=10)
    ap.add_argument("--question-tokens", type=int, default=64)
    ap.add_argument("--skip", type=int, default=131072 + 64,
                    help="ids drawn before the document (kv_resume's --prompt + --question)")
    ap.add_argument("--ctx", type=int, help="-c (default: document + question + 1)")
    ap.add_argument("--ub", type=int, default=2048, help="-ub = -b (llama_side's pick)")
    ap.add_argument("--ncmoe", type=int, help="pin -ncmoe (else fitted to the budget)")
    ap.add_argument("--load-mode", default="none",
                    help="llama-server -lm (none: its host-held experts pinned; mmap: mapped)")
    ap.add_argument("--compute-margin", default="1.5GiB",
                    help="the first fit's allowance for llama.cpp's compute buffer")
    ap.add_argument("--start-timeout", type=float, default=900, help="seconds to wait for /health")
    ap.add_argument("--timeout", type=float, default=600, help="seconds one request may take")
    ap.add_argument("--strata-csv", type=Path, help="kv_resume's CSV: its ttft rows go beside")
    args = ap.parse_args(argv)
    try:
        check(args)
    except StrataError as e:
        print(f"llama_server_cache: {e}", file=sys.stderr)
        return 2
    stem = bench.run_stem(f"llama_server_cache-{args.gguf.stem}-{args.budget_text}", ROOT)
    try:
        return bench.main(args, "llama_server_cache", measure, script=__file__, argv=argv,
                          stem=stem, plot=lambda rows, png: plot(rows, png, args.strata_csv))
    except StrataError as e:
        print(f"llama_server_cache: {e}", file=sys.stderr)
        return 2


def check(args) -> None:
    """Bad input before anything runs: each a StrataError of one line."""
    args.server = args.bin / "llama-server"
    if not args.server.is_file():
        raise StrataError(f"no llama-server in {args.bin}; build it with `bash "
                          f"benchmarks/llama_cpp.sh build` and give its bin folder")
    if not args.gguf.is_file():
        raise StrataError(f"{args.gguf}: no such GGUF")
    if args.strata_csv and not args.strata_csv.is_file():
        raise StrataError(f"{args.strata_csv}: no such kv_resume CSV")
    if min(args.doc_tokens, args.questions, args.question_tokens) < 1 or args.skip < 0:
        raise StrataError("--doc-tokens, --questions and --question-tokens must be >= 1")
    args.budget_text, args.budget = args.budget, parse_size(args.budget)
    args.ctx = args.ctx or args.doc_tokens + args.question_tokens + 1
    args.sizes = gguf_sizes(args.gguf)
    args.vocab = gguf_vocab(args.gguf)
    args.ncmoe_fit = args.ncmoe if args.ncmoe is not None else ncmoe_for_budget(
        args.sizes, args.budget, args.ctx, parse_size(args.compute_margin))


def server_cmd(args, ncmoe: int, slots: Path) -> list[str]:
    return [str(args.server), "-m", str(args.gguf), "-ngl", "99", "-ncmoe", str(ncmoe),
            "-lm", args.load_mode, "-fa", "on", "-c", str(args.ctx), "--parallel", "1", "-ub", str(args.ub), "-b",
            str(args.ub), "--slot-save-path", str(slots), "--no-webui"]


def prompts(args) -> tuple[list[int], list[list[int]]]:
    """The document's ids and each question's, drawn as kv_resume draws them."""
    g = torch.Generator().manual_seed(0)
    torch.randint(0, args.vocab, (args.skip,), generator=g)     # kv_resume's resume prompt
    doc = torch.randint(0, args.vocab, (args.doc_tokens,), generator=g).tolist()
    qs = [torch.randint(0, args.vocab, (args.question_tokens,), generator=g).tolist()
          for _ in range(args.questions)]
    return doc, qs


def started(args, folder: Path) -> tuple[LlamaServer, int, float]:
    """A ready server whose GPU buffers (its log's) fit the budget: N from the fit, grown."""
    n = args.ncmoe_fit
    while True:
        srv = LlamaServer(server_cmd(args, n, folder), folder / "server.log",
                          start_timeout=args.start_timeout, timeout=args.timeout).start()
        mib = gpu_mib(buffers_from_log(srv.log()))
        if mib * 2**20 <= args.budget or args.ncmoe is not None or n >= args.sizes.n_layer:
            return srv, n, mib
        print(f"[llama] -ncmoe {n}: GPU {mib:.0f} MiB, over the budget; trying {n + 1}",
              flush=True)
        srv.stop()
        n += 1


def measure(args, rec: bench.Recorder) -> None:
    doc, qs = prompts(args)
    with tempfile.TemporaryDirectory(prefix="llama_server_cache-") as tmp:
        folder = Path(tmp)
        srv, n, mib = started(args, folder)
        with srv:
            cfg = dict(gguf=args.gguf.name, budget=args.budget_text, ncmoe=n, gpu_mib=mib,
                       fits=mib * 2**20 <= args.budget, ctx=args.ctx, ub=args.ub,
                       cmd=shlex.join(srv.cmd[:-4]))     # host and port aside
            ask = dict(n_predict=1, cache_prompt=True, temperature=0.0)
            body, s = srv.post("/completion", dict(ask, prompt=doc))
            rec.add("doc_read_s", s, "s", timer=bench.WALL_TIMER, doc=len(doc),
                    **_timings(body), **cfg)
            print(f"[llama] document {len(doc)} tokens: {s:.3f} s", flush=True)
            for i, q in enumerate(qs):
                body, s = srv.post("/completion", dict(ask, prompt=doc + q))
                t = _timings(body)
                rec.add("ttft_s", s, "s", timer=bench.WALL_TIMER, doc=len(doc), question=i,
                        reused=t.get("cache_n", ""), **t, **cfg)
                print(f"[llama] question {i}: read {t.get('prompt_n')} (cache "
                      f"{t.get('cache_n')}), ttft {s:.3f} s", flush=True)
            rec.flush()
            slot_cells(srv, rec, folder, cfg)
    rec.flush()


def _timings(body: dict) -> dict:
    t = body.get("timings") or {}
    return {k: t[k] for k in ("prompt_n", "prompt_ms", "cache_n") if k in t}


def slot_cells(srv: LlamaServer, rec: bench.Recorder, folder: Path, cfg: dict) -> None:
    """The slot saved to a file and restored from it: wall seconds, the server's ms, bytes."""
    name = "slot0.bin"
    body, s = srv.post("/slots/0?action=save", {"filename": name})
    size = (folder / name).stat().st_size
    rec.add("slot_save_s", s, "s", timer=bench.WALL_TIMER, n_saved=body.get("n_saved"),
            save_ms=body.get("timings", {}).get("save_ms"), **cfg)
    rec.add("slot_bytes", size, "B", n_saved=body.get("n_saved"), **cfg)
    body, s = srv.post("/slots/0?action=restore", {"filename": name})
    rec.add("slot_restore_s", s, "s", timer=bench.WALL_TIMER, n_restored=body.get("n_restored"),
            restore_ms=body.get("timings", {}).get("restore_ms"), **cfg)
    print(f"[llama] slot: {size / 1e9:.3f} GB, save {rec.rows[-3]['value']:.3f} s, restore "
          f"{s:.3f} s", flush=True)


def plot(rows: list[dict], png: Path, strata_csv: Path | None) -> None:
    """ttft per question (and the document's own read), llama.cpp beside strata's kv_resume."""
    figs = ("ttft_s", "doc_read_s")
    side = [r for r in rows if r["figure"] in figs]
    if strata_csv:
        side += [dict(r, label="strata") for r in bench.read_csv(strata_csv)
                 if r["figure"] in figs and r["label"] == "tree"]
    bench.bars(side, png, x_keys=["question"], figures=list(figs),
               title=f"{rows[0]['config']['gguf']}: time to first token, document reused "
                     f"({rows[0]['gpu']}, {rows[0]['commit']})")


if __name__ == "__main__":
    sys.exit(main())
