"""The streaming prefill engine: read a prompt through a pack whose experts do not fit in VRAM.

    engine = PrefillEngine(pack, EngineConfig(vram=12 << 30))
    result = engine.run(tokens)          # logits (if asked), the plan, PrefillStats

Once, at start: the pack's expert blobs go to host memory (pinned when possible), the dense
weights to the device, and the expert cache takes what the VRAM budget leaves (dense weights, the
KV of the longest prompt, a reserve) and fills round-robin over layers.

Per prompt: plan (chunk + ring, one byte budget: strata.memory.scan, for this prompt's length),
borrow the loan the plan names from the top of the cache, carve the ring and the chunk's buffers
out of it exactly as the plan laid them out (strata.engine.session: every size read off the plan,
none derived again; `PrefillResult.memory` records what was borrowed and carved), read the prompt
chunk by chunk (every layer computes its experts from cache slots and ring slots, copies overlapped with
compute: strata.engine.provider), then refill the borrowed slots. A prompt that fails — bad
input, an allocation that fails mid-prompt — fails alone: the copy lane is drained, the loan is
refilled, and the cache ends byte for byte as it started.

The expert GEMM's stream-k scratch comes from each participant's `ParticipantScratch`
(strata.engine.scratch): ordinary memory, or with the slab on (EngineConfig.slab, else
STRATA_MMQ_SLAB=1) the tail of that participant's loan, published after the carve and dropped
before the refill. Observers (strata.engine.observe) watch each prompt's plan, loans and result.
The STRATA_* ring and slab knobs are read as one RingPolicy (engine_policy) when a prompt starts,
or a plan is made without one, and go down to strata.memory as an argument.
"""
from __future__ import annotations

import gc
import logging
import time
from dataclasses import dataclass, field, replace

import torch
from tqdm import tqdm

from strata.budget import (check_kv_host, check_machine, check_room, cpu_cache_cap,
                           host_available)
from strata.config import gc_pause
from strata.engine.device import Lane
from strata.engine.finite import FiniteGuard
from strata.engine.host import HostExperts
from strata.engine.observe import EngineObserver
from strata.engine.provider import SplitProvider
from strata.engine.scratch import ParticipantScratch
from strata.engine.session import Borrowed, close_shares, open_share
from strata.engine.stats import PrefillStats
from strata.engine.variants import KernelLaunches
from strata.engine.warm import LayerSubset, ProbePlan, WarmKV, dry_tokens, warm_layers
from strata import config
from strata.errors import AllocationError, StrataError
from strata.kernels.attention.kv_int8 import resolve_kv
from strata.memory import ExpertCache, Loan, PromptLayout, RingPolicy, plan_prefill, use_fused
from strata.memory.rig import RESERVE, participants
from strata.models.kv import PromptKV, kv_windows
from strata.engine.load import load_model, open_pack, resolve_device
from strata.models.moe import expert_ffn, plane_landing
from strata.planning import KVPolicy, layout_spec, model_sizes, scratch_reserve
from strata.units import fmt_bytes

log = logging.getLogger("strata")


@dataclass
class EngineConfig:
    """Everything a prefill run is configured by; the CLI fills it from its flags."""
    vram: int | list[int]              # bytes of VRAM per GPU (several split layers over GPUs);
                                       # held as a list, one per participant (__post_init__)
    cache: int | None = None           # expert cache bytes (default: derived from vram)
    lend_cap: float = 0.9              # most of the cache a prompt may borrow
    scan: str = "auto"                 # auto | legacy
    scan_max: int = 32768              # --prefill auto:MAX
    chunk: int | None = None           # --chunk N: forced
    ring: int | None = None            # --ring N: like STRATA_PREFILL_RING=N
    pin: bool = True                   # pin host blobs (falls back to pageable if it fails)
    fused: bool | None = None          # None: STRATA_PF_FUSED, else non-native packs
    max_prompt: int = 32768            # KV reserved for prompts up to this many tokens
    kv: str = "auto"                   # KV dtype: auto (the dense dtype's: fp32 on the CPU, bf16
                                       # on CUDA) | bf16 | fp32 | int8 (codes + fp32 scale per
                                       # token-head); every path of a run stores this one
    kv_resident: int | None = None     # tokens of KV per layer in VRAM (None: all); the rest host
    reserve: int = RESERVE             # CUDA context, allocator slack, attention workspace
    device: str | None = None          # cuda when available
    devices: list[str] | None = None   # one per participant (default: cuda:0.. or cpu)
    layer_split: list[int] | None = None  # layers per participant (default: by VRAM)
    dtype: torch.dtype | None = None   # dense math: bf16 on CUDA, fp32 on the CPU
    ffn: str = "auto"                  # expert FFN: auto | kernel | decoded | plane | torch | ref
    batch: int | None = None           # experts per streamed batch (default ring // 2)
    slab: bool | None = None           # scratch slab from the loan's tail; None: STRATA_MMQ_SLAB
    progress: bool = False

    def __post_init__(self):
        # one VRAM budget or one per participant, held as a list once, read as one everywhere
        self.vram = list(self.vram) if isinstance(self.vram, (list, tuple)) else [self.vram]


