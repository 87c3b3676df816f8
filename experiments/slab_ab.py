"""A/B of the scratch slab (EngineConfig.slab, STRATA_MMQ_SLAB): the failure it exists for, its
cost, and why its pool rounds to size classes.

Three parts, all in one strata.bench long-format CSV (config "part": fill | cost | classes; the
rest of each part's row becomes its config and figures), plus one PNG:

1. fill — the failure. A prefill engine reads a prompt with the expert GEMM pinned
   to stream-k (every launch asks for fixup scratch). Then the card is filled: on a GPU a ballast
   tensor leaves free only the prompt's own transient peak (torch's reserved bytes measured
   over an unconstrained slab-on run from an emptied cache) plus --margin-mib, then, level by
   level, the live-bytes peak plus --scratch-fractions of the slab-off scratch (torch frees
   cached blocks and retries a failed allocation, so live bytes are what must fit); on the CPU
   (--smoke) the ordinary scratch allocator is given a zero budget (a SIMULATED full card: it
   raises torch.cuda.OutOfMemoryError, as torch.empty does on a full GPU). On the filled card:
   slab off (expected: the request fails with an AllocationError, the cache byte for byte intact),
   slab on (expected: completes, last-token logits identical to the unconstrained slab-on run),
   then the ballast is freed and slab off reads again (the engine stayed usable).
   On CUDA the ordinary scratch pool takes its buffers from a private torch.cuda.MemPool when
   torch has one (--ordinary mempool, the default): a new buffer is then a new device
   allocation, as ggml's pool's cudaMalloc is, instead of a block torch's cache happens to hold.
2. cost — what the slab costs, per participant. Measured, not modelled: the slots the engine
   actually lent (its loans, seen through the engine's observer hook) with the slab off and on,
   the plan's chunk and ring both ways (the chunk arithmetic must not change), the slab pool's
   high-water mark, and the slots `need + high_water` would take (the cost if the loan were sized
   to exactly what the pool used; the engine lends the size classes its launches will ask for,
   computed from the kernel's own tile choice, so the two agree unless a prompt asks for fewer
   classes).
3. classes — the pool's high-water mark with size classes (SlabPool) against an
   exact-size caching pool (OrdinaryScratch) over one run of launches whose tile changes per
   launch: the kernel's own heuristic tile for each chunk size of a sweep (--shape, stream-k
   forced, P = the SM count), scratch sized by the kernel's own `scratch_nbytes`. No kernel runs
   here: the two real pools are fed the same request sequence.

    PYTHONPATH=. python experiments/slab_ab.py            # GPU (the lead runs it on the H200)
    PYTHONPATH=. python experiments/slab_ab.py --smoke    # CPU, tiny shapes, simulated full card

    PYTHONPATH=. python experiments/slab_ab.py --base main   # also the same run at main

Writes experiments/results/slab_ab[_smoke].csv and slab_ab[_smoke].png. Untimed: no gate applies
(the fill runs compare logits against the unconstrained run and record the outcome).
"""
from __future__ import annotations

import contextlib
import gc
import sys
import tempfile
from pathlib import Path

import torch
from tqdm import tqdm

import strata  # noqa: F401  (interpreter without CUDA)
from strata import bench
from strata.engine.observe import EngineObserver
from strata.engine.prefill import EngineConfig, PrefillEngine
from strata.engine.scratch import OrdinaryScratch
from strata.errors import AllocationError
from strata.kernels.moe.ffn import scratch_nbytes
from strata.kernels.moe.tiles import GemmProblem, choose_tile, pin_tile
from strata.memory.pool import SlabPool, size_class
from strata.packs.synth import ExpertFormats, synth_pack
from strata.shapes import ModelShape, get_preset

MiB = 1 << 20


class ZeroBudget:
    """Ordinary memory on a simulated full card: every new buffer is refused."""
    refused = 0

    def __call__(self, nbytes):
        self.refused += 1
        raise torch.cuda.OutOfMemoryError(f"(simulated full card) tried to allocate {nbytes} B")


