"""The roofline of a streamed prefill: three measured rates and the bounds built from them.

Legend: T tokens of a chunk, P positions cached before it, L layers, D hidden, F expert width,
K top-k, H query heads, hd head width.

The rates, measured on the machine the experiment runs on (NaN where it cannot measure them,
i.e. without CUDA; an unmeasured rate makes its part of the bound free):
- `h2d_rate`: bytes/s of blob-sized pinned host->device copies one after another (the ring's
  pattern of copies).
- `gemm_rate(shape, T)`: FLOP/s of the expert FFN's three GEMMs through torch._grouped_mm bf16,
  T·K rows routed uniformly over E experts (the ceiling the SPEC's table measures).
- `sdpa_rate(shape, T)`: FLOP/s of causal flash attention (torch SDPA, bf16, GQA) over one
  T-token chunk at the model's head shape.

The bounds of one chunk, and of a prompt (the sum over its chunks):

    PCIe bound    = bytes streamed / H2D rate          (several GPUs: the slowest link)
    compute floor = expert FLOPs / GEMM rate  [+ attention FLOPs / attention rate]
    roofline      = max(PCIe bound, compute floor)

expert FLOPs = 2·T·K·3·D·F per layer (gate, up and down), over every layer; attention FLOPs =
4·H·hd per query-key pair (QKᵀ and PV) over every layer, query i of the chunk seeing P + i + 1
keys. The attention term is optional: the plain roofline leaves attention and the dense layers
out, so it is the bound of the expert streaming alone; with attention it is a tighter bound.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence

import torch

from strata.bench.timing import time_fn


# -- FLOP counts and bounds (pure arithmetic) --------------------------------------------------
def expert_flops(shape, T: int, layers: int | None = None) -> float:
    """FLOPs of the routed experts' three GEMMs for T tokens: 2·T·K·3·D·F per layer, over
    `layers` layers (default: every layer of the shape)."""
    L = shape.n_layer if layers is None else layers
    return 2.0 * T * shape.top_k * 3 * shape.d_model * shape.d_expert * L


def attention_flops(shape, P: int, T: int, layers: int | None = None) -> float:
    """Causal attention FLOPs of a T-token chunk after P cached positions: query i sees
    P + i + 1 keys, 4·H·hd FLOPs per query-key pair, over `layers` layers (default: all)."""
    L = shape.n_layer if layers is None else layers
    return 4.0 * shape.n_head * shape.head_dim * (T * P + T * (T + 1) / 2) * L


def seconds_at(flops: float, rate: float) -> float:
    """flops / rate; 0 for an unmeasured (NaN) rate, so it does not bound anything."""
    return 0.0 if math.isnan(rate) else flops / rate


def pcie_bound(nbytes: float, h2d: float) -> float:
    """Seconds to stream `nbytes` at `h2d` bytes/s."""
    return nbytes / h2d


def compute_floor(shape, P: int, T: int, gemm: float, attn: float | None = None) -> float:
    """Seconds of a chunk's compute at the measured rates: its experts at `gemm` FLOP/s, plus
    with `attn` its causal attention at that rate."""
    t = seconds_at(expert_flops(shape, T), gemm)
    if attn is not None:
        t += seconds_at(attention_flops(shape, P, T), attn)
    return t


class Rates:
    """The GEMM and attention rates of one model shape, measured once per chunk size and kept
    (a prompt's chunks share a few sizes). `gemm` / `attn` seed known rates by T (tests, or a
    run that already measured them); the others are measured on first use."""

    def __init__(self, shape, *, gemm: Mapping[int, float] | None = None,
                 attn: Mapping[int, float] | None = None,
                 measure_gemm: Callable | None = None, measure_attn: Callable | None = None):
        self.shape = shape
        self._gemm, self._attn = dict(gemm or {}), dict(attn or {})
        self._measure_gemm = measure_gemm or gemm_rate
        self._measure_attn = measure_attn or sdpa_rate

    def gemm(self, T: int) -> float:
        if T not in self._gemm:
            self._gemm[T] = self._measure_gemm(self.shape, T)
        return self._gemm[T]

    def attn(self, T: int) -> float:
        if T not in self._attn:
            self._attn[T] = self._measure_attn(self.shape, T)
        return self._attn[T]

    def gemm_tflops(self) -> dict[int, float]:
        """The GEMM rates measured so far, TFLOP/s by T (recorded beside the figures)."""
        return {T: round(r / 1e12, 1) for T, r in self._gemm.items()}


def roofline(chunks: Sequence, shape, h2d: float | Mapping[tuple, float], rates: Rates, *,
             attention: bool = False) -> float:
    """Seconds a prompt needs at the roofline (module docstring).

    `chunks`: the run's ChunkStats (start, tokens, bytes_streamed, layers). With one GPU, `h2d`
    is its rate; with the layers split over GPUs, a mapping from a participant's layers (as a
    tuple) to its link's rate: the GPUs' records of one chunk (same start) copy in parallel, so
    the slowest bounds it, while every layer's compute runs one GPU after the other."""
    by_start: dict[int, list] = {}
    for c in chunks:
        by_start.setdefault(c.start, []).append(c)
    t = 0.0
    for P, parts in by_start.items():
        T = parts[0].tokens
        t_copy = max(pcie_bound(c.bytes_streamed,
                                h2d[tuple(c.layers)] if isinstance(h2d, Mapping) else h2d)
                     for c in parts)
        t_comp = compute_floor(shape, P, T, rates.gemm(T), rates.attn(T) if attention else None)
        t += max(t_copy, t_comp)
    return t


