"""A long prompt read once, saved, and resumed (issue 41 item 4): the saved state's size, the
save, load and resume times beside a full re-read; ten questions on one document, time to first
token each; decode tokens/s after the prompt.

For qwen3-30b-a3b Q8_0 under `--vram 12GiB` (a full-size synthetic pack held in pinned host
memory, MemoryPack, as experiments/long_prompt.py builds it; `--pack PATH` reads a real pack
instead) through the streaming engine, KV int8 with the newest 32,768 tokens of a layer resident
and the rest in pinned host memory (long_prompt's 131K cell that fits 12 GiB; `--kv`,
`--kv-resident` change it):

    resume      a P-token prompt (default 131,072) read and saved (--save-kv's writer,
                strata.engine.kv_state), then Q new tokens (default 64) read after a resume
                from the file, against a full re-read of the P + Q tokens: state_bytes,
                full_read_s, save_s, load_s (the restore the read waits for: the resident
                rows; the host-held ones are written beside the read), resume_s
                (opening the state, restoring it and reading the Q tokens, to the first new
                token's logits; resume_read_s its read alone; the second resume, warm as
                the full read is: resume_first_s is the first, after the resumed read's own
                warm-up), resume_speedup =
                full_read_s / resume_s (the issue's target:
                >= 20 at 131K), and the new tokens' logits against the full read's
                (the last position's: resume_max_rel, 0 on the CPU where P is a whole
                number of the full read's chunks, as at 131,072; a P inside a chunk, e.g.
                4,096 under a 32K chunk, differs by the KV dtype's rounding: docs/cli.md)
    questions   a D-token document (default 65,536) saved once, then ten questions of Q
                tokens, each given whole (document + question, --reuse's longest common prefix):
                ttft_s per question beside the document's own read (doc_read_s)
    decode      N tokens (default 128) after the resumed prompt (strata.engine.generate):
                decode_tokens_per_s beside its bound (the expert bytes and the host-held KV
                bytes a token streamed, over the H2D rate measured in this run)

llama.cpp's anchor (the same GGUF, `llama-server` with its prompt cache, or `llama-cli
--prompt-cache` / slot save and restore) is run apart; its times go beside these rows.

    python experiments/kv_resume.py                   # GPU: the issue's sizes
    python experiments/kv_resume.py --smoke           # CPU: a tiny model, seconds

Follows strata.bench: a long-format CSV (figures above, seconds by perf_counter around
synchronized reads, after the engine's warm-up for each length) and a PNG.
"""
from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import torch

from strata import bench
from strata.engine.generate import Sampler, decode, decode_bound
from strata.engine.host import HostExperts
from strata.engine.kv_state import KVState, save_state
from strata.engine.prefill import EngineConfig, PrefillEngine
from strata.packs.memory import MemoryPack
from strata.packs.synth import ExpertFormats
from strata.shapes import get_preset

ROOT = Path(__file__).resolve().parents[1]
GIB = 1 << 30
SMOKE = dict(prompt=32, question=8, doc=24, questions=3, decode=4, kv_resident=8)


