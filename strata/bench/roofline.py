"""The roofline of a streamed prefill: four measured rates and the bounds built from them.

Legend: T tokens of a chunk, P positions cached before it, L layers, D hidden, F expert width,
E experts, K top-k, S shared experts, H query heads, Hkv kv heads, hd head width.

The rates, measured on the machine the experiment runs on (NaN where it cannot measure them,
i.e. without CUDA; an unmeasured rate makes its part of the bound free):
- `h2d_rate`: bytes/s of pinned host->device copies one after another, blob by blob and as
  runs of a layer's consecutive blobs (the ring's two patterns of copies), the best pattern of
  the best of three rounds.
- `gemm_rate(shape, T)`: FLOP/s of the expert FFN's three GEMMs through torch._grouped_mm bf16,
  T·K rows routed uniformly over E experts (the ceiling the SPEC's table measures), timed on
  as many experts at those rows each as fit beside what the process holds (probe_experts).
- `sdpa_rate(shape, T)`: FLOP/s of causal flash attention (torch SDPA, bf16, GQA) over one
  T-token chunk at the model's head shape.
- `dense_rate(shape, T)`: FLOP/s of the dense layers' GEMMs (torch.mm bf16, T rows, each
  layer's `dense_gemms`), over every layer of the shape.
- `delta_rate(shape, T)`: FLOP/s of the chunked gated delta rule (the default launch, bf16
  activations: fla-core's kernels where it is installed) over one linear-attention layer's T
  tokens at the model's head shape; a model without linear layers measures none.
The four compute rates are timed settled: after SETTLE_S seconds of their op back to back, at
the clocks a read holds, not the first calls' boost (settled_seconds).

The bounds of one chunk, and of a prompt (the sum over its chunks):

    PCIe bound    = bytes streamed / H2D rate          (several GPUs: the slowest link)
    compute floor = experts + attention + linear + dense   (floor_parts, in seconds)
    roofline      = max(PCIe bound, compute floor)

The floor's parts, each the FLOPs strata.bench.flops counts for the architecture's own layers
at a measured rate:
    experts    expert FLOPs / GEMM rate (the routed experts of the MoE layers)
    attention  softmax attention FLOPs / attention rate: per query-key pair GQA 4·H·hd, MLA
               2·H·(hd + Hv); query i seeing P + i + 1 keys, at most the window on a
               sliding layer (GPT-OSS's even layers); none on a linear-attention layer
    linear     the chunked gated delta rule of the linear-attention layers (Qwen3-Next,
               Qwen3.5) / delta-rule rate (why that rate: floor_parts)
    dense      every layer's projections (GQA, gated GQA, MLA's, DeltaNet's), routers, shared
               experts and their gates, leading dense FFNs / dense rate
The attention, linear and dense parts are optional: the plain roofline leaves them out, so it
is the bound of the expert streaming alone; with attention it is tighter, and with attention
and dense (which brings linear) it is the full compute floor of the read (every GEMM and the
attention at its measured rate). Not counted: norms, RoPE, activations, routing's top-k,
biases, GPT-OSS's sink logits and the LM head (the experiments read with logits="none").
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence

import torch

from strata.bench.flops import (attention_flops, dense_flops, dense_gemms, dense_kinds,
                                expert_flops, linear_flops, routed_flops)
from strata.bench.timing import time_fn


# -- bounds (pure arithmetic) ----------------------------------------------------------------
def seconds_at(flops: float, rate: float) -> float:
    """flops / rate; 0 for an unmeasured (NaN) rate, so it does not bound anything."""
    return 0.0 if math.isnan(rate) else flops / rate


def pcie_bound(nbytes: float, h2d: float) -> float:
    """Seconds to stream `nbytes` at `h2d` bytes/s."""
    return nbytes / h2d


def bound_rate(*rates: float | None) -> float | None:
    """A read's bound in tokens/s: the slowest of its limits (the PCIe bound, the compute
    floor), each in tokens/s; None and 0 (unmeasured) bound nothing; None when none is known.
    bench's `bound_tokens_per_s` and `of_bound`, and the plots beside them, all take it here."""
    known = [r for r in rates if r is not None and r > 0 and not math.isnan(r)]
    return min(known) if known else None