# -- the measured rates ------------------------------------------------------------------------
def h2d_rate(host, n: int = 96, device=None) -> float:
    """Bytes/s of `n` blob-sized pinned host->device copies back to back (the ring's pattern),
    from `host` (strata.engine.host.HostExperts) to `device` (default: cuda, else cpu)."""
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    held = [l for l in range(host.n_layer) if host.layers[l].numel()]   # dense layers hold none
    E = host.layers[held[0]].shape[0]
    blobs = [host.blob(held[i % len(held)], (i * 7) % E) for i in range(n)]
    dst = torch.empty(max(b.numel() for b in blobs), dtype=torch.uint8, device=dev)  # mixes: per-layer sizes

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
    for b in blobs[:4]:          # warm: the first copies pay for mapping and the lazy context
        dst[:b.numel()].copy_(b, non_blocking=True)
    sync()
    t0 = time.perf_counter()
    for b in blobs:
        dst[:b.numel()].copy_(b, non_blocking=True)
    sync()
    return sum(b.numel() for b in blobs) / (time.perf_counter() - t0)


def gemm_rate(shape, T: int, reps: int = 5) -> float:
    """FLOP/s of the expert FFN's GEMMs (gate+up as one [D, 2F] GEMM, then down) through
    torch._grouped_mm bf16 over T·K rows routed uniformly to E experts; NaN without CUDA."""
    if not (torch.cuda.is_available() and hasattr(torch, "_grouped_mm")):
        return float("nan")
    E, K, D, F = shape.n_expert, shape.top_k, shape.d_model, shape.d_expert
    dev = "cuda"
    M = T * K
    counts = torch.full((E,), M // E, dtype=torch.int32)
    counts[: M % E] += 1
    offs = torch.cumsum(counts, 0).to(torch.int32).to(dev)
    x = torch.randn(M, D, device=dev, dtype=torch.bfloat16)
    wgu = torch.randn(E, D, 2 * F, device=dev, dtype=torch.bfloat16) * 0.02
    wd = torch.randn(E, F, D, device=dev, dtype=torch.bfloat16) * 0.02
    h = torch.randn(M, F, device=dev, dtype=torch.bfloat16)

    def run():
        torch._grouped_mm(x, wgu, offs=offs)
        torch._grouped_mm(h, wd, offs=offs)
    return expert_flops(shape, T, layers=1) / time_fn(run, device=dev, warmup=1,
                                                        repeats=reps).median_s


def sdpa_rate(shape, T: int, reps: int = 3) -> float:
    """FLOP/s of causal flash attention (torch SDPA, bf16, GQA) over one T-token chunk at the
    model's head shape, counting 2·T²·H·hd FLOPs (QKᵀ and PV, half of them masked away);
    NaN without CUDA."""
    if not torch.cuda.is_available():
        return float("nan")
    H, Hkv, hd = shape.n_head, shape.n_kv_head, shape.head_dim
    q = torch.randn(1, H, T, hd, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, Hkv, T, hd, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)

    def run():
        torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    return 2 * T * T * H * hd / time_fn(run, device="cuda", warmup=1, repeats=reps).median_s


def record_streamed(rec, res, T: int, shape, h2d: float, rates: Rates, **config) -> float | None:
    """A streamed read's figures, each beside its bound, into `rec` (the rows formats_ab and
    arch_ab share): tokens_per_s against the PCIe bound (bytes streamed / the pinned H2D rate
    `h2d` measured in the same run), roofline_tokens_per_s (max(H2D, grouped_mm) per chunk),
    bytes_streamed, h2d_gbps, wait_s. `res` a PrefillResult of T tokens; `config` the rows'
    config (chunk and ring are added). Returns the PCIe bound in tokens/s (None: nothing
    streamed)."""
    from strata.bench.timing import WALL_TIMER
    st = res.stats
    pcie_s = st.bytes_streamed / h2d
    pcie_tps = T / pcie_s if pcie_s else None
    roof = roofline(st.chunks, shape, h2d, rates)
    common = dict(config, chunk=res.chunk, ring=res.ring)
    rec.add("tokens_per_s", st.tokens_per_s, "tok/s", timer=WALL_TIMER,
            bound="PCIe: bytes streamed / pinned H2D measured", bound_value=pcie_tps, **common)
    rec.add("roofline_tokens_per_s", T / roof if roof else "", "tok/s",
            bound="max(H2D, grouped_mm) per chunk", **common)
    rec.add("bytes_streamed", st.bytes_streamed, "bytes", **common)
    rec.add("h2d_gbps", st.h2d_gbps, "GB/s", bound="pinned H2D blob by blob",
            bound_value=h2d / 1e9, **common)
    rec.add("wait_s", st.wait_s, "s", **common)
    return pcie_tps