def main(argv=None) -> int:
    ap = bench.parser(__doc__, out=ROOT / "experiments" / "results")
    ap.add_argument("--smoke", action="store_true", help="tiny model on the CPU (checks the script)")
    ap.add_argument("--pack", default=None, help="a real pack (default: synthetic Q8_0 in memory)")
    ap.add_argument("--vram", default=12 * GIB, type=int, help="VRAM budget in bytes (12 GiB)")
    ap.add_argument("--kv", default="int8", help="KV dtype (default int8)")
    ap.add_argument("--kv-resident", default=32768, type=int,
                    help="tokens of KV a layer keeps in VRAM (default 32768; 0: all)")
    ap.add_argument("--prompt", default=131072, type=int, help="tokens of the saved prompt")
    ap.add_argument("--question", default=64, type=int, help="tokens read after a resume")
    ap.add_argument("--doc", default=65536, type=int, help="tokens of the questions' document")
    ap.add_argument("--questions", default=10, type=int, help="questions on the document")
    ap.add_argument("--decode", default=128, type=int, help="tokens decoded after the prompt")
    ap.add_argument("--state-dir", default=None, help="where the states go (default: a temp dir)")
    ap.add_argument("--parts", default="resume,decode,questions",
                    help="which parts run, comma-separated (decode follows a resume: it needs it)")
    args = ap.parse_args(argv)
    args.parts = {x for x in args.parts.split(",") if x}
    if not args.parts or args.parts - {"resume", "decode", "questions"} or (
            "decode" in args.parts and "resume" not in args.parts):
        ap.error(f"--parts takes resume, decode, questions (decode with resume), got "
                 f"{sorted(args.parts)}")
    if args.smoke:
        for k, v in SMOKE.items():
            setattr(args, k, v)
    tag = "smoke" if args.smoke else bench.gpu_name().replace(" ", "_")
    return bench.main(args, "kv_resume", measure, script=__file__, argv=argv,
                      stem=f"kv_resume-{tag}", plot=plot, summary=lambda rows: None)


def _engine(args, pack, host, max_prompt):
    cuda = torch.cuda.is_available()
    return PrefillEngine(pack, EngineConfig(
        vram=args.vram if cuda else 1 << 30, cache=None if cuda else 256 * 1024,
        max_prompt=max_prompt, kv=args.kv if cuda or args.kv == "int8" else "fp32",
        kv_resident=args.kv_resident or None, chunk=8 if args.smoke else None,
        ring=4 if args.smoke else None, ffn="auto" if cuda else "ref",
        device=None if cuda else "cpu"), host=host)


def _timed(eng, fn):
    eng._sync()
    t0 = time.perf_counter()
    out = fn()
    eng._sync()
    return out, time.perf_counter() - t0


def measure(args, rec: bench.Recorder) -> None:
    shape = get_preset("tiny" if args.smoke else "qwen3-30b-a3b")
    if args.pack:
        from strata.packs import Pack
        pack = Pack.open(args.pack)
        shape = pack.shape
    else:
        pack = MemoryPack(shape, ExpertFormats.of("Q8_0"))
    host = HostExperts(pack.experts, [pl.blob_size for pl in pack.layers],
                       progress=not args.smoke)
    folder = Path(args.state_dir or tempfile.mkdtemp(prefix="kv_resume-"))
    P, Q, D = args.prompt, args.question, args.doc
    cfg = dict(model=str(args.pack or f"{shape.arch}-synth-Q8_0"), kv=args.kv,
               resident=args.kv_resident or "all", vram=args.vram)
    g = torch.Generator().manual_seed(0)
    eng = _engine(args, pack, host, max(P + Q + args.decode if "resume" in args.parts else 0,
                                        D + Q if "questions" in args.parts else 0))
    if "resume" in args.parts:
        _resume(args, rec, eng, pack, shape, folder, cfg, g)
    if "questions" in args.parts:
        _questions(args, rec, eng, pack, shape, folder, cfg, g)