def mempool_alloc(device):
    """New buffers from a private torch.cuda.MemPool: each new one is a new device allocation."""
    if not hasattr(torch.cuda, "MemPool"):
        tqdm.write("  this torch has no torch.cuda.MemPool: ordinary scratch from torch.empty",
                   file=sys.stderr)
        return None
    pool = torch.cuda.MemPool()

    def alloc(nbytes):
        with torch.cuda.use_mem_pool(pool, device=device):
            return torch.empty(int(nbytes), dtype=torch.uint8, device=device)
    alloc.pool = pool
    return alloc


@contextlib.contextmanager
def slab(eng: PrefillEngine, on: bool):
    """The engine's prompts inside read with the scratch slab on or off (EngineConfig.slab is
    read per prompt)."""
    saved, eng.cfg.slab = eng.cfg.slab, on
    try:
        yield
    finally:
        eng.cfg.slab = saved


class LoanLog(EngineObserver):
    """Appends every loan the engine borrows to `out`: (participant cache, bytes the layout
    needs, slots lent)."""

    def __init__(self, out: list):
        self.out = out

    def on_loan(self, part, need, loan):
        self.out.append((part.cache, need, loan.n_slots))


@contextlib.contextmanager
def recorded_loans(eng: PrefillEngine, out: list):
    """Record into `out` the loans of the prompts read inside."""
    log = LoanLog(out)
    eng.observers.append(log)
    try:
        yield
    finally:
        eng.observers.remove(log)


# -- 1 + 2: the engine -------------------------------------------------------------------------
def build_engine(args, pack) -> PrefillEngine:
    cfg = EngineConfig(vram=args.vram, chunk=args.chunk, ring=args.ring, reserve=args.reserve,
                       max_prompt=args.tokens, ffn="kernel", device=args.device,
                       cache=args.cache)
    return PrefillEngine(pack, cfg)


def fresh_ordinary(eng, alloc=None):
    for part in eng.parts:
        part.scratch.use_ordinary(OrdinaryScratch(part.device, alloc=alloc))


def attempt(eng, tokens, label, rows, ref=None):
    """One prompt; a row with its outcome (ok / AllocationError) and the comparison to ref."""
    loans: list = []
    row = {"run": label}
    try:
        with recorded_loans(eng, loans), pin_tile(schedule="stream_k"):
            res = eng.run(tokens, logits="last")
        row.update(outcome="ok", chunk=res.chunk, ring=res.ring, plan_chunk=res.plan.scan_chunk,
                   plan_ring=res.plan.ring)
        if ref is not None:
            row["logits_identical"] = bool(torch.equal(res.logits.cpu(), ref))
            row["logits_max_rel"] = float((res.logits.cpu() - ref).abs().max() / ref.abs().max())
        out = res.logits.cpu()
    except AllocationError as e:
        row.update(outcome="AllocationError", error=str(e).splitlines()[0][:160])
        out = None
    except torch.cuda.OutOfMemoryError as e:   # outside the engine's request guard: a finding
        row.update(outcome="OutOfMemoryError (uncaught by the engine)",
                   error=str(e).splitlines()[0][:160])
        out = None
    for i, part in enumerate(eng.parts):
        st = part.scratch.stats()
        row[f"p{i}_slots_lent"] = next((n for c, _, n in loans if c is part.cache), "")
        row[f"p{i}_slab_high_water"] = st["slab_high_water"]
        row[f"p{i}_ordinary_new_buffers"] = st["ordinary_new_buffers"]
        row[f"p{i}_ordinary_held"] = st["ordinary_held"]
    rows.append(row)
    tqdm.write(f"  {label}: {row['outcome']} {row.get('logits_identical', '')}", file=sys.stderr)
    return out, loans


