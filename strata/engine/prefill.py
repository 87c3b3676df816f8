"""The streaming prefill engine: read a prompt through a pack whose experts do not fit in VRAM.

    engine = PrefillEngine(pack, EngineConfig(vram=12 << 30))
    result = engine.run(tokens)          # logits (if asked), the plan, PrefillStats

Once, at start: the pack's expert blobs go to host memory (pinned when possible), the dense
weights to the device, and the expert cache takes what the VRAM budget leaves (dense weights, the
KV of the longest prompt, a reserve) and fills round-robin over layers.

Per prompt: plan (chunk + ring, one byte budget: strata.memory.scan, for this prompt's length),
then in a PromptSession (strata.engine.session) borrow the loan the plan names from the top of
the cache and carve the ring and the chunk's buffers out of it exactly as the plan laid them out
(every size read off the plan, none derived again; `PrefillResult.memory` records what was
borrowed and carved), read the prompt chunk by chunk (every layer computes its experts from cache
slots and ring slots, copies overlapped with compute: strata.engine.provider), then refill the
borrowed slots. A prompt that fails — bad input, an allocation that fails mid-prompt — fails
alone: the copy lane is drained, the loan is refilled, and the cache ends byte for byte as it
started. The warm-up reads through the same session (a layer subset, its dry KV factory).

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

from strata.budget import check_machine
from strata.config import gc_pause
from strata.engine.device import Lane
from strata.engine.engine_config import (EngineConfig, default_devices, dense_dtype,
                                         engine_policy, kv_policy, layer_blocks, resolved)
from strata.engine.finite import FiniteGuard
from strata.engine.host import HostExperts, expert_bytes, host_pinning
from strata.engine.observe import EngineObserver
from strata.engine.prompt_kv import host_kv_arena, new_prompt_kv, uses_prompt_kv
from strata.engine.prompt_plan import check_prefix_pin, plan_inputs, plan_prompt, resolve_kv
from strata.engine.scratch import ParticipantScratch
from strata.engine.session import Borrowed, Part, PromptSession
from strata.engine.stats import PrefillStats
from strata.engine.variants import KernelLaunches
from strata.engine.warm import LayerSubset, ProbePlan, WarmKV, dry_tokens, warm_layers
from strata.errors import AllocationError, StrataError, allocation_failed
from strata.memory import ExpertCache, RingPolicy
from strata.models.kv import PromptKV, kv_windows
from strata.engine.load import kept_bytes, load_model, open_pack, resolve_device
from strata.planning import scratch_reserve

log = logging.getLogger("strata")


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
    restored: int = 0                  # positions restored from a saved state before the read
    restore_s: float = 0.0             # seconds the read waited for the restore (host rows: beside)
    then: object = None                # what run's `then` returned
    setup_s: float = 0.0               # the session's set-up before it: loan, carve, ring, KV
    teardown_s: float = 0.0            # its end after the read and `then`: the loan's refill

    def info(self) -> dict:
        return {"prefill_chunk": self.chunk, "prefill_ring": self.ring}


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
        devices = [resolve_device(d) for d in (cfg.devices or default_devices(cfg.device,
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
        # the FFN's landing (the plane GEMM's: each blob re-laid into planes as it lands), or None
        self.land = cfg.ffn.landing(self.layouts)
        # --kv-resident auto: the window the plan leaves (prompt_plan.resolve_kv), kept in cfg
        # the matrices kept as blocks on the GPU: the plan counts what the load places
        kept = kept_bytes(pack, self.device.type, self.dtype, layer_blocks=layer_blocks(cfg))
        cfg = self.cfg = resolve_kv(self.shape, self.blob_sizes, pack.native, cfg,
                                    self.device.type, kept=kept)
        check_prefix_pin(self.shape, cfg, self.device.type)
        parts, budgets, self.layout, self.fused = plan_inputs(
            self.shape, self.blob_sizes, pack.native, cfg, self.device.type, kept=kept)
        self.sizes = self.layout.sizes
        self.kv = kv_policy(cfg, self.device.type)
        # every budget against the machine before the host blobs are pinned or the cache is
        # allocated (strata.budget): one line naming what does not fit
        # a pack already in host memory whose pinned copy would not fit beside it is locked
        # in place instead (host_pinning): then pinning takes no host memory of its own
        method, pinned_bytes = host_pinning(pack, expert_bytes(pack),
                                            cfg.pin and host is None,
                                            any(d.type == "cuda" for d in devices))
        check_machine(budgets, devices, host_blobs=pinned_bytes, pin=cfg.pin and host is None,
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
                                        early=early, method=method)
        try:
            caches = []
            for p, dev in zip(parts, devices):
                caches.append(ExpertCache(p.cache, self.host.source, dev, fill=False))
                caches[-1].land = self.land
            clock.lap("cache_alloc_s")
            self._warm: set = set()       # the warm-ups already read (warmup's keys)
            # the host-held KV's pinned arena (prompt_kv makes it once; False: none needed)
            self._host_kv = None
            # NaN/Inf in a chunk fails the prompt, the layer named; read once after the prompt
            self.finite = FiniteGuard(defer=True)
            device_map = [dev for b, dev in zip(budgets, devices) for _ in b.layers]
            ffn = self.finite.wrap(cfg.ffn.forward())   # imports the kernels' modules
            clock.lap("ffn_s")
            self.model = load_model(pack, device=self.device, dtype=self.dtype, ffn=ffn,
                                    device_map=device_map, timings=self.timings,
                                    layer_blocks=layer_blocks(cfg))
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

    # -- warm start --------------------------------------------------------------------------
    def warmup_lengths(self, n_tokens: int) -> tuple[int, list[int]]:
        """(chunk, the chunk sizes a prompt of n_tokens is read in): every full chunk is `chunk`
        tokens, the last one n_tokens % chunk (when not 0)."""
        policy = engine_policy(self.cfg)
        plan = self.plan(n_tokens, slab=policy.slab, policy=policy)
        C = plan.chunk
        sizes = [C] * (n_tokens // C) + ([n_tokens % C] if n_tokens % C else [])
        return C, sizes

    def warmup(self, n_tokens: int, *, start: int = 0, seed: int = 0, full: bool = False,
               packed=None) -> float:
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
        (strata.engine.warm.WarmKV: one program a launch). `start`: a resumed read, positions
        0..start-1 restored and the n_tokens - start after them read through their own plan
        (as run() plans them): its chunk then follows cached positions, so the dry prompt
        reads it twice when it is one chunk. It is an ordinary prompt through the
        same loan, carve and ring, so the cache ends byte for byte as it started; observers do
        not see it. `self.timings` gets what it cost and launched: warmup_s, warmup_layers,
        warmup_probes (attention calls probed), warmup_launches / warmup_variants (Triton
        launches, distinct variants: strata.engine.variants) and, on CUDA, warmup_compiled
        (variants Triton compiled or loaded). `packed` (strata.models.packed.Packed, n_tokens
        long): the prompts are batches of packed sequences, whose attention launches differ
        (the block-diagonal mask): the dry prompt is read packed the same way."""
        if not 0 <= start < n_tokens:
            raise StrataError(f"a warm-up reads at least one token after the restored ones: "
                              f"start {start}, n_tokens {n_tokens}")
        policy = engine_policy(self.cfg)
        T = n_tokens - start
        plan = self.plan(T, slab=policy.slab, policy=policy)
        C = plan.chunk
        # the probes follow the prompt's length: a PromptKV warm-up is for that length only
        key = (C, plan.ring, T % C if T > C else T,
               (n_tokens, start) if self.uses_prompt_kv() else None, start > 0,
               None if packed is None else packed.lengths)
        if key in self._warm:
            return 0.0
        n = dry_tokens(T, C)
        if start and n == T and 2 * T <= self.cfg.max_prompt:
            n = 2 * T        # the read's one chunk, then again after cached positions
        g = torch.Generator().manual_seed(seed)
        dry = torch.randint(0, self.shape.vocab, (n,), generator=g, dtype=torch.int64)
        layers = (list(range(self.shape.n_layer)) if full else
                  warm_layers([p.layers for p in self.parts], self.warm_kinds()))
        probe = ProbePlan(n_tokens, C, self.cfg.kv_resident, start)
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
                            rd=_Reading(model, parts, [], dry_kv), packed=packed)
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

    def warm_kinds(self) -> list:
        """Per layer, what its launches follow besides the chunk: its blob layout, its
        attention's kind (a hybrid's linear and full layers launch different kernels) and its
        window (a sliding layer's masks): a warm-up reads the first layers of each."""
        windows = kv_windows(self.shape)
        return [(self.layouts[l], self.shape.layer_kind(l), windows[l])
                for l in range(self.shape.n_layer)]

    # -- a prompt ----------------------------------------------------------------------------
    def run(self, tokens, *, logits: str = "all", fail_after_layers: int | None = None,
            plan=None, resume=None, extra: int = 0, then=None, packed=None) -> PrefillResult:
        """Read `tokens` (1-D ids). logits: "all" (fp32 [T, V]), "last" or "none".

        `resume` (state, n): positions 0..n-1 restored from a saved state
        (strata.engine.kv_state.KVState) into the prompt's KV before `tokens` are read at
        positions n.. (no tokens: the state's own last logits are the result); `extra`: tokens
        of KV kept past the prompt (a decode's). The KV is for n + T + extra tokens; the plan
        (chunk, ring, the chunk's buffers) is the read's own, of T tokens: a short question
        after a long restored document lends the cache a short chunk's bytes, not a long one's.
        `then(session, logits)`: called once the read is timed and settled, the session's KV
        and provider still held (a save, a decode); it returns `result.then`.

        `packed` (strata.models.packed.Packed): the tokens are several independent sequences
        back to back (windows of a text, prompts of a file), read as one chunk: block-diagonal
        causal attention, positions restarting per sequence, the experts streamed once for all
        of them. The plan counts the batch as any prompt of T tokens; it must fit its chunk
        (refused in one line otherwise), and its KV is its own (a fresh PromptKV, as every
        prompt's).

        `fail_after_layers` injects an allocation failure after that many layer batches
        (tests of the failure path). `plan`: read with this plan (one made by `self.plan` for
        a prompt at least this long: the warm-up reads through the real prompt's plan).

        Python's cyclic collector pauses for the prompt (STRATA_GC_PAUSE=0 leaves it alone):
        a collection runs on the thread that enqueues both lanes, and while it runs neither
        gets work. Reference counting still frees every tensor at once; only cycles wait for
        the prompt's end."""
        return self._gc_paused(tokens, logits=logits, fail_after_layers=fail_after_layers,
                               plan=plan, rd=_Reading(self.model, self.parts, self.observers,
                                                      self.prompt_kv),
                               resume=resume, extra=extra, then=then, packed=packed)

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
             rd: "_Reading", resume=None, extra: int = 0, then=None,
             packed=None) -> PrefillResult:
        """run()'s read, of `rd`'s model over `rd`'s participants with its observers and KV
        factory (the warm-up passes a layer subset, none and its dry KV)."""
        if logits not in ("all", "last", "none"):
            raise StrataError(f"logits must be all, last or none, got {logits!r}")
        state, n0 = resume if resume is not None else (None, 0)
        if state is not None and len(tokens) == 0:
            tokens = torch.zeros(0, dtype=torch.int64)    # the state's logits are the result
        else:
            tokens = rd.model.check_tokens(tokens)
        T = tokens.numel()
        total = n0 + T + extra
        if total > self.cfg.max_prompt:
            raise StrataError(f"the prompt has {total} tokens but this engine reserved KV for "
                              f"{self.cfg.max_prompt}; raise max_prompt (--max-prompt)")
        # read per prompt: cfg.slab, else STRATA_MMQ_SLAB; the ring knobs (a bad value: StrataError)
        policy = engine_policy(self.cfg)
        slab = policy.slab
        # the plan is the read's: its chunk and ring follow the T tokens read (a question after a
        # restored document is a short prompt), the KV of all `total` is the engine's reserve
        plan = plan if plan is not None else self.plan(max(T, 1), slab=slab, policy=policy)
        if not plan.fits:
            raise StrataError(f"the plan does not fit: {plan.short_of()}")
        chunk, ring = plan.chunk, plan.ring
        if packed is not None:
            if state is not None:
                raise StrataError("a packed batch is read into an empty KV; it cannot resume "
                                  "a saved state (read the batch without --resume)")
            packed.check_chunk(T, 0, chunk)
        for o in rd.observers:
            o.on_plan(plan, chunk, ring)
        stats = PrefillStats(tokens=T)
        out = None
        t_setup = time.perf_counter()
        with PromptSession(rd.parts, plan.participants, self.layout, chunk, self.cfg.lend_cap,
                           shape=self.shape, host=self.host, layouts=self.layouts,
                           land=self.land, slab=slab, observers=rd.observers,
                           stage_below=plan.stream_all_min) as session:
            session.open(fail_after_layers)
            session.new_kv(total, rd.prompt_kv, rd.model, self.cfg.kv)
            setup_s = time.perf_counter() - t_setup
            restore_s = state.restore(session.kv, n0) if state is not None else 0.0
            bar = (tqdm(total=T, desc="prefill", unit="tok", leave=False)
                   if self.cfg.progress else None)
            _sync(rd.parts)
            t0 = time.perf_counter()
            read_marks = [self._read_mark(p) for p in rd.parts] if rd.observers else []
            try:
                out = state.logits() if T == 0 else rd.model.prefill(
                    tokens, session.provider, chunk=chunk, logits=logits, cache=session.kv,
                    progress=(lambda n: bar.update(n - bar.n)) if bar else None,
                    observer=self.finite.begin(self.shape.n_layer), packed=packed)
                if T:
                    self.finite.check()   # the prompt's one host read of the finite flags
                _sync(rd.parts)
                for p, begin in zip(rd.parts, read_marks):
                    end = self._read_mark(p)
                    for o in rd.observers:
                        o.on_read(p.name, begin, end)
            except torch.cuda.OutOfMemoryError as e:
                raise AllocationError(allocation_failed(e)) from None
            finally:
                if bar is not None:
                    bar.close()
            stats.seconds = time.perf_counter() - t0
            session.settle(stats)
            after = then(session, out) if then is not None else None
            t_end = time.perf_counter()
        result = PrefillResult(out, plan, chunk, ring, stats, session.memory,
                               session.kv_streamed, self.kv.dtype, session.kv_bytes, n0,
                               restore_s, after, setup_s, time.perf_counter() - t_end)
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
        layers = [l for p in parts for l in p.layers]
        pin = self.pinned and self.device.type == "cuda"
        if self._host_kv is None:     # pinned once, for the longest prompt: strata.engine.host_kv
            self._host_kv = host_kv_arena(self.shape, self.kv, self.sizes,
                                          layers=[l for p in self.parts for l in p.layers],
                                          vram=sum(b.budget.vram for b in self.parts),
                                          pin=pin) or False
            if self._host_kv:
                self._host_kv.allocate()
        return new_prompt_kv(self.shape, self.cfg, self.sizes, n_tokens, layers=layers,
                             vram=sum(b.budget.vram for b in parts),
                             devices=self.model.layer_devices, stages=stages,
                             lanes={l: part.lane for part in parts for l in part.layers},
                             pin=pin, make=make, host_arena=self._host_kv or None)

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