FLOOR_PARTS = ("experts", "attention", "linear", "dense")


def floor_parts(shape, P: int, T: int, gemm: float | Rates, attn: float | None = None, *,
                dense: float | None = None, linear: float | None = None) -> dict[str, float]:
    """Seconds of each part of a chunk's compute floor (FLOOR_PARTS, the module docstring):
    its routed experts at `gemm` FLOP/s; with `attn`, its softmax attention at that rate; with
    `dense`, its dense GEMMs at that rate and its linear-attention layers' delta rule at
    `linear` (at `dense` where `linear` is not given). A part whose rate is not given, or not
    measured (NaN), is 0. `gemm` may be a Rates instead (and no other rate given): its rates
    at T, the full floor.

    Why the delta rule at its own measured rate (issue 38: "the DeltaNet layers priced at their
    own rate"), as attention is priced at SDPA's: the rule is a scan over T/64 chunks, each
    step's state depending on the last, parallel only over heads and value blocks (Qwen3.5:
    32 heads x 2 blocks of 64 on 132 SMs), so no kernel of the layer runs its products at a
    bf16 GEMM's rate. Priced at the dense rate instead (what the stricter `linear=dense`
    gives), Qwen3.5-35B-A3B's 6 linear layers of 8 at T 32768 cost 1.9 ms where the fastest
    kernels measured (fla-core's four) take 15.1 (profile_resident-qwen3.5-35b-a3b-Q4_K_M-L8-
    auto-NVIDIA_H100-35b7826): a floor no implementation of the scan is known to reach. The
    short conv and the layer's norms stay outside the floor, as norms do everywhere."""
    if hasattr(gemm, "gemm"):     # a Rates (or a stand-in with its methods)
        if attn is not None or dense is not None or linear is not None:
            raise TypeError("floor_parts: a Rates brings every rate; pass no attn, dense or "
                            "linear")
        r = gemm
        gemm, attn, dense = r.gemm(T), r.attn(T), r.dense(T)
        linear = r.linear(T) if hasattr(r, "linear") else None
    lin = dense if linear is None else linear
    return {"experts": seconds_at(expert_flops(shape, T), gemm),
            "attention": 0.0 if attn is None else seconds_at(attention_flops(shape, P, T), attn),
            "linear": 0.0 if dense is None or lin is None else
            seconds_at(linear_flops(shape, T), lin),
            "dense": 0.0 if dense is None else seconds_at(dense_flops(shape, T), dense)}


def compute_floor(shape, P: int, T: int, gemm: float, attn: float | None = None, *,
                  dense: float | None = None, linear: float | None = None) -> float:
    """Seconds of a chunk's compute at the measured rates: the sum of its floor_parts (experts;
    with `attn` attention; with `dense` the dense GEMMs and the linear layers, those at
    `linear` where given). Every rate: the full compute floor."""
    return sum(floor_parts(shape, P, T, gemm, attn, dense=dense, linear=linear).values())