class Card:
    """The device's memory around the filled-card runs (CUDA; a no-op on the CPU).

    `warm()` measures the prompt's own transient footprint: torch's reserved bytes at the peak
    of a slab-on prompt started from an emptied cache. `fill()` then leaves exactly that much
    (plus --margin-mib) free beside a ballast tensor. Each constrained run starts from an emptied
    cache, so a slab-on prompt repeats the measured allocation sequence and fits, and anything
    the slab-off prompt takes on top (its scratch, in its own MemPool segments) does not."""

    def __init__(self, eng, margin: int):
        self.cuda = eng.device.type == "cuda"
        self.dev, self.margin = eng.device, margin
        self.peak, self.live, self.ballast, self.free_left = 0, 0, None, None

    def _settle(self):
        if self.cuda:
            gc.collect()
            torch.cuda.synchronize(self.dev)
            torch.cuda.empty_cache()

    @contextlib.contextmanager
    def warm(self):
        self._settle()
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.dev)
            r0 = torch.cuda.memory_reserved(self.dev)
            a0 = torch.cuda.memory_allocated(self.dev)
        yield
        if self.cuda:
            self.peak = torch.cuda.max_memory_reserved(self.dev) - r0
            self.live = torch.cuda.max_memory_allocated(self.dev) - a0

    def fill(self, leave: int | None = None):
        """Leave `leave` bytes free (default: the measured reserved peak + margin)."""
        self._settle()
        if not self.cuda:
            return
        leave = self.peak + self.margin if leave is None else leave
        free = torch.cuda.mem_get_info(self.dev)[0]
        take = max(0, free - leave)
        for _ in range(8):        # the allocator rounds up: step down until the ballast fits
            try:
                self.ballast = torch.empty(take, dtype=torch.uint8, device=self.dev)
                break
            except torch.cuda.OutOfMemoryError:
                take -= 2 * MiB
        self._settle()
        self.free_left = torch.cuda.mem_get_info(self.dev)[0]
        tqdm.write(f"  ballast {take / MiB:,.0f} MiB; {self.free_left / MiB:,.0f} MiB left free "
                   f"(asked {leave / MiB:,.1f}; the prompt's peak: {self.peak / MiB:,.0f} MiB "
                   f"reserved, {self.live / MiB:,.0f} MiB live)", file=sys.stderr)

    def ordinary_alloc(self, kind: str):
        """A fresh allocator for a constrained run's ordinary scratch."""
        self._settle()
        if not self.cuda:
            return ZeroBudget()
        return mempool_alloc(self.dev) if kind == "mempool" else None

    def empty(self):
        self.ballast = None
        self._settle()


def run_fill(args, eng, tokens) -> tuple[list[dict], list[dict]]:
    card = Card(eng, args.margin_mib * MiB)
    fill, cost = [], []
    digest = [p.cache.buffer.cpu().clone() for p in eng.parts]

    def intact():
        fill[-1]["cache_intact"] = all(torch.equal(p.cache.buffer.cpu(), d)
                                       for p, d in zip(eng.parts, digest))

    # unconstrained references (and the cost: the loans lent with the slab off and on)
    fresh_ordinary(eng)
    with slab(eng, False):
        ref_off, loans_off = attempt(eng, tokens, "unconstrained slab off", fill)
    with slab(eng, True), card.warm():          # also measures the prompt's own peak
        ref_on, loans_on = attempt(eng, tokens, "unconstrained slab on", fill, ref_off)
    for i, part in enumerate(eng.parts):
        lay = part.cache.layout
        (_, need, off_n), = [(c, nd, n) for c, nd, n in loans_off if c is part.cache]
        (_, _, on_n), = [(c, nd, n) for c, nd, n in loans_on if c is part.cache]
        hw = part.scratch.slab.high_water
        cost.append({"participant": part.name, "need": need, "slots_off": off_n,
                     "slots_on": on_n, "extra_slots_on": on_n - off_n,
                     "slab_high_water": hw, "slots_need_plus_hw": lay.slots_for(need + hw, 0.9),
                     "extra_slots_need_plus_hw": lay.slots_for(need + hw, 0.9) - off_n,
                     "chunk_off": fill[0].get("plan_chunk"),
                     "chunk_on": fill[1].get("plan_chunk"),
                     "ring_off": fill[0].get("plan_ring"), "ring_on": fill[1].get("plan_ring")})

    # The levels of free memory the card is filled to. On the CPU one (the zero budget). On a GPU:
    # the reserved peak + margin, and then the live peak + a fraction of the slab-off scratch S:
    # torch frees its cached blocks and retries when a device allocation fails, so what must fit
    # beside the ballast is the live bytes, not the reserved ones; below live + S slab off cannot
    # take its scratch while slab on (its scratch inside the loan) still fits.
    scratch = max(int(fill[0].get("p0_ordinary_held") or 0), 1)
    levels = [("filled card", None)] if card.cuda else [("SIMULATED full card", None)]
    if card.cuda:
        levels += [(f"filled card, live+{f:.0%} scratch", card.live + int(f * scratch))
                   for f in args.scratch_fractions]
    for label, leave in levels:
        card.fill(leave)
        for on in (False, True):
            fresh_ordinary(eng)                 # let go of the last run's pool before settling
            fresh_ordinary(eng, card.ordinary_alloc(args.ordinary))
            with slab(eng, on):
                attempt(eng, tokens, f"{label} slab {'on' if on else 'off'}", fill,
                        ref_on if on else ref_off)
            fill[-1]["free_left_mib"] = "" if card.free_left is None else card.free_left // MiB
            if card.cuda:
                fill[-1]["live_peak_mib"] = card.live / MiB
                fill[-1]["reserved_peak_mib"] = card.peak / MiB
                fill[-1]["scratch_mib"] = scratch / MiB
            intact()
        fresh_ordinary(eng)
        card.empty()
    with slab(eng, False):
        attempt(eng, tokens, "ballast freed, slab off (next prompt)", fill, ref_off)
    intact()
    return fill, cost


