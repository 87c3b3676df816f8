"""What a prompt cost, chunk by chunk, and the figures it is judged by."""
from __future__ import annotations

from dataclasses import dataclass, field

from strata.engine.device import Lane


@dataclass
class ChunkStats:
    start: int
    tokens: int
    mode: str
    layers: list
    bytes_streamed: int = 0
    copies: int = 0            # blobs copied into the ring
    copy_ops: int = 0          # host-to-device copies issued (a run of adjacent blobs is one)
    routed: int = 0            # (layer, expert) pairs the chunk routed to
    cache_hits: int = 0        # of those, served from the expert cache
    hit_fraction: list[float] = field(default_factory=list)  # per layer: experts hit / E
    copy_marks: list = field(default_factory=list)   # (start, done) per copy
    wait_marks: list = field(default_factory=list)   # (before, after) per compute stall
    copy_s: float = 0.0
    wait_s: float = 0.0
    copy_span_s: float = 0.0   # first copy's start to the last copy's end (the copy lane's window)
    # (routed bool [L, E] on the device, cached bool [L, E] on the host): read in settle(), so
    # the chunk's routing never reaches the host while the prompt runs
    pending: tuple | None = None

    def settle(self) -> None:
        """Turn marks into seconds and the routing into counts (after the device has
        synchronized: nothing here waits on it)."""
        self.copy_s = sum(Lane.elapsed(a, b) for a, b in self.copy_marks)
        self.wait_s = sum(Lane.elapsed(a, b) for a, b in self.wait_marks)
        if self.copy_marks:
            self.copy_span_s = Lane.elapsed(self.copy_marks[0][0], self.copy_marks[-1][1])
        self.copy_marks, self.wait_marks = [], []
        if self.pending is not None:
            routed, cached = self.pending
            routed = routed.cpu()
            for layer in self.layers:
                r = routed[layer]
                self.hit_fraction.append(float(r.float().mean()))
                self.routed += int(r.sum())
                self.cache_hits += int((r & cached[layer]).sum())
            self.pending = None


@dataclass
class PrefillStats:
    tokens: int = 0
    seconds: float = 0.0
    chunks: list[ChunkStats] = field(default_factory=list)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def bytes_streamed(self) -> int:
        return sum(c.bytes_streamed for c in self.chunks)

    @property
    def copy_s(self) -> float:
        return sum(c.copy_s for c in self.chunks)

    @property
    def wait_s(self) -> float:
        return sum(c.wait_s for c in self.chunks)

    @property
    def h2d_gbps(self) -> float:
        """Achieved host->device rate while copying (bytes / time the copy lane was busy)."""
        return self.bytes_streamed / self.copy_s / 1e9 if self.copy_s > 0 else 0.0

    @property
    def copy_span_s(self) -> float:
        return sum(c.copy_span_s for c in self.chunks)

    @property
    def copy_window_gbps(self) -> float:
        """The copy engine's rate over its whole window (each chunk's first copy start to its
        last copy end): below h2d_gbps by the time the copy lane sat idle inside the window —
        the figure a pipeline that keeps the copy engine busy holds at the pinned rate."""
        span = self.copy_span_s
        return self.bytes_streamed / span / 1e9 if span > 0 else 0.0

    @property
    def cache_hits(self) -> int:
        return sum(c.cache_hits for c in self.chunks)

    @property
    def routed(self) -> int:
        return sum(c.routed for c in self.chunks)

    def to_dict(self) -> dict:
        return {"tokens": self.tokens, "seconds": self.seconds,
                "tokens_per_s": self.tokens_per_s, "bytes_streamed": self.bytes_streamed,
                "h2d_gbps": self.h2d_gbps, "copy_s": self.copy_s, "wait_s": self.wait_s,
                "copy_span_s": self.copy_span_s, "copy_window_gbps": self.copy_window_gbps,
                "cache_hits": self.cache_hits, "routed": self.routed,
                "chunks": [{"start": c.start, "tokens": c.tokens, "mode": c.mode,
                            "bytes_streamed": c.bytes_streamed, "copies": c.copies,
                            "copy_ops": c.copy_ops,
                            "cache_hits": c.cache_hits, "routed": c.routed,
                            "copy_s": c.copy_s, "wait_s": c.wait_s, "copy_span_s": c.copy_span_s,
                            "hit_fraction": c.hit_fraction} for c in self.chunks]}
