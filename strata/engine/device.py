"""One device's compute and copy lanes. On CUDA: the current stream computes, a side stream
copies host->device, and events order the two. On the CPU every call runs at once and the
events are None, so the engine's code path is the same."""
from __future__ import annotations

import time

import torch


class Lane:
    def __init__(self, device: torch.device):
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        if self.cuda:
            self.compute = torch.cuda.current_stream(self.device)
            self.copy = torch.cuda.Stream(self.device)
            self.land = None   # then()'s stream, made on its first use

    def event(self, stream=None):
        """A timing event recorded now on `stream` (compute by default); None on the CPU."""
        if not self.cuda:
            return None
        ev = torch.cuda.Event(enable_timing=True)
        ev.record(stream if stream is not None else self.compute)
        return ev

    def copy_into(self, dst: torch.Tensor, src: torch.Tensor, after=None):
        """dst <- src on the copy lane once `after` (an event) has fired; returns (start, done)."""
        if not self.cuda:
            t0 = time.perf_counter()
            dst.copy_(src)
            return t0, time.perf_counter()
        with torch.cuda.stream(self.copy):
            if after is not None:
                self.copy.wait_event(after)
            start = self.event(self.copy)
            dst.copy_(src, non_blocking=True)
            done = self.event(self.copy)
        return start, done

    def then(self, after, fn):
        """Run fn() once `after` (copy_into's done) has fired, on a stream of its own — device
        work on a landed copy, such as a relayout, that the copy lane does not wait for (its
        next copy starts meanwhile) — and return the event that marks its end. On the CPU fn
        runs at once and `after` comes back."""
        if not self.cuda:
            fn()
            return after
        if self.land is None:
            self.land = torch.cuda.Stream(self.device)
        with torch.cuda.stream(self.land):
            if after is not None:
                self.land.wait_event(after)
            fn()
            return self.event(self.land)

    def wait(self, ev):
        """Make compute wait for `ev`; returns the (before, after) events that bracket the stall."""
        if not self.cuda or ev is None:
            return None
        before = self.event()
        self.compute.wait_event(ev)
        return before, self.event()

    @staticmethod
    def elapsed(a, b) -> float:
        """Seconds between two marks (events after a sync, or perf_counter floats)."""
        if a is None or b is None:
            return 0.0
        if isinstance(a, float):
            return b - a
        return a.elapsed_time(b) / 1e3

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize(self.device)