# -- 3: size classes vs exact sizes ------------------------------------------------------------
def sweep_tiles(shape: ModelShape, n_sms: int, chunks: list[int], sweep: str):
    """(tokens, tile) per launch. "heuristic": the kernel's tile for each chunk size, stream-k
    forced. "pinned-P": the same tiles with the grid pinned per launch to a different program
    count (SYNTHETIC: a per-launch split search like MMQ's J, which strata's heuristic does not
    do; it shows where classes pay off)."""
    for i, t in enumerate(chunks):
        tile = choose_tile(GemmProblem(t, shape.top_k, shape.n_expert, shape.d_model,
                                       shape.d_expert, n_sms)).with_(schedule="stream_k")
        if sweep == "pinned-P":
            tile = tile.with_(programs=n_sms - (7 * i) % (n_sms // 2))
        yield t, tile


def run_classes(shape: ModelShape, n_sms: int, chunks: list[int], sweep: str) -> list[dict]:
    """Feed the scratch of one launch per chunk size to a SlabPool (dry: its own classes and
    bump, no memory) and to an exact-size caching pool (the real pools' code, no kernel); their
    high-water marks after each launch."""
    sizes = [(t, tile, scratch_nbytes(tile)) for t, tile in
             sweep_tiles(shape, n_sms, chunks, sweep)]
    pool = SlabPool.dry()          # the pool's own code over an unbounded tail, no memory
    exact = OrdinaryScratch("cpu", alloc=lambda n: torch.empty(1, dtype=torch.uint8))
    rows, last = [], None
    for i, (t, tile, b) in enumerate(sizes):
        if last is not None:                 # one launch's scratch at a time, as in the engine
            pool.release(last[0])
            exact.release(last[1])
        s, e = pool.alloc(b), exact.alloc(b)
        last = (s, e)
        rows.append({"sweep": sweep, "launch": i, "tokens": t, "BLOCK_M": tile.BLOCK_M,
                     "BLOCK_N": tile.BLOCK_N,
                     "programs": tile.programs, "scratch": b, "class": size_class(b),
                     "slab_high_water": pool.high_water, "exact_high_water": exact.high_water,
                     "exact_buffers": exact.new_buffers})
    return rows


PART_CONFIG = {"fill": ("run",), "cost": ("participant",),
               "classes": ("sweep", "launch", "tokens", "BLOCK_M", "BLOCK_N", "programs",
                           "shape", "n_sms")}
BOUNDS = {  # (part, figure) -> (bound in words, key of the row holding its value)
    ("classes", "slab_high_water"): ("exact-size caching pool high-water", "exact_high_water"),
    ("cost", "slots_on"): ("slots lent with the slab off", "slots_off"),
}


def unit_of(figure: str) -> str:
    if "slots" in figure:
        return "slots"
    if figure in ("need", "scratch", "class") or "high_water" in figure or "held" in figure:
        return "bytes"
    if figure.endswith("_mib"):
        return "MiB"
    if "buffers" in figure:
        return "buffers"
    return ""


def record(rec: bench.Recorder, part: str, rows: list[dict], mode: str) -> None:
    """A part's table rows -> long-format figures (booleans as 1/0, outcomes as text)."""
    for r in rows:
        cfg = {"part": part, "mode": mode} | {k: r[k] for k in PART_CONFIG[part] if k in r}
        for fig, v in r.items():
            if fig in cfg or v == "" or v is None:
                continue
            bound, key = BOUNDS.get((part, fig), ("", None))
            rec.add(fig, float(v) if isinstance(v, bool) else v, unit_of(fig), bound=bound,
                    bound_value=r.get(key) if key else None, **cfg)


def table(long_rows: list[dict], part: str, label: str = "tree") -> list[dict]:
    """One part's rows back from the long format (in first-seen order)."""
    out: dict = {}
    for r in long_rows:
        c = r["config"]
        if r["label"] != label or c.get("part") != part:
            continue
        key = tuple(c.get(k) for k in PART_CONFIG[part])
        row = out.setdefault(key, {k: c[k] for k in PART_CONFIG[part] if k in c})
        v = r["value"]
        row[r["figure"]] = int(v) if isinstance(v, float) and v.is_integer() else v
    return list(out.values())


def plot(long_rows: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fill, cost, classes = (table(long_rows, p) for p in ("fill", "cost", "classes"))
    r0 = long_rows[0]
    c0 = classes[0] if classes else {}
    title = (f"scratch slab A/B ({r0['config']['mode']}, {r0['commit']}); class sweep: "
             f"{c0.get('shape', '')}, {c0.get('n_sms', '')} SMs")

    fig, ax = plt.subplots(1, 3, figsize=(16, 4.6))
    for sweep, style in (("heuristic", "-"), ("pinned-P", ":")):
        rs = [r for r in classes if r["sweep"] == sweep]
        x = [r["launch"] for r in rs]
        ax[0].step(x, [r["exact_high_water"] / MiB for r in rs], style, where="post",
                   color="tab:red", label=f"exact-size caching, {sweep}")
        ax[0].step(x, [r["slab_high_water"] / MiB for r in rs], style, where="post",
                   color="tab:blue", label=f"size classes (SlabPool), {sweep}")
    ax[0].set(xlabel="launch (chunk size sweep)", ylabel="pool high-water (MiB)",
              title="scratch pool high-water, tile per launch")
    ax[0].legend(fontsize=8)
    ax[0].grid(alpha=0.3)
    names = [c["participant"] for c in cost]
    xs = range(len(names))
    ax[1].bar([i - 0.2 for i in xs], [c["slots_off"] for c in cost], 0.4, label="slab off")
    ax[1].bar([i + 0.2 for i in xs], [c["slots_on"] for c in cost], 0.4, label="slab on")
    ax[1].set_xticks(list(xs), names)
    ax[1].set(ylabel="cache slots lent", title="what the slab costs (lent slots)")
    ax[1].legend(fontsize=8)
    labels = [r["run"] for r in fill]
    ok = [1 if r["outcome"] == "ok" else 0 for r in fill]
    ax[2].barh(range(len(fill)), [1] * len(fill),
               color=["tab:green" if o else "tab:red" for o in ok])
    for i, r in enumerate(fill):
        ax[2].text(0.02, i, f"{r['run']}: {r['outcome']}"
                   + (" (logits identical)" if r.get("logits_identical") else "")
                   + ("" if r.get("cache_intact", True) else " CACHE CHANGED"),
                   va="center", fontsize=7)
    ax[2].set_yticks([])
    ax[2].set_xticks([])
    ax[2].set_title("prompts on a filled card")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    ap = bench.parser(__doc__, out=Path(__file__).parent / "results")
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny shapes, simulated full card")
    ap.add_argument("--tokens", type=int, default=None, help="prompt length")
    ap.add_argument("--vram-gib", type=float, nargs="+", default=[3.0],
                    help="engine VRAM budget per GPU (the ballast then fills the real card)")
    ap.add_argument("--chunk", type=int, default=1024, help="GPU: forced chunk (tokens)")
    ap.add_argument("--margin-mib", type=int, default=8,
                    help="GPU: free memory left beside the ballast on top of the prompt's "
                         "measured peak (keep it under the scratch's size)")
    ap.add_argument("--scratch-fractions", type=float, nargs="+", default=[0.1, 0.4, 0.7],
                    help="GPU: also fill the card to the prompt's live peak + these fractions "
                         "of the slab-off scratch")
    ap.add_argument("--ordinary", choices=["mempool", "torch"], default="mempool",
                    help="CUDA: where the slab-off scratch pool takes new buffers")
    ap.add_argument("--shape", default="qwen3-30b-a3b", help="preset for the class sweep")
    args = ap.parse_args(argv)
    smoke = args.smoke or not torch.cuda.is_available()
    tag = "slab_ab_smoke" if smoke else "slab_ab"
    return bench.main(args, "slab_ab", lambda a, rec: measure(a, rec, smoke), script=__file__,
                      argv=argv, stem=tag, plot=plot, summary=summary)


def measure(args, rec: bench.Recorder, smoke: bool) -> None:
    if smoke:
        shape = ModelShape(n_layer=2, d_model=64, n_expert=16, top_k=2, d_expert=32, n_head=4,
                           n_kv_head=2, head_dim=16, vocab=64)
        args.vram, args.chunk, args.ring, args.reserve, args.cache = [1 << 20], 8, 2, 0, None
        args.device, args.tokens = "cpu", args.tokens or 12
        fmts = ExpertFormats("BF16", "BF16", "BF16")
        n_sms, chunks = 132, list(range(256, 4097, 256))
    else:
        # qwen3-30b-a3b's layer widths, 4 layers, BF16 experts (9.4 MB blobs, 1.2 GB per layer)
        shape = ModelShape(n_layer=4, d_model=2048, n_expert=128, top_k=8, d_expert=768,
                           n_head=32, n_kv_head=4, head_dim=128, vocab=4096)
        args.vram = [int(g * (1 << 30)) for g in args.vram_gib]
        args.ring, args.reserve, args.cache = None, 1 << 30, None
        args.device, args.tokens = None, args.tokens or 4096
        fmts = ExpertFormats("BF16", "BF16", "BF16")
        n_sms = torch.cuda.get_device_properties(0).multi_processor_count
        chunks = list(range(256, 32769, 256))
    mode = "SMOKE (CPU, simulated full card)" if smoke else "gpu"
    with tempfile.TemporaryDirectory() as tmp:
        pack = synth_pack(Path(tmp) / "slab.pack", shape, fmts, progress=not smoke)
        eng = build_engine(args, pack)
        g = torch.Generator().manual_seed(0)
        tokens = torch.randint(0, shape.vocab, (args.tokens,), generator=g)
        fill, cost = run_fill(args, eng, tokens)
    classes = [r for sweep in ("heuristic", "pinned-P")
               for r in run_classes(get_preset(args.shape), n_sms, chunks, sweep)]
    record(rec, "fill", fill, mode)
    record(rec, "cost", cost, mode)
    record(rec, "classes", [r | {"shape": args.shape, "n_sms": n_sms} for r in classes], mode)


def summary(long_rows: list[dict]) -> None:
    fill, cost, classes = (table(long_rows, p) for p in ("fill", "cost", "classes"))
    for r in fill:
        print(f"{r['run']:<45} {r['outcome']:<16} identical={r.get('logits_identical', '-')} "
              f"cache_intact={r.get('cache_intact', '-')}")
    for c in cost:
        print(f"{c['participant']}: slots lent off {c['slots_off']} on {c['slots_on']} "
              f"(+{c['extra_slots_on']}); need+high-water {c['slots_need_plus_hw']}; "
              f"chunk {c['chunk_off']}/{c['chunk_on']} ring {c['ring_off']}/{c['ring_on']}")
    for sweep in ("heuristic", "pinned-P"):
        rs = [r for r in classes if r["sweep"] == sweep]
        last = rs[-1]
        print(f"class sweep {sweep} over {len(rs)} launches: size classes "
              f"{last['slab_high_water'] / MiB:.1f} MiB vs exact sizes "
              f"{last['exact_high_water'] / MiB:.1f} MiB ({last['exact_buffers']:.0f} buffers)")


if __name__ == "__main__":
    sys.exit(main())