class Rates:
    """The GEMM, attention, dense and delta-rule rates of one model shape, measured once per
    chunk size and kept (a prompt's chunks share a few sizes). `gemm` / `attn` / `dense` /
    `linear` seed known rates by T (tests, or a run that already measured them); the others are
    measured on first use (the delta rule's only for a shape with linear-attention layers)."""

    def __init__(self, shape, *, gemm: Mapping[int, float] | None = None,
                 attn: Mapping[int, float] | None = None,
                 dense: Mapping[int, float] | None = None,
                 linear: Mapping[int, float] | None = None,
                 measure_gemm: Callable | None = None, measure_attn: Callable | None = None,
                 measure_dense: Callable | None = None, measure_linear: Callable | None = None):
        self.shape = shape
        self._gemm, self._attn, self._dense = dict(gemm or {}), dict(attn or {}), dict(dense or {})
        self._linear = dict(linear or {})
        self._measure_gemm = measure_gemm or gemm_rate
        self._measure_attn = measure_attn or sdpa_rate
        self._measure_dense = measure_dense or dense_rate
        self._measure_linear = measure_linear or delta_rate

    def gemm(self, T: int) -> float:
        if T not in self._gemm:
            self._gemm[T] = self._measure_gemm(self.shape, T)
        return self._gemm[T]

    def attn(self, T: int) -> float:
        if T not in self._attn:
            self._attn[T] = self._measure_attn(self.shape, T)
        return self._attn[T]

    def dense(self, T: int) -> float:
        if T not in self._dense:
            self._dense[T] = self._measure_dense(self.shape, T)
        return self._dense[T]

    def linear(self, T: int) -> float:
        if getattr(self.shape, "linear", None) is None:
            return float("nan")          # no linear-attention layer: nothing to price
        if T not in self._linear:
            self._linear[T] = self._measure_linear(self.shape, T)
        return self._linear[T]

    def gemm_tflops(self) -> dict[int, float]:
        """The GEMM rates measured so far, TFLOP/s by T (recorded beside the figures)."""
        return self.tflops()["gemm"]

    def tflops(self) -> dict[str, dict[int, float]]:
        """Every rate measured so far, TFLOP/s by T, by kind (gemm, attn, dense; linear where
        the shape has linear-attention layers)."""
        kinds = [("gemm", self._gemm), ("attn", self._attn), ("dense", self._dense)]
        if self._linear:
            kinds.append(("linear", self._linear))
        return {kind: {T: round(r / 1e12, 1) for T, r in rates.items()} for kind, rates in kinds}


def _by_start(chunks: Sequence) -> dict[int, list]:
    """The chunk records by start position: several GPUs' records of one chunk share it."""
    by_start: dict[int, list] = {}
    for c in chunks:
        by_start.setdefault(c.start, []).append(c)
    return by_start


def _chunk_floor(shape, P: int, T: int, rates: Rates, attention: bool, dense: bool):
    linear = rates.linear(T) if dense and hasattr(rates, "linear") else None
    return floor_parts(shape, P, T, rates.gemm(T), rates.attn(T) if attention else None,
                       dense=rates.dense(T) if dense else None, linear=linear)


def roofline(chunks: Sequence, shape, h2d: float | Mapping[tuple, float], rates: Rates, *,
             attention: bool = False, dense: bool = False) -> float:
    """Seconds a prompt needs at the roofline (module docstring); `attention` / `dense` add
    those terms to each chunk's compute floor (both: the full floor).

    `chunks`: the run's ChunkStats (start, tokens, bytes_streamed, layers). With one GPU, `h2d`
    is its rate; with the layers split over GPUs, a mapping from a participant's layers (as a
    tuple) to its link's rate: the GPUs' records of one chunk (same start) copy in parallel, so
    the slowest bounds it, while every layer's compute runs one GPU after the other."""
    t = 0.0
    for P, parts in _by_start(chunks).items():
        T = parts[0].tokens
        t_copy = max(pcie_bound(c.bytes_streamed,
                                h2d[tuple(c.layers)] if isinstance(h2d, Mapping) else h2d)
                     for c in parts)
        t_comp = sum(_chunk_floor(shape, P, T, rates, attention, dense).values())
        t += max(t_copy, t_comp)
    return t


def floor_parts_of(chunks: Sequence, shape, rates: Rates, *, attention: bool = True,
                   dense: bool = True) -> dict[str, float]:
    """A prompt's compute floor by part (FLOOR_PARTS), in seconds: each chunk's floor_parts
    summed over the chunks (several GPUs' records of one chunk counted once, as roofline
    does); by default the full floor. Their sum is roofline(chunks, shape, math.inf, rates,
    attention=, dense=) with nothing streamed."""
    out = dict.fromkeys(FLOOR_PARTS, 0.0)
    for P, parts in _by_start(chunks).items():
        for k, v in _chunk_floor(shape, P, parts[0].tokens, rates, attention, dense).items():
            out[k] += v
    return out


