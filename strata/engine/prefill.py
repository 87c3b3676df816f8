"""The streaming prefill engine: read a prompt through a pack whose experts do not fit in VRAM.

    engine = PrefillEngine(pack, EngineConfig(vram=12 << 30))
    result = engine.run(tokens)          # logits (if asked), the plan, PrefillStats

Once, at start: the pack's expert blobs go to host memory (pinned when possible), the dense
weights to the device, and the expert cache takes what the VRAM budget leaves (dense weights, the
KV of the longest prompt, a reserve) and fills round-robin over layers.

Per prompt: plan (chunk + ring, one byte budget: strata.memory.scan), borrow the loan from the
top of the cache, carve the ring and the chunk's buffers out of it, read the prompt chunk by chunk
(every layer computes its experts from cache slots and ring slots, copies overlapped with
compute: strata.engine.provider), then refill the borrowed slots. A prompt that fails — bad
input, an allocation that fails mid-prompt — fails alone: the copy lane is drained, the loan is
refilled, and the cache ends byte for byte as it started.

The expert GEMM's stream-k scratch comes from each participant's `ParticipantScratch`
(strata.engine.scratch): ordinary memory, or with the slab on (EngineConfig.slab, else
STRATA_MMQ_SLAB=1) the tail of that participant's loan, published after the carve and dropped
before the refill. Observers (strata.engine.observe) watch each prompt's plan, loans and result.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import torch
from tqdm import tqdm

from strata.engine.device import Lane
from strata.engine.host import HostExperts
from strata.engine.observe import EngineObserver
from strata.engine.provider import STAGE as MODE_STAGE
from strata.engine.provider import STREAM as MODE_STREAM
from strata.engine.provider import SplitProvider, StreamingProvider
from strata.engine.scratch import ParticipantScratch, slab_reserve
from strata.engine.stats import PrefillStats
from strata import config
from strata.errors import AllocationError, PlanError, StrataError
from strata.memory import (ACTIVATIONS, STAGE, ExpertCache, Loan, PromptLayout, plan_prefill,
                           resolve_ring, use_fused)
from strata.memory.layout import DECODE_BUF
from strata.memory.ring import ring_slot_count
from strata.memory.rig import RESERVE, participants
from strata.models.load import load_model, open_pack, resolve_device
from strata.models.moe import expert_ffn
from strata.units import fmt_bytes

log = logging.getLogger("strata")


@dataclass
class EngineConfig:
    """Everything a prefill run is configured by; the CLI fills it from its flags."""
    vram: int | list[int]              # bytes of VRAM per GPU (a list splits layers over GPUs)
    cache: int | None = None           # expert cache bytes (default: derived from vram)
    lend_cap: float = 0.9              # most of the cache a prompt may borrow
    scan: str = "auto"                 # auto | legacy
    scan_max: int = 32768              # --prefill auto:MAX
    chunk: int | None = None           # --chunk N: forced
    ring: int | None = None            # --ring N: like STRATA_PREFILL_RING=N
    pin: bool = True                   # pin host blobs (falls back to pageable if it fails)
    fused: bool | None = None          # None: STRATA_PF_FUSED, else non-native packs
    max_prompt: int = 32768            # KV reserved for prompts up to this many tokens
    reserve: int = RESERVE             # CUDA context, allocator slack, attention workspace
    device: str | None = None          # cuda when available
    devices: list[str] | None = None   # one per participant (default: cuda:0.. or cpu)
    layer_split: list[int] | None = None  # layers per participant (default: by VRAM)
    dtype: torch.dtype | None = None   # dense math: bf16 on CUDA, fp32 on the CPU
    ffn: str = "auto"                  # expert FFN: auto | kernel | decoded | torch | ref
    batch: int | None = None           # experts per streamed batch (default ring // 2)
    slab: bool | None = None           # scratch slab from the loan's tail; None: STRATA_MMQ_SLAB
    progress: bool = False


@dataclass
class PrefillResult:
    logits: torch.Tensor | None        # fp32 [T, V] ("all"), [1, V] ("last") or None
    plan: object                       # strata.memory.scan.Plan
    chunk: int                         # prefill_chunk: the chunk the prompt was read in
    ring: int | str                    # prefill_ring: the resolved ring (slots, or "STAGE")
    stats: PrefillStats = field(default_factory=PrefillStats)

    def info(self) -> dict:
        return {"prefill_chunk": self.chunk, "prefill_ring": self.ring}


@dataclass
class Part:
    """One participant: a device, the layers it holds, its expert cache and lanes."""
    name: str
    device: torch.device
    layers: range
    participant: object        # strata.memory.scan.Participant (its cache layout, lend cap)
    budget: object             # strata.memory.rig.GpuBudget
    cache: ExpertCache
    lane: Lane
    scratch: ParticipantScratch  # its stream-k fixup scratch (strata.engine.scratch)


class PrefillEngine:
    def __init__(self, pack, cfg: EngineConfig, *, host: HostExperts | None = None,
                 observers: list[EngineObserver] | None = None):
        """`host`: the pack's blobs already in (pinned) host memory — experiments that build
        several engines over one 32 GB pack pin it once. `observers`: watch each prompt's plan,
        loans and result (strata.engine.observe); `self.observers` may change between prompts."""
        self.cfg = cfg
        self.observers: list[EngineObserver] = list(observers or [])
        self.pack = pack = open_pack(pack)
        self.shape = pack.shape
        vram = list(cfg.vram) if isinstance(cfg.vram, (list, tuple)) else [cfg.vram]
        devices = [resolve_device(d) for d in (cfg.devices or _default_devices(cfg.device,
                                                                               len(vram)))]
        if len(devices) != len(vram):
            raise StrataError(f"{len(vram)} --vram budgets for {len(devices)} devices; give one "
                              f"--vram per GPU")
        self.device = devices[0]
        self.dtype = cfg.dtype or (torch.bfloat16 if self.device.type == "cuda" else torch.float32)
        self.layouts = [pl.layout for pl in pack.layers]
        self.blob_sizes = [pl.blob_size for pl in pack.layers]
        self.max_blob = pack.max_blob
        self.host = host or HostExperts(pack.experts, self.blob_sizes, pin=cfg.pin,
                                        progress=cfg.progress)
        self.pinned = self.host.pinned or self.device.type != "cuda"
        parts, budgets = participants(self.shape, self.blob_sizes, vram, cache=cfg.cache,
                                      lend_cap=cfg.lend_cap, reserve=cfg.reserve,
                                      kv_tokens=cfg.max_prompt, split=cfg.layer_split)
        self.parts: list[Part] = []
        for p, b, dev in zip(parts, budgets, devices):
            cache = ExpertCache(p.cache, self.host.source, dev)
            self.parts.append(Part(p.name, dev, b.layers, p, b, cache, Lane(dev),
                                   ParticipantScratch(p.name, dev, cache.buffer)))
        device_map = [part.device for part in self.parts for _ in part.layers]
        self.model = load_model(pack, device=self.device, dtype=self.dtype,
                                ffn=expert_ffn(cfg.ffn), device_map=device_map)
        spec = ACTIVATIONS.with_buffer(DECODE_BUF, "moe") if cfg.ffn in ("auto", "decoded") \
            else ACTIVATIONS
        self.layout = PromptLayout(self.shape, self.max_blob, spec=spec, batch=cfg.batch)
        self.fused = use_fused(pack.native, cfg.fused)

    # single-participant conveniences (tests, the CLI's summary)
    @property
    def cache(self) -> ExpertCache:
        return self.parts[0].cache

    @property
    def lane(self) -> Lane:
        return self.parts[0].lane

    # -- planning ----------------------------------------------------------------------------
    def plan(self):
        """The plan for a prompt (chunk and ring from the scan, or the forced chunk)."""
        return plan_prefill(self.layout, [p.participant for p in self.parts], scan=self.cfg.scan,
                            scan_max=self.cfg.scan_max, chunk=self.cfg.chunk, pinned=self.pinned,
                            fused=self.fused, native=self.pack.native, ring=self.cfg.ring)

    def _resolve(self, plan, n_tokens: int) -> tuple[int, int | str, int]:
        """(chunk, resolved ring, ring slots carved) for a prompt of n_tokens under `plan`."""
        chunk = min(plan.chunk, n_tokens)
        if chunk == plan.chunk or plan.rule == "legacy":   # legacy: the fixed ring, as planned
            ring = plan.ring
        else:  # a prompt shorter than the planned chunk: the ring its own chunk resolves to
            ring = resolve_ring(self.max_blob, self.shape, chunk, pinned=self.pinned,
                                fused=self.fused, native=self.pack.native, ring=self.cfg.ring)
            if ring != STAGE and plan.rule == "fallback":
                ring = min(int(ring), int(plan.ring)) if plan.ring != STAGE else ring
        return chunk, ring, ring_slot_count(ring, self.shape, chunk)

    # -- a prompt ----------------------------------------------------------------------------
    def run(self, tokens, *, logits: str = "all", fail_after_layers: int | None = None
            ) -> PrefillResult:
        """Read `tokens` (1-D ids). logits: "all" (fp32 [T, V]), "last" or "none".

        `fail_after_layers` injects an allocation failure after that many layer batches
        (tests of the failure path)."""
        if logits not in ("all", "last", "none"):
            raise StrataError(f"logits must be all, last or none, got {logits!r}")
        tokens = self.model.check_tokens(tokens)
        T = tokens.numel()
        if T > self.cfg.max_prompt:
            raise StrataError(f"the prompt has {T} tokens but this engine reserved KV for "
                              f"{self.cfg.max_prompt}; raise max_prompt (--max-prompt)")
        plan = self.plan()
        if not plan.fits:
            raise StrataError(f"the plan does not fit: {plan.short_of()}")
        chunk, ring, _ = self._resolve(plan, T)
        for o in self.observers:
            o.on_plan(plan, chunk, ring)
        # read per prompt: cfg.slab, else STRATA_MMQ_SLAB (a bad value: StrataError)
        slab = config.mmq_slab() if self.cfg.slab is None else self.cfg.slab
        stats = PrefillStats(tokens=T)
        out = None
        loans: list[Loan] = []
        try:
            mode = MODE_STAGE if ring == STAGE else MODE_STREAM
            providers = []
            for part, pp in zip(self.parts, plan.participants):
                # each participant carves its own ring (the fallback rule may size them apart)
                r = ring if len(self.parts) == 1 or plan.rule != "fallback" else pp.ring
                slots = ring_slot_count(r, self.shape, chunk)
                need = self.layout.bytes_needed(chunk, slots)
                loans.append(self._borrow(part, need, T, chunk, slab))
                for o in self.observers:
                    o.on_loan(part, need, loans[-1])
                carve = loans[-1].carve()
                bufs = self.layout.carve(carve, chunk, slots)
                if slab:  # the slab: scratch from this layout's tail (empty: ordinary memory)
                    part.scratch.publish(carve.tail())
                providers.append(StreamingProvider(
                    part.cache, self.host, self.layouts, bufs.ring, n_expert=self.shape.n_expert,
                    mode=mode, layers=part.layers, batch=self.cfg.batch, lane=part.lane,
                    scratch_alloc=part.scratch, buffers=bufs))
            provider = providers[0] if len(providers) == 1 else SplitProvider(providers)
            if fail_after_layers is not None:
                provider = _FailingProvider(provider, fail_after_layers)
            bar = (tqdm(total=T, desc="prefill", unit="tok", leave=False)
                   if self.cfg.progress else None)
            self._sync()
            t0 = time.perf_counter()
            try:
                out = self.model.prefill(tokens, provider, chunk=chunk, logits=logits,
                                         progress=(lambda n: bar.update(n - bar.n)) if bar else None)
                self._sync()
            except torch.cuda.OutOfMemoryError as e:
                raise AllocationError(f"a device allocation failed mid-prompt ({_first_line(e)}); "
                                      f"the request failed and the cache was refilled; try a "
                                      f"smaller --chunk or more --vram") from None
            finally:
                if bar is not None:
                    bar.close()
            stats.seconds = time.perf_counter() - t0
            for pr in providers:
                for c in pr.chunks:
                    c.settle()
                stats.chunks.extend(pr.chunks)
        finally:
            # Drain the copy lanes before the borrowed slots are rewritten, drop the scratch slab
            # (nothing may write into the tail once the slots refill), then refill them.
            self._sync()
            for part in self.parts:
                part.scratch.drop()
            for loan in loans:
                loan.refill()
            self._sync()
        result = PrefillResult(out, plan, chunk, ring, stats)
        for o in self.observers:
            o.on_result(result)
        return result

    def _borrow(self, part: Part, need: int, n_tokens: int, chunk: int, slab: bool) -> Loan:
        """The participant's loan: `need` bytes, plus with the slab on the size classes its
        stream-k launches will ask for (the slab's cost in lent slots; the plan's chunk and ring
        are unchanged). When the lend cap has no room for that, the loan is the plan's own and
        the slab serves what its tail holds (the rest comes from ordinary memory)."""
        extra = (slab_reserve(self.shape, n_tokens, chunk, part.device)
                 if slab and self.cfg.ffn == "kernel" else 0)
        if extra:
            try:
                return Loan(part.cache, need + extra, self.cfg.lend_cap)
            except PlanError:
                log.info("strata prefill mmq: %s has no room to lend %s more for the scratch "
                         "slab; it serves what the tail holds", part.name, fmt_bytes(extra))
        return Loan(part.cache, need, self.cfg.lend_cap)

    def _sync(self) -> None:
        for part in self.parts:
            part.lane.sync()


def _default_devices(device: str | None, n: int) -> list[str]:
    """n participants: cuda:0..n-1 when CUDA is there (and no device named), else the named
    device (or cpu) n times — two simulated participants on the CPU share its memory."""
    if device is None and torch.cuda.is_available():
        if n > torch.cuda.device_count():
            raise StrataError(f"{n} --vram budgets but only {torch.cuda.device_count()} GPUs are "
                              f"visible")
        return [f"cuda:{i}" for i in range(n)]
    return [device or "cpu"] * n


class _FailingProvider:
    """Wraps a provider and raises an allocation failure after n layer batches (tests)."""

    def __init__(self, inner, n: int):
        self.inner, self.left = inner, n
        self.n_layer = inner.n_layer

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def expert_batches(self, layer, topk_ids):
        for item in self.inner.expert_batches(layer, topk_ids):
            if self.left <= 0:
                raise AllocationError("injected allocation failure mid-prompt; the request "
                                      "failed and the cache was refilled")
            self.left -= 1
            yield item


def _first_line(e: BaseException) -> str:
    return str(e).splitlines()[0] if str(e) else type(e).__name__