def _resume(args, rec, eng, pack, shape, folder, cfg, g) -> None:
    P, Q = args.prompt, args.question
    kv_name = eng.kv.dtype

    # -- resume a P-token prompt against re-reading it ------------------------------------
    prompt = torch.randint(0, shape.vocab, (P + Q,), generator=g)
    state_path = folder / "prompt.kv"
    with torch.inference_mode():
        eng.warmup(P + Q)
        full, full_s = _timed(eng, lambda: eng.run(prompt, logits="last"))
        eng.warmup(P)
        saved = eng.run(prompt[:P], logits="last", then=lambda s, out: save_state(
            state_path, s.kv, pack=pack, tokens=prompt[:P].tolist(), logits=out[-1])).then

        def resume():
            st = KVState.open(state_path, pack=pack, kv=kv_name)
            return eng.run(prompt[P:], logits="last", resume=(st, P))
        # the resumed read's own warm-up (its plan: Q tokens after P cached positions, the
        # host-held prefix in pieces), as `strata prefill --resume` warms; the first resume
        # after it is resume_first_s, the second the warm figure beside the warm full read
        eng.warmup(P + Q, start=P)
        res, resume_first_s = _timed(eng, resume)
        res, resume_s = _timed(eng, resume)
    want = full.logits.float()        # the last position's: [P + Q, V] would not fit
    rel = float((res.logits.float() - want).abs().max() / want.abs().max())
    same = float((res.logits.argmax(-1) == want.argmax(-1)).float().mean())
    for fig, v, unit in (("state_bytes", saved.nbytes, "B"), ("full_read_s", full_s, "s"),
                         ("save_s", saved.seconds, "s"), ("load_s", res.restore_s, "s"),
                         ("resume_read_s", res.stats.seconds, "s"),
                         ("resume_first_s", resume_first_s, "s"), ("resume_s", resume_s, "s"),
                         ("resume_speedup", full_s / resume_s, "x"),
                         ("resume_max_rel", rel, "rel"), ("resume_argmax_agree", same, "frac")):
        rec.add(fig, v, unit, bound=">= 20x (issue 41)" if fig == "resume_speedup" else "",
                bound_value=20.0 if fig == "resume_speedup" else None,
                timer=bench.WALL_TIMER if unit == "s" else "", prompt=P, question=Q, **cfg)
    rec.flush()
    print(f"[kv] P={P}: state {saved.nbytes / 1e9:.2f} GB, full re-read {full_s:.2f} s, save "
          f"{saved.seconds:.2f} s, load {res.restore_s:.2f} s, read {res.stats.seconds:.3f} s, "
          f"resume {resume_s:.3f} s (first "
          f"{resume_first_s:.3f} s) "
          f"({full_s / resume_s:.1f}x); logits max rel {rel:.2e}", flush=True)

    if "decode" in args.parts:
        _decode(args, rec, eng, pack, shape, state_path, cfg, prompt)
    state_path.unlink()


def _decode(args, rec, eng, pack, shape, state_path, cfg, prompt) -> None:
    """N tokens decoded after the resumed prompt, beside the decode's bound."""
    P, Q = args.prompt, args.question
    kv_name = eng.kv.dtype
    pick = Sampler()
    with torch.inference_mode():
        st = KVState.open(state_path, pack=pack, kv=kv_name)
        r = eng.run(prompt[P:], logits="last", resume=(st, P), extra=args.decode - 1,
                    then=lambda s, out: decode(eng.model, s.provider, s.kv, out, args.decode,
                                               pick, providers=s.providers, sync=eng._sync))
    gbps = r.stats.h2d_gbps if torch.cuda.is_available() and r.stats.bytes_streamed else None
    d = decode_bound(r.then, shape, [pl.blob_size for pl in pack.layers], gbps, False)
    rec.add("decode_tokens_per_s", d["tokens_per_s"], "tok/s",
            bound="(expert + host-held KV) bytes streamed a token / H2D rate",
            bound_value=d["bound_tokens_per_s"], timer=bench.WALL_TIMER, prompt=P + Q,
            n=args.decode, **cfg)
    rec.add("decode_bytes_per_token", d["bytes_streamed_per_token"], "B", prompt=P + Q,
            n=args.decode, **cfg)
    rec.add("decode_kv_bytes_per_token", d["kv_bytes_per_token"], "B", prompt=P + Q,
            n=args.decode, **cfg)
    print(f"[kv] decode {args.decode} tokens: {d['tokens_per_s']:.2f} tok/s, bound "
          f"{d['bound_tokens_per_s'] or float('inf'):.2f}", flush=True)


