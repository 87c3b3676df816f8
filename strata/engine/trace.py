"""The lanes' timeline of a streamed prompt: a Chrome / Perfetto trace and a PNG of one chunk.

    trace = LaneTrace()
    engine.observers.append(trace)
    engine.run(tokens)
    trace.write(Path("out.json"))        # open in ui.perfetto.dev or chrome://tracing
    trace.plot_chunk(Path("out.png"))    # one chunk: copy and compute bars per layer, waits marked

An EngineObserver (strata.engine.observe): every copy, pass, layer and wait of every participant
becomes a complete ("X") event: pid = the participant, tid = its lane ("copy", "compute",
"passes", "waits"); a counter track "copies queued ahead" shows, at each pass, how many copies
beyond the pass's own the copy lane already held (strata.engine.provider: one pass ahead, the
next queued behind it), and the PNG draws it as a step line over the lanes. Times are CUDA event times (resolved in on_result, once the device has
synchronized) relative to an event recorded when the participant's loan was taken, placed on the
host's perf_counter axis at that moment so several prompts line up one after another; on the CPU
they are perf_counter times, and the trace's metadata says which clock ("cuda-events" or
"perf_counter"). A failed prompt leaves no events (its marks are dropped at the next plan).
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from strata.engine.device import Lane
from strata.engine.observe import EngineObserver


@dataclass
class Span:
    lane: str          # copy | compute | passes | waits
    name: str
    start: float       # seconds from the trace's origin
    dur: float
    part: str
    chunk: int
    layer: int
    args: dict = field(default_factory=dict)


class LaneTrace(EngineObserver):
    def __init__(self, label: str = ""):
        self.label = label
        self.spans: list[Span] = []
        self.clock = "perf_counter"
        self.origin = time.perf_counter()
        self.prompts = 0
        self._reset()

    def _reset(self):
        self._raw: list[tuple] = []         # (kind, part, chunk, layer, a, b, args)
        self._ref: dict[str, tuple] = {}    # part -> (mark, host seconds at the mark)
        self._chunk: dict[str, int] = {}

    # -- observer hooks ------------------------------------------------------------------------
    def on_plan(self, plan, chunk, ring) -> None:
        self._reset()
        self.plan = {"chunk": chunk, "ring": ring}

    def on_loan(self, part, need, loan) -> None:
        lane = part.lane
        if lane.cuda:
            self.clock = "cuda-events"
            self._ref[part.name] = (lane.event(), time.perf_counter())
        else:
            t = time.perf_counter()
            self._ref[part.name] = (t, t)

    def on_chunk(self, part, start, n_tokens, mark) -> None:
        self._chunk[part] = self._chunk.get(part, -1) + 1
        self._raw.append(("chunk", part, self._chunk[part], -1, mark, mark,
                          {"start": start, "tokens": n_tokens}))

    def on_layer(self, part, layer, begin, end) -> None:
        self._raw.append(("compute", part, self._chunk.get(part, 0), layer, begin, end, {}))

    def on_copy(self, part, layer, expert, nbytes, start, done, count: int = 1) -> None:
        self._raw.append(("copy", part, self._chunk.get(part, 0), layer, start, done,
                          {"expert": expert, "bytes": nbytes, "blobs": count}))

    def on_pass(self, part, layer, index, begin, end, wait, ahead: int = 0) -> None:
        c = self._chunk.get(part, 0)
        self._raw.append(("passes", part, c, layer, begin, end, {"pass": index, "ahead": ahead}))
        if wait is not None:
            self._raw.append(("waits", part, c, layer, wait[0], wait[1], {"pass": index}))

    def on_read(self, part, begin, end) -> None:
        self._raw.append(("read", part, -1, -1, begin, end, {}))

    def on_result(self, result) -> None:
        """The device has synchronized: every mark can be read."""
        for kind, part, chunk, layer, a, b, args in self._raw:
            ref, host = self._ref.get(part, (None, self.origin))
            if isinstance(a, float) or a is None:
                t0 = (a if a is not None else host) - self.origin
                dur = (b - a) if isinstance(b, float) and a is not None else 0.0
            else:
                t0 = host - self.origin + Lane.elapsed(ref, a)
                dur = Lane.elapsed(a, b)
            e0, nb = args.get("expert"), args.get("blobs", 1)
            name = {"copy": f"copy L{layer} e{e0}" + (f"-{e0 + nb - 1}" if nb > 1 else ""),
                    "compute": f"layer {layer}", "passes": f"L{layer} pass {args.get('pass')}",
                    "waits": f"wait L{layer}", "chunk": f"chunk {chunk}",
                    "read": "read"}[kind]
            self.spans.append(Span(kind, name, t0, max(dur, 0.0), part, chunk, layer,
                                   dict(args, prompt=self.prompts)))
        self.prompts += 1
        self._reset()

    # -- outputs -------------------------------------------------------------------------------
    def chrome(self) -> dict:
        """The trace as Chrome's JSON object format (µs)."""
        tids = {"chunk": 0, "copy": 1, "compute": 2, "passes": 3, "waits": 4, "read": 5}
        pids = {p: i for i, p in enumerate(sorted({s.part for s in self.spans}))}
        ev = []
        for p, i in pids.items():
            ev.append({"ph": "M", "name": "process_name", "pid": i, "args": {"name": p}})
            for lane, t in tids.items():
                ev.append({"ph": "M", "name": "thread_name", "pid": i, "tid": t,
                           "args": {"name": lane}})
        for s in self.spans:
            if s.lane == "passes":   # how far the copy lane ran ahead when this pass was enqueued
                ev.append({"name": "copies queued ahead", "ph": "C", "ts": s.start * 1e6,
                           "pid": pids[s.part], "args": {"copies": s.args.get("ahead", 0)}})
            e = {"name": s.name, "cat": s.lane, "ph": "X" if s.lane != "chunk" else "i",
                 "ts": s.start * 1e6, "pid": pids[s.part], "tid": tids[s.lane],
                 "args": dict(s.args, layer=s.layer, chunk=s.chunk)}
            if s.lane != "chunk":
                e["dur"] = s.dur * 1e6
            else:
                e["s"] = "t"
            ev.append(e)
        return {"traceEvents": ev, "displayTimeUnit": "ms",
                "metadata": {"clock": self.clock, "label": self.label, "prompts": self.prompts}}

    def write(self, path: Path) -> Path:
        from strata.atomic import atomic_write
        path = Path(path)
        with atomic_write(path) as tmp:
            Path(tmp).write_text(json.dumps(self.chrome()))
        return path

    def chunk_spans(self, chunk: int = 0, prompt: int | None = None, part: str | None = None):
        """The spans of one chunk (default: the first chunk of the last prompt, first part)."""
        prompt = self.prompts - 1 if prompt is None else prompt
        parts = sorted({s.part for s in self.spans})
        part = part or (parts[0] if parts else None)
        return [s for s in self.spans if s.chunk == chunk and s.part == part
                and s.args.get("prompt") == prompt and s.lane not in ("chunk", "read")]

    def read_summary(self, part: str | None = None) -> list[dict]:
        """Per prompt of one participant (default the first): the timed read's seconds, the
        span of its lanes' own events (first copy or compute to the last), what lies before
        (head_s) and after (tail_s) them inside the read, and the seconds the copy lane was
        busy: where a read's time goes that no lane accounts for."""
        parts = sorted({s.part for s in self.spans})
        part = part or (parts[0] if parts else None)
        out = []
        for p in range(self.prompts):
            mine = [s for s in self.spans if s.part == part and s.args.get("prompt") == p]
            read = [s for s in mine if s.lane == "read"]
            lanes = [s for s in mine if s.lane in ("copy", "compute", "passes", "waits")]
            if not read or not lanes:
                continue
            r = read[0]
            a = min(s.start for s in lanes)
            b = max(s.start + s.dur for s in lanes)
            out.append({"prompt": p, "read_s": r.dur, "lanes_s": b - a,
                        "head_s": a - r.start, "tail_s": r.start + r.dur - b,
                        "copy_busy_s": sum(s.dur for s in lanes if s.lane == "copy")})
        return out

    def plot_chunk(self, path: Path, chunk: int = 0, prompt: int | None = None) -> Path | None:
        """A PNG of one chunk's lanes: copy bars and compute bars (passes darker) against time,
        the layers labelled along the x axis where each layer's compute starts, waits in red.
        None when there is nothing to draw or matplotlib is missing."""
        spans = self.chunk_spans(chunk, prompt)
        if not spans:
            return None
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            return None
        t0 = min(s.start for s in spans)
        rows = {"copy": 2, "compute": 1, "passes": 1, "waits": 0}
        colors = {"copy": "tab:blue", "compute": "tab:gray", "passes": "tab:green",
                  "waits": "tab:red"}
        fig, ax = plt.subplots(figsize=(14, 3.2))
        for lane in ("compute", "passes", "copy", "waits"):
            bars = [((s.start - t0) * 1e3, max(s.dur * 1e3, 1e-4)) for s in spans
                    if s.lane == lane]
            if bars:
                h = 0.4 if lane == "passes" else 0.8
                ax.broken_barh(bars, (rows[lane] - h / 2, h), facecolors=colors[lane],
                               edgecolor="none", label=lane)
        ahead = sorted(((s.start - t0) * 1e3, s.args.get("ahead", 0)) for s in spans
                       if s.lane == "passes")
        if ahead:   # copies queued beyond each pass when it was enqueued (right axis)
            ax2 = ax.twinx()
            ax2.step([a for a, _ in ahead], [n for _, n in ahead], where="post",
                     color="tab:purple", lw=0.8, label="copies queued ahead")
            ax2.set_ylabel("copies queued ahead", fontsize=7, color="tab:purple")
            ax2.set_ylim(bottom=0)
            ax2.tick_params(labelsize=7)
        layers = sorted((s.start, s.layer) for s in spans if s.lane == "compute")
        for x, _ in layers:
            ax.axvline((x - t0) * 1e3, color="k", lw=0.3, alpha=0.4)
        sec = ax.secondary_xaxis("top")
        step = max(1, len(layers) // 24)
        sec.set_xticks([(x - t0) * 1e3 for x, _ in layers[::step]])
        sec.set_xticklabels([str(l) for _, l in layers[::step]], fontsize=7)
        sec.set_xlabel("layer (where its compute starts)")
        ax.set_yticks([0, 1, 2])
        ax.set_yticklabels(["waits", "compute", "copy"])
        ax.set_xlabel(f"ms ({self.clock})")
        ax.set_title(f"{self.label} chunk {chunk}: copy lane vs compute lane".strip())
        ax.legend(loc="lower right", fontsize=7, ncol=4)
        fig.tight_layout()
        path = Path(path)
        fig.savefig(path, dpi=110)
        plt.close(fig)
        return path