def linear_at_dense(chunks: Sequence, shape, rates: Rates) -> float | None:
    """Seconds the linear layers' delta rule would cost at the dense GEMM rate over a prompt's
    chunks (the stricter price floor_parts' docstring weighs), beside the floor; None for a
    shape without linear-attention layers."""
    if getattr(shape, "linear", None) is None:
        return None
    return sum(seconds_at(linear_flops(shape, parts[0].tokens), rates.dense(parts[0].tokens))
               for parts in _by_start(chunks).values())


# -- the measured rates ------------------------------------------------------------------------
# The longest copy h2d_rate's run pattern makes: a layer's consecutive experts up to this many
# bytes as one copy. The engine's runs carry up to a pass of consecutive streamed experts (half
# the ring, ~250 MiB); copies of tens of MB already run at the link's rate (DeepSeek-V3's 28.6
# MB blobs one by one: 55.0 GB/s on an H100), and a buffer this size stages beside a read's
# loan on any card.
H2D_RUN_BYTES = 64 << 20


def h2d_rate(host, n: int = 96, device=None, rounds: int = 3) -> float:
    """Bytes/s the link carries from `host` (strata.engine.host.HostExperts) to `device`
    (default: cuda, else cpu): `n` pinned blobs copied back to back blob by blob, and about as
    many bytes copied as runs (a layer's consecutive experts, up to H2D_RUN_BYTES, one copy each:
    HostExperts.run, where the host holds a layer as one block), each pattern timed in each of
    `rounds` rounds; the best. Why the runs: the engine copies runs of adjacent blobs
    (STRATA_COPY_RUNS), and a small blob's copy pays a fixed cost (Qwen3.5-35B-A3B's 2 MB blobs:
    49.8 GB/s blob by blob, where its 8K read with a 780-slot ring moved 14.8 GB in 0.276 s, 53.8
    GB/s, 1.09 of a bound priced blob by blob; an H100 at ffed393). Why the best round: a round
    slowed by something else on the machine would set the bound below what the link carries and
    flatter the read's fraction of it (gpt-oss-120b's 32K row at 88803cc: 44.5 GB/s in its
    process, 53.7-54.1 in the others on the same H100, the read's tokens/s the same)."""
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    held = [l for l in range(host.n_layer) if host.layers[l].numel()]   # dense layers hold none
    E = host.layers[held[0]].shape[0]
    blobs = [host.blob(held[i % len(held)], (i * 7) % E) for i in range(n)]
    patterns = [blobs]
    runs = _runs(host, held, E, sum(b.numel() for b in blobs))
    if runs:
        patterns.append(runs)
    dst = torch.empty(max(b.numel() for p in patterns for b in p), dtype=torch.uint8,
                      device=dev)                                     # mixes: per-layer sizes

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
    for b in blobs[:4]:          # warm: the first copies pay for mapping and the lazy context
        dst[:b.numel()].copy_(b, non_blocking=True)
    sync()
    best = 0.0
    for _ in range(max(1, rounds)):
        for copies in patterns:
            t0 = time.perf_counter()
            for b in copies:
                dst[:b.numel()].copy_(b, non_blocking=True)
            sync()
            best = max(best, sum(b.numel() for b in copies) / (time.perf_counter() - t0))
    return best