def _questions(args, rec, eng, pack, shape, folder, cfg, g) -> None:
    """Ten questions on one saved document: each question's time to first token, and its parts
    (opening the state and finding the shared prefix, the session's set-up, the restore the read
    waited for, the read of the question's tokens, the session's tear-down: the loan's refill;
    `other` in the printed line is what none of them holds)."""
    D, Q = args.doc, args.question
    kv_name = eng.kv.dtype
    doc = torch.randint(0, shape.vocab, (D,), generator=g)
    doc_path = folder / "doc.kv"
    with torch.inference_mode():
        eng.warmup(D)
        _, doc_s = _timed(eng, lambda: eng.run(doc, logits="last", then=lambda s, out: save_state(
            doc_path, s.kv, pack=pack, tokens=doc.tolist(), logits=out[-1])))
        rec.add("doc_read_s", doc_s, "s", timer=bench.WALL_TIMER, doc=D, **cfg)
        eng.warmup(D + Q, start=D)       # a question's read: Q tokens after the document
        for i in range(args.questions):
            whole = torch.cat([doc, torch.randint(0, shape.vocab, (Q,), generator=g)])

            opened = []

            def ask():
                t0 = time.perf_counter()
                st = KVState.open(doc_path, pack=pack, kv=kv_name)
                n = st.prefix(whole.tolist())
                opened.append(time.perf_counter() - t0)
                return eng.run(whole[n:], logits="last", resume=(st, n))
            r, ttft = _timed(eng, ask)
            parts = dict(open=opened[0], setup=r.setup_s, restore=r.restore_s,
                         read=r.stats.seconds, teardown=r.teardown_s)
            rec.add("ttft_s", ttft, "s", timer=bench.WALL_TIMER, doc=D, question=i,
                    reused=r.restored, **cfg)
            for k, v in parts.items():
                rec.add(f"ttft_{k}_s", v, "s", timer=bench.WALL_TIMER, doc=D, question=i, **cfg)
            print(f"[kv] question {i}: reused {r.restored} of {D}, ttft {ttft:.3f} s ("
                  + ", ".join(f"{k} {v:.3f}" for k, v in parts.items())
                  + f", other {ttft - sum(parts.values()):.3f})", flush=True)
    rec.flush()
    doc_path.unlink()


def plot(long_rows: list[dict], png: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = [r for r in long_rows if r["label"] == "tree"]
    val = {r["figure"]: r["value"] for r in rows}
    ttft = [r["value"] for r in rows if r["figure"] == "ttft_s"]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    names = ["full_read_s", "save_s", "load_s", "resume_s"]
    a.bar(range(len(names)), [val.get(n, 0) for n in names], color=["C0", "C2", "C2", "C1"])
    a.set_xticks(range(len(names)), ["full re-read", "save", "load", "resume\n(to 1st token)"])
    a.set_ylabel("seconds")
    if any(val.get(n, 0) > 0 for n in names):
        a.set_yscale("log")
    else:
        a.text(0.5, 0.5, "resume not run (--parts)", ha="center", transform=a.transAxes)
    a.set_title(f"resume {val.get('resume_speedup', 0):.1f}x faster than a re-read "
                f"(state {val.get('state_bytes', 0) / 1e9:.2f} GB)", fontsize=9)
    b.bar(range(len(ttft)), ttft, color="C1", label="question (document reused)")
    if "doc_read_s" in val:
        b.axhline(val["doc_read_s"], color="k", ls="--", lw=1, label="the document's own read")
    b.set_xlabel("question")
    b.set_ylabel("time to first token, s")
    b.set_yscale("log")
    b.legend(fontsize=8)
    fig.suptitle(f"saved KV: {long_rows[0]['gpu']} @ {long_rows[0]['commit']}; decode "
                 f"{val.get('decode_tokens_per_s', 0):.1f} tok/s", fontsize=9)
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