@dataclass
class PrefillResult:
    logits: torch.Tensor | None        # fp32 [T, V] ("all"), [1, V] ("last") or None
    plan: object                       # strata.memory.scan.Plan
    chunk: int                         # prefill_chunk: the chunk the prompt was read in
    ring: int | str                    # prefill_ring: the resolved ring (slots, or "STAGE")
    stats: PrefillStats = field(default_factory=PrefillStats)
    memory: list["Borrowed"] = field(default_factory=list)  # per participant: what it took
    kv_streamed: int = 0               # bytes of host-held KV copied back for the attention
    kv: str = ""                       # the KV dtype every layer kept (--kv, resolved)
    kv_bytes: tuple[int, int] = (0, 0)  # (VRAM, host) bytes the prompt's KV allocated

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
                 observers: list[EngineObserver] | None = None, early=None):
        """`host`: the pack's blobs already in (pinned) host memory — experiments that build
        several engines over one 32 GB pack pin it once. `observers`: watch each prompt's plan,
        loans and result (strata.engine.observe); `self.observers` may change between prompts.
        `early`: the pack's read-ahead begun before torch's import (strata.engine.early), which
        the host blobs adopt (the CLI's; its owner closes it when the engine does not)."""
        # where the start goes (seconds per phase; experiments/cold_warm.py reports them)
        self.timings: dict[str, float] = {}
        clock = _PhaseClock(self.timings)
        self.cfg = cfg
        self.observers: list[EngineObserver] = list(observers or [])
        self.pack = pack = open_pack(pack)
        self.shape = pack.shape
        vram = cfg.vram
        devices = [resolve_device(d) for d in (cfg.devices or _default_devices(cfg.device,
                                                                               len(vram)))]
        if len(devices) != len(vram):
            raise StrataError(f"{len(vram)} --vram budgets for {len(devices)} devices; give one "
                              f"--vram per GPU")
        self.device = devices[0]
        self.dtype = dense_dtype(cfg, self.device.type)
        cfg = self.cfg = resolved(cfg, self.device.type)
        self.layouts = [pl.layout for pl in pack.layers]
        self.blob_sizes = [pl.blob_size for pl in pack.layers]
        self.max_blob = pack.max_blob
        # ffn "plane": every blob is re-laid into planes as it lands (strata.planes.Landing)
        self.land = plane_landing(cfg.ffn, self.layouts)
        parts, budgets, self.layout, self.fused = plan_inputs(
            self.shape, self.blob_sizes, pack.native, cfg, self.device.type)
        self.sizes = self.layout.sizes
        self.kv = kv_policy(cfg, self.device.type)
        # every budget against the machine before the host blobs are pinned or the cache is
        # allocated (strata.budget): one line naming what does not fit
        check_machine(budgets, devices, host_blobs=sum(self.blob_sizes) * self.shape.n_expert,
                      pin=cfg.pin and host is None,
                      dense_host=sum(b.dense for b in budgets) * self.dtype.itemsize // 2,
                      host_kv=self.sizes.kv_host_all(cfg.max_prompt),
                      kv_tokens=cfg.max_prompt)
        clock.cuda = [d for d in devices if d.type == "cuda"]
        clock.lap("plan_s")
        # The host blobs load on a thread while the caches are allocated and the dense weights
        # go up (the copy threads and the upload overlap); the caches fill once they are in.
        self.host = host or HostExperts(pack.experts, self.blob_sizes, pin=cfg.pin,
                                        progress=cfg.progress, background=True,
                                        spans=getattr(pack, "expert_span", None),
                                        early=early)
        try:
            caches = []
            for p, dev in zip(parts, devices):
                caches.append(ExpertCache(p.cache, self.host.source, dev, fill=False))
                caches[-1].land = self.land
            clock.lap("cache_alloc_s")
            self._warm: set = set()       # the warm-ups already read (warmup's keys)
            # NaN/Inf in a chunk fails the prompt, the layer named; read once after the prompt
            self.finite = FiniteGuard(defer=True)
            device_map = [dev for b, dev in zip(budgets, devices) for _ in b.layers]
            ffn = self.finite.wrap(expert_ffn(cfg.ffn))   # imports the kernels' modules
            clock.lap("ffn_s")
            self.model = load_model(pack, device=self.device, dtype=self.dtype, ffn=ffn,
                                    device_map=device_map, timings=self.timings)
            clock.lap("dense_s")
            self.pinned = self.host.pinned or self.device.type != "cuda"   # waits for the blobs
            clock.lap("pin_wait_s")
            self.parts: list[Part] = []
            for p, b, dev, cache in zip(parts, budgets, devices, caches):
                cache.fill(progress=cfg.progress)
                clock.lap("cache_fill_s")
                self.parts.append(Part(p.name, dev, b.layers, p, b, cache, Lane(dev),
                                       ParticipantScratch(p.name, dev, cache.buffer)))
            clock.lap("other_s")
        except BaseException:
            if host is None:   # the blobs this engine began loading: wait, then let them go
                self.host.close()
            raise

    # single-participant conveniences (tests, the CLI's summary)
    @property
    def cache(self) -> ExpertCache:
        return self.parts[0].cache

    @property
    def lane(self) -> Lane:
        return self.parts[0].lane

    # -- planning ----------------------------------------------------------------------------
    def plan(self, n_tokens: int | None = None, *, slab: bool = False,
             policy: RingPolicy | None = None):
        """The plan for a prompt of n_tokens (None: one at least a chunk long): chunk and ring
        from the scan (or the forced chunk), and every byte the engine borrows and carves for it;
        `slab`: borrow the stream-k scratch slab's reserve too (STRATA_MMQ_SLAB). `policy`: the
        launch choices (None: the environment's, read now)."""
        reserve = scratch_reserve(self.shape, {p.name: p.device for p in self.parts},
                                  self.cfg.ffn, slab, self.layouts)
        return plan_prompt(self.layout, [p.participant for p in self.parts], self.cfg,
                           pinned=self.pinned, fused=self.fused, native=self.pack.native,
                           n_tokens=n_tokens, scratch_reserve=reserve, policy=policy)

    # -- a prompt ----------------------------------------------------------------------------
    # -- warm start --------------------------------------------------------------------------
    def warmup_lengths(self, n_tokens: int) -> tuple[int, list[int]]:
        """(chunk, the chunk sizes a prompt of n_tokens is read in): every full chunk is `chunk`
        tokens, the last one n_tokens % chunk (when not 0)."""
        policy = engine_policy(self.cfg)
        plan = self.plan(n_tokens, slab=policy.slab, policy=policy)
        C = plan.chunk
        sizes = [C] * (n_tokens // C) + ([n_tokens % C] if n_tokens % C else [])
        return C, sizes

    def warmup(self, n_tokens: int, *, seed: int = 0, full: bool = False) -> float:
        """Compile and load every kernel variant a prompt of n_tokens will launch, before it is
        timed; returns the seconds it took (0 when this engine is already warm for it).

        Triton compiles a kernel per distinct set of constexprs and per specialization of its
        integer arguments (divisible by 16, equal to 1), and the launch plan (tiles, the expert
        FFN's kernel or decoded path, attention's tiles) follows the chunk's token count. So the
        warm-up reads one dry prompt through the prompt's own plan, whose chunks are the sizes
        the prompt uses: a full chunk, then the last partial chunk (or a second full one, so a
        chunk after cached positions is covered too). It goes through the first two layers of
        each blob layout on each participant only (strata.engine.warm: the variants do not
        depend on the layer; `full`: every layer). With the engine's own KV (PromptKV) the
        attention's launches also follow the prompt's length (a long prefix cut into pieces):
        the dry prompt's KV probes the real prompt's prefixes at each attention it reads
        (strata.engine.warm.WarmKV: one program a launch). It is an ordinary prompt through the
        same loan, carve and ring, so the cache ends byte for byte as it started; observers do
        not see it. `self.timings` gets what it cost and launched: warmup_s, warmup_layers,
        warmup_probes (attention calls probed), warmup_launches / warmup_variants (Triton
        launches, distinct variants: strata.engine.variants) and, on CUDA, warmup_compiled
        (variants Triton compiled or loaded)."""
        policy = engine_policy(self.cfg)
        plan = self.plan(n_tokens, slab=policy.slab, policy=policy)
        C = plan.chunk
        # the probes follow the prompt's length: a PromptKV warm-up is for that length only
        key = (C, plan.ring, n_tokens % C if n_tokens > C else n_tokens,
               n_tokens if self.uses_prompt_kv() else None)
        if key in self._warm:
            return 0.0
        n = dry_tokens(n_tokens, C)
        g = torch.Generator().manual_seed(seed)
        dry = torch.randint(0, self.shape.vocab, (n,), generator=g, dtype=torch.int64)
        layers = (list(range(self.shape.n_layer)) if full else
                  warm_layers([p.layers for p in self.parts], self.layouts))
        probe = ProbePlan(n_tokens, C, self.cfg.kv_resident)
        made: list[WarmKV] = []
        model, parts = self.model, self.parts
        if len(layers) < self.shape.n_layer:   # the read runs these parts' layers, this model's
            keep = set(layers)
            model = LayerSubset(self.model, layers)
            parts = [replace(p, layers=[l for l in p.layers if l in keep]) for p in self.parts]

        def dry_kv(n_dry: int, stages: dict):
            # PromptKV views (and may stage) every layer's buffer and lane, read or not: the
            # skipped layers get their participant's (one stage buffer a participant)
            every = {}
            for sp, p in zip(parts, self.parts):
                read = [l for l in sp.layers if l in stages]
                if read:
                    every.update({l: stages[read[0]] for l in p.layers})
            kv = self.prompt_kv(n_dry, every, parts=self.parts, make=lambda *a, **kw: WarmKV(
                *a, probe=probe, stage_bufs=every, **kw))
            if kv is not None:
                made.append(kv)
            return kv

        t0 = time.perf_counter()
        with torch.inference_mode(), KernelLaunches() as seen:
            self._gc_paused(dry, logits="last", fail_after_layers=None, plan=plan,
                            rd=_Reading(model, parts, [], dry_kv))
        took = time.perf_counter() - t0
        self._warm.add(key)
        t = self.timings
        t["warmup_s"] = t.get("warmup_s", 0.0) + took
        t["warmup_layers"] = len(layers)
        t["warmup_probes"] = sum(kv.probes for kv in made)
        t["warmup_launches"] = seen.launches
        t["warmup_variants"] = len(seen.variants)
        if seen.compiled is not None:
            t["warmup_compiled"] = seen.compiled
        return took

    def run(self, tokens, *, logits: str = "all", fail_after_layers: int | None = None,
            plan=None) -> PrefillResult:
        """Read `tokens` (1-D ids). logits: "all" (fp32 [T, V]), "last" or "none".

        `fail_after_layers` injects an allocation failure after that many layer batches
        (tests of the failure path). `plan`: read with this plan (one made by `self.plan` for
        a prompt at least this long: the warm-up reads through the real prompt's plan).

        Python's cyclic collector pauses for the prompt (STRATA_GC_PAUSE=0 leaves it alone):
        a collection runs on the thread that enqueues both lanes, and while it runs neither
        gets work. Reference counting still frees every tensor at once; only cycles wait for
        the prompt's end."""
        return self._gc_paused(tokens, logits=logits, fail_after_layers=fail_after_layers,
                               plan=plan, rd=_Reading(self.model, self.parts, self.observers,
                                                      self.prompt_kv))

    def _gc_paused(self, tokens, **kw) -> PrefillResult:
        paused = gc_pause() and gc.isenabled()
        if paused:
            gc.disable()
        try:
            return self._run(tokens, **kw)
        finally:
            if paused:
                gc.enable()

    def _run(self, tokens, *, logits: str, fail_after_layers: int | None, plan,
             rd: "_Reading") -> PrefillResult:
        """run()'s read, of `rd`'s model over `rd`'s participants with its observers and KV
        factory (the warm-up passes a layer subset, none and its dry KV)."""
        if logits not in ("all", "last", "none"):
            raise StrataError(f"logits must be all, last or none, got {logits!r}")
        tokens = rd.model.check_tokens(tokens)
        T = tokens.numel()
        if T > self.cfg.max_prompt:
            raise StrataError(f"the prompt has {T} tokens but this engine reserved KV for "
                              f"{self.cfg.max_prompt}; raise max_prompt (--max-prompt)")
        # read per prompt: cfg.slab, else STRATA_MMQ_SLAB; the ring knobs (a bad value: StrataError)
        policy = engine_policy(self.cfg)
        slab = policy.slab
        plan = plan if plan is not None else self.plan(T, slab=slab, policy=policy)
        if not plan.fits:
            raise StrataError(f"the plan does not fit: {plan.short_of()}")
        chunk, ring = plan.chunk, plan.ring
        for o in rd.observers:
            o.on_plan(plan, chunk, ring)
        stats = PrefillStats(tokens=T)
        out = None
        loans: list[Loan] = []
        memory: list[Borrowed] = []
        kv = cache = None
        stages: dict[int, torch.Tensor] = {}
        kv_scratch: dict[int, object] = {}    # layer -> AttnScratch of its participant's carve
        mla_scratch: dict[int, object] = {}   # layer -> MLAScratch of its participant's carve
        try:
            providers = []
            for part, pp in zip(rd.parts, plan.participants):
                # each participant carves its own ring (the fallback rule may size them apart)
                share = open_share(part, pp, self.layout, chunk, self.cfg.lend_cap, loans,
                                   shape=self.shape, host=self.host, layouts=self.layouts,
                                   land=self.land, slab=slab, observers=rd.observers)
                memory.append(share.got)
                stages.update(share.stages)
                kv_scratch.update(share.kv_scratch)
                mla_scratch.update(share.mla_scratch)
                providers.append(share.provider)
            provider = providers[0] if len(providers) == 1 else SplitProvider(providers)
            if fail_after_layers is not None:
                provider = _FailingProvider(provider, fail_after_layers)
            bar = (tqdm(total=T, desc="prefill", unit="tok", leave=False)
                   if self.cfg.progress else None)
            kv = rd.prompt_kv(T, stages)
            if kv is not None:      # each layer's attention scratch, from its carve
                kv.scratch = mla_scratch if self.shape.mla else kv_scratch
            cache = kv
            if kv is None:          # the model's own cache, in the run's KV dtype
                cache = rd.model.new_cache(capacity=T, kv=self.cfg.kv)
                if self.shape.mla:  # MLA all resident: its attention works in the carve
                    cache.scratch = mla_scratch
            _sync(rd.parts)
            t0 = time.perf_counter()
            read_marks = [self._read_mark(p) for p in rd.parts] if rd.observers else []
            try:
                out = rd.model.prefill(tokens, provider, chunk=chunk, logits=logits, cache=cache,
                                         progress=(lambda n: bar.update(n - bar.n)) if bar else None,
                                         observer=self.finite.begin(self.shape.n_layer))
                self.finite.check()   # the prompt's one host read of the finite flags
                _sync(rd.parts)
                for p, begin in zip(rd.parts, read_marks):
                    end = self._read_mark(p)
                    for o in rd.observers:
                        o.on_read(p.name, begin, end)
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
            close_shares(rd.parts, loans)
            kv_streamed = kv.streamed if kv is not None else 0
            kv_bytes = (cache.vram_bytes, cache.host_bytes) if cache is not None else (0, 0)
            if kv is not None:
                kv.release()      # the resident and the pinned host KV go with the prompt
            del kv, cache, stages, kv_scratch, mla_scratch
        result = PrefillResult(out, plan, chunk, ring, stats, memory, kv_streamed,
                               self.kv.dtype, kv_bytes)
        for o in rd.observers:
            o.on_result(result)
        return result

    @staticmethod
    def _read_mark(part):
        """A point on the participant's compute lane: a CUDA event, else perf_counter."""
        ev = part.lane.event()
        return ev if ev is not None else time.perf_counter()

    def uses_prompt_kv(self) -> bool:
        return uses_prompt_kv(self.shape, self.cfg)

    def prompt_kv(self, n_tokens: int, stages: dict[int, torch.Tensor], *, make=PromptKV,
                  parts=None) -> PromptKV | None:
        """A prompt's KV (None: the model's own cache), made by `make` (PromptKV's signature:
        the warm-up's WarmKV). Its host-held part is checked against the host's memory before
        anything is pinned (strata.budget.check_kv_host)."""
        if not self.uses_prompt_kv():
            return None
        parts = self.parts if parts is None else parts
        return new_prompt_kv(self.shape, self.cfg, self.sizes, n_tokens,
                             layers=[l for p in parts for l in p.layers],
                             vram=sum(b.budget.vram for b in parts),
                             devices=self.model.layer_devices, stages=stages,
                             lanes={l: part.lane for part in parts for l in part.layers},
                             pin=self.pinned and self.device.type == "cuda", make=make)

    def _sync(self) -> None:
        _sync(self.parts)


@dataclass(frozen=True)
class _Reading:
    """What one read goes through: the model (or a layer subset of it), the participants (their
    layers), the observers and the KV factory (PrefillEngine.prompt_kv's signature)."""
    model: object
    parts: list
    observers: list
    prompt_kv: object


def _sync(parts) -> None:
    for part in parts:
        part.lane.sync()


def uses_prompt_kv(shape, cfg: EngineConfig) -> bool:
    """The engine's own KV (PromptKV: chunk_attention over bf16/int8 segments) whenever
    --kv int8 or --kv-resident is given; the default bf16, all-resident run keeps the model's
    KVCache and its attention (the path every engine test and device run so far measured),
    until PromptKV's own device run says it may be the default. MLA keeps its own cache (bf16
    or int8: strata.models.mla) unless --kv-resident asks for a host-held window: PromptKV over
    the latent (PromptKV.attend_latent)."""
    if shape.mla:
        return cfg.kv_resident is not None
    return cfg.kv == "int8" or cfg.kv_resident is not None


def new_prompt_kv(shape, cfg: EngineConfig, sizes, n_tokens: int, *, layers, vram: int, devices,
                  stages: dict, lanes: dict, pin: bool, make=PromptKV) -> PromptKV:
    """A prompt's engine-owned KV (made by `make`, PromptKV's signature) keeping `layers` (the
    others are another process's: they keep nothing). Its host-held part is checked against the
    host's memory before anything is pinned (strata.budget.check_kv_host)."""
    check_kv_host(sizes.kv_host_all(n_tokens, layers), sizes.kv_vram(n_tokens, layers), vram, 0,
                  host_available(), n_tokens)
    heads, key_dim, value_dim = shape.kv_heads    # MLA: one "head", the latent and rope key
    return make(shape.n_layer, heads, key_dim, n_tokens, kv=cfg.kv, resident=cfg.kv_resident,
                devices=devices, stages=stages, lanes=lanes, pin=pin, windows=kv_windows(shape),
                value_dim=value_dim, layers=layers)


def engine_policy(cfg: EngineConfig) -> RingPolicy:
    """The launch choices of a prompt starting now: the environment's (strata.config.ring_policy),
    the slab EngineConfig.slab when set (else STRATA_MMQ_SLAB). A bad value: StrataError."""
    return config.ring_policy(slab=cfg.slab)


def plan_inputs(shape, blob_sizes, native: bool, cfg: EngineConfig, device_type: str,
                policy: RingPolicy | None = None):
    """(participants, budgets, prompt layout, fused) a plan is computed from: the engine and
    `strata plan` both call this, so the same config gives the same plan. On the CPU the cache
    is capped at what it can hold (strata.budget.cpu_cache_cap): --vram there is a budget, not
    an allocation. `policy`: the launch choices (None: the environment's, read now)."""
    policy = engine_policy(cfg) if policy is None else policy
    vram = cfg.vram
    for v in vram:
        if cfg.cache is not None and cfg.cache > v:
            raise StrataError(f"--cache {fmt_bytes(cfg.cache)} is more than --vram "
                              f"{fmt_bytes(v)}: the expert cache lives inside the GPU's "
                              f"memory; give a smaller --cache or more --vram")
    kv = kv_policy(cfg, device_type)
    shape.kv_bytes(1, kv.dtype)   # a KV dtype the architecture cannot hold: one line, now
    sizes = model_sizes(shape, kv=kv)
    layout = PromptLayout(sizes, max(blob_sizes), layout_spec(cfg.ffn, kv, shape), cfg.batch)
    fused = use_fused(native, cfg.fused, policy)
    kw = dict(lend_cap=cfg.lend_cap, reserve=cfg.reserve, kv_tokens=cfg.max_prompt,
              split=cfg.layer_split)
    if cfg.cache is None and cfg.max_prompt:
        check_room(sizes, vram, reserve=cfg.reserve, kv_tokens=cfg.max_prompt,
                   split=cfg.layer_split)
    parts, budgets = participants(sizes, blob_sizes, vram, cache=cfg.cache, **kw)
    if device_type != "cuda":
        from strata.memory.scan import GRID, full_ring
        T = cfg.chunk or min(cfg.scan_max, -(-max(cfg.max_prompt, 1) // GRID) * GRID)
        # the full ring bounds any chunk's ring (STAGE carves no more), so the cap holds it
        ring = full_ring(layout, pinned=True, fused=fused, native=native, ring=cfg.ring,
                         policy=policy)
        cap = max(cpu_cache_cap(sizes, blob_sizes, b.layers, layout, chunk=T, ring_slots=ring,
                                lend_cap=cfg.lend_cap) for b in budgets)
        if cap < min(b.cache for b in budgets):
            parts, budgets = participants(sizes, blob_sizes, vram, cache=cap, **kw)
    return parts, budgets, layout, fused


def dense_dtype(cfg: EngineConfig, device_type: str) -> torch.dtype:
    """The dense math's dtype: --dtype, else bf16 on CUDA and fp32 on the CPU."""
    return cfg.dtype or (torch.bfloat16 if device_type == "cuda" else torch.float32)


def resolved(cfg: EngineConfig, device_type: str) -> EngineConfig:
    """The config with its KV dtype resolved (auto -> the dense dtype's: kv_int8.resolve_kv), the
    one dtype the plan counts and every cache of the run allocates."""
    return replace(cfg, kv=resolve_kv(cfg.kv, dense_dtype(cfg, device_type)))


def kv_policy(cfg: EngineConfig, device_type: str = "cpu") -> KVPolicy:
    """The KV dtype (resolved for `device_type`) and resident window the config names, for
    prompts up to cfg.max_prompt."""
    return KVPolicy(resolved(cfg, device_type).kv, cfg.kv_resident, cfg.max_prompt)


def plan_prompt(layout, parts, cfg: EngineConfig, *, pinned: bool, fused: bool, native: bool,
                n_tokens: int | None = None, scratch_reserve=None,
                policy: RingPolicy | None = None):
    """The plan of one prompt from plan_inputs' participants and layout: the one call the
    engine, `strata plan` and `strata prefill`'s early refusal make. `policy`: the launch
    choices (None: the environment's, read now)."""
    if n_tokens is not None and cfg.max_prompt and n_tokens > cfg.max_prompt:
        raise StrataError(f"the prompt has {n_tokens} tokens but --max-prompt reserves KV for "
                          f"{cfg.max_prompt}; raise --max-prompt or shorten the prompt")
    return plan_prefill(layout, parts, scan=cfg.scan, scan_max=cfg.scan_max, chunk=cfg.chunk,
                        pinned=pinned, fused=fused, native=native, ring=cfg.ring,
                        n_tokens=n_tokens, scratch_reserve=scratch_reserve,
                        policy=engine_policy(cfg) if policy is None else policy)


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

    def passes(self, layer, topk_ids):
        for item in self.inner.passes(layer, topk_ids):
            if self.left <= 0:
                raise AllocationError("injected allocation failure mid-prompt; the request "
                                      "failed and the cache was refilled")
            self.left -= 1
            yield item


class _PhaseClock:
    """Seconds between laps into `timings` (added up per name), the devices synchronized first
    so a phase's queued copies count in it, not in the next."""

    def __init__(self, timings: dict):
        self.timings = timings
        self.cuda: list = []      # set once the devices are known
        self.t = time.perf_counter()

    def lap(self, name: str) -> None:
        t = time.perf_counter()
        for d in self.cuda:
            torch.cuda.synchronize(d)
        # the waits apart too: a sync can stall behind another thread's driver calls (the
        # pinning thread's page-locking), which is not this phase's own work
        self.timings["sync_s"] = self.timings.get("sync_s", 0.0) + time.perf_counter() - t
        t = time.perf_counter()
        self.timings[name] = self.timings.get(name, 0.0) + t - self.t
        self.t = t


def _first_line(e: BaseException) -> str:
    return str(e).splitlines()[0] if str(e) else type(e).__name__