def _runs(host, held: list[int], E: int, nbytes: int,
          run_bytes: int = H2D_RUN_BYTES) -> list[torch.Tensor] | None:
    """Runs of consecutive experts (at most `run_bytes`, at least one blob, a copy), the held
    layers in turn, until they add up to `nbytes`; None where the host cannot hand a run as one
    view (no HostExperts.run, or a layer not held as one block)."""
    run = getattr(host, "run", None)
    if run is None:
        return None
    out, total, i = [], 0, 0
    while total < nbytes:
        layer = held[i % len(held)]
        size = host.blob(layer, 0).numel()
        k = max(1, min(E, run_bytes // max(size, 1)))
        v = run(layer, (i * 7) % (E - k + 1), k)
        if v is None:
            return None
        out.append(v)
        total += v.numel()
        i += 1
    return out


# Seconds each rate's op runs back to back before it is timed. Timed in a burst (one untimed
# call, then 3-5), the H200 ran SDPA at 32K at 650-715 TFLOP/s, its first calls at ~680, then
# ~595 from the fourth call on; the grouped GEMM and dense GEMMs fell 2-20% the same way
# (benchmarks/results/floor-rates-nvidia-h200-7d195b6: burst vs settled, and the call-by-call
# series). A read runs its kernels back to back for a second or more, at the settled clocks, so
# a floor priced at burst rates is one no read can reach; the floor is priced settled.
SETTLE_S = 1.0


def settled_seconds(run, *, device, reps: int, settle_s: float = 0.0) -> float:
    """Median seconds of run() over `reps` timed repeats, after one untimed call and, with
    `settle_s` > 0, after running it back to back for settle_s seconds first: a rate measured
    in a burst of a few calls can run at clocks the GPU does not hold through a second-long
    read (benchmarks/floor_rates_bench.py measures both)."""
    if settle_s > 0:
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < settle_s:
            for _ in range(4):
                run()
            torch.cuda.synchronize(device)
    return time_fn(run, device=device, warmup=1, repeats=reps).median_s


PROBE_SHARE = 0.5   # of the memory the allocator can still give that gemm_rate's probe may take


def probe_experts(E: int, K: int, D: int, F: int, T: int, cap: float) -> tuple[int, int]:
    """(E', M'): the experts and rows gemm_rate times within `cap` bytes. The rate of a grouped
    GEMM follows its rows an expert (T·K / E), not E, so the probe keeps those and takes as
    many of the E experts as fit its bf16 operands and outputs (weights E'·3·D·F, x M'·D, h
    M'·F, gate/up out M'·2F, down out M'·D) in the cap: every expert where they fit (DeepSeek-V3
    at 32K needs ~31 GiB for all 256, more than a 24 GiB card holds beside its cache), at
    least one."""
    M = T * K

    def need(e: int) -> float:
        rows = -(-M * e // E)
        return 2.0 * (e * 3 * D * F + rows * (2 * D + 3 * F))
    e = E
    while e > 1 and need(e) > cap:
        e -= 1
    return e, -(-M * e // E)


def _probe_cap(dev: str) -> float:
    """PROBE_SHARE of what the allocator can still give on `dev`: the device's free bytes and
    what torch's cache holds unused."""
    free, _ = torch.cuda.mem_get_info(dev)
    unused = torch.cuda.memory_reserved(dev) - torch.cuda.memory_allocated(dev)
    return PROBE_SHARE * (free + unused)


def gemm_rate(shape, T: int, reps: int = 10, settle_s: float = SETTLE_S) -> float:
    """FLOP/s of the expert FFN's GEMMs (gate+up as one [D, 2F] GEMM, then down) through
    torch._grouped_mm bf16 over T·K rows routed uniformly to E experts, timed on as many of
    the experts at the same rows each as fit beside what the process holds (probe_experts);
    NaN without CUDA. `settle_s`: settled_seconds'."""
    if not (torch.cuda.is_available() and hasattr(torch, "_grouped_mm")):
        return float("nan")
    E, K, D, F = shape.n_expert, shape.top_k, shape.d_model, shape.d_expert
    dev = "cuda"
    E, M = probe_experts(E, K, D, F, T, _probe_cap(dev))
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
    return routed_flops(M, D, F) / settled_seconds(run, device=dev, reps=reps, settle_s=settle_s)


def sdpa_rate(shape, T: int, reps: int = 10, settle_s: float = SETTLE_S) -> float:
    """FLOP/s of causal flash attention (torch SDPA, bf16, GQA) over one T-token chunk at the
    model's head shape, counting 2·T²·H·hd FLOPs (QKᵀ and PV, half of them masked away);
    NaN without CUDA. `settle_s`: settled_seconds'."""
    if not torch.cuda.is_available():
        return float("nan")
    return sdpa_flops(shape, T) / settled_seconds(sdpa_call(shape, T), device="cuda", reps=reps,
                                                  settle_s=settle_s)


def sdpa_flops(shape, T: int) -> float:
    """sdpa_rate's count for one T-token chunk: 2·T²·H·hd."""
    return 2.0 * T * T * shape.n_head * shape.head_dim


def sdpa_call(shape, T: int):
    """A zero-argument call of the SDPA sdpa_rate times: causal, GQA, bf16 q [1, H, T, hd] and
    k, v [1, Hkv, T, hd], all contiguous, on CUDA."""
    H, Hkv, hd = shape.n_head, shape.n_kv_head, shape.head_dim
    q = torch.randn(1, H, T, hd, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, Hkv, T, hd, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)

    def run():
        torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    return run


def dense_rate(shape, T: int, reps: int = 10, settle_s: float = SETTLE_S) -> float:
    """FLOP/s of the dense layers' GEMMs (`dense_gemms`: torch.mm bf16 of T rows by each
    layer's weights) over every layer of the shape: one layer of each kind (dense_kinds: a MoE
    layer, a leading dense layer, a hybrid's linear and full layers) is timed, counted as often
    as the shape has such layers; NaN without CUDA."""
    if not torch.cuda.is_available():
        return float("nan")
    kinds = dense_kinds(shape)
    dev, seconds = "cuda", 0.0
    for layer, count in kinds:
        gemms = dense_gemms(shape, layer)
        xs = {i: torch.randn(T, i, device=dev, dtype=torch.bfloat16) for i, _ in gemms}
        ws = [torch.randn(i, o, device=dev, dtype=torch.bfloat16) * 0.02 for i, o in gemms]

        def run(gemms=gemms, xs=xs, ws=ws):
            for (i, _), w in zip(gemms, ws):
                torch.mm(xs[i], w)
        seconds += count * settled_seconds(run, device=dev, reps=reps, settle_s=settle_s)
    return dense_flops(shape, T) / seconds


def delta_rate(shape, T: int, reps: int = 10, settle_s: float = SETTLE_S) -> float:
    """FLOP/s of the chunked gated delta rule (strata.kernels.deltanet.chunk under the default
    launch, whatever a caller pinned: fla-core's kernels for bf16 where installed, else
    strata's, so a read pinned to a slower launch is measured against the faster one) over one
    linear-attention layer's T tokens, counting linear_flops of one layer: bf16 q, k [T, Hk, dk]
    and v [T, Hv, dv], fp32 gates g <= 0 and beta in (0, 1), an fp32 state carried in and out,
    q/k L2-normed in the kernel, as the model calls it; NaN without CUDA or linear layers."""
    lin = getattr(shape, "linear", None)
    if lin is None or not torch.cuda.is_available():
        return float("nan")
    from strata.kernels.deltanet.chunk import chunk_gated_delta_rule
    from strata.kernels.deltanet.launch import DEFAULT, pin_delta_launch
    Hk, Hv, dk, dv = lin.n_k_head, lin.n_v_head, lin.k_head_dim, lin.v_head_dim
    dev, bf = "cuda", torch.bfloat16
    q, k = (torch.randn(T, Hk, dk, device=dev, dtype=bf) for _ in range(2))
    v = torch.randn(T, Hv, dv, device=dev, dtype=bf)
    g = -torch.rand(T, Hv, device=dev) * 0.5
    beta = torch.rand(T, Hv, device=dev)
    S = torch.zeros(Hv, dk, dv, device=dev)

    def run():
        chunk_gated_delta_rule(q, k, v, g, beta, S, use_qk_l2norm=True, out_state=S)
    with pin_delta_launch(DEFAULT):
        secs = settled_seconds(run, device=dev, reps=reps, settle_s=settle_s)
    return linear_flops(shape, T, layers=1) / secs


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
