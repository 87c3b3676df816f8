"""The layer split as a torch.distributed pipeline: one process per participant.

    torchrun --nproc-per-node 2 -m strata prefill PACK --prompt-tokens 32768 --vram 12GiB \
        --distributed [--schedule pipelined] [--distributed-backend gloo]

Legend: T tokens in a chunk, D hidden, W ranks (world size), r this rank.

Each rank is one participant of the rig the single-process split would build (the same
`plan_inputs` over W budgets: --vram once for every rank or once per rank), and keeps only its
own: its layer range, its expert cache, loan, ring and lane, the blobs of its layers
(HostExperts(layers=...): the pack is read by range), its layers' dense weights and KV, plus the
embeddings on rank 0 and the output norm + LM head on the last rank. Every architecture the
registry knows runs this way (`load_stage`: the model's own class, the other layers on the meta
device); the KV is what one process keeps with the same flags, for this rank's layers only:
the model's own cache by default (MLA: bf16 or int8), the engine's PromptKV under --kv int8 or
--kv-resident (host-held tokens staged back through the rank's carve). --experts plane re-lays
the blobs as planes as they land, as one process does.

The chunk is agreed per prompt: every rank plans its own participant alone on the scan grid,
the ranks all-gather (scan chunk, rule, error, participant) and take the smallest chunk (a
collective min); every rank then plans that chunk as forced. Under the full-ring rule this is
exactly the single-process plan of the whole rig (the joint scan is the largest chunk that fits
every participant, and the ring of a chunk depends on the chunk only). When a rank's own scan
falls back (no full ring beside the smallest chunk), every rank plans the whole rig from the
gathered participants (cache layouts and lend caps: plain data), as the single-process split
does, and takes its own ParticipantPlan. Either way every rank runs the same chunk under the same
rule, and plan = engine holds per rank: each rank borrows and carves its own ParticipantPlan
and keeps its prompt's KV in a `strata.engine.session.PromptSession`, as one process does.
--prefill legacy is refused.

Per chunk, rank 0 embeds the tokens, every rank runs its layers (the model's forward_layers) and
hands the hidden states [T, D] (the model's dtype: T·D·2 bytes in bf16) to rank r + 1 with
send/recv (strata.engine.handoff); the last rank computes the logits. Every hand-off is a
1-element status header and, when the sender is healthy, the payload: a rank that failed sends
"failed" headers for the rest of the prompt (and drains what upstream still sends), so nothing
waits on a message that never comes.

Schedules:
- "sequential": after every chunk the ranks all-reduce an ok flag (MIN), so chunk c + 1 starts
  on rank 0 only once the last rank finished chunk c: one chunk in flight, a failure stops every
  rank after the chunk it happened in. The bubble is (W - 1) / W of each rank's time.
- "pipelined": no per-chunk collective; rank r runs chunk c + 1 while rank r + 1 runs chunk c
  (sends are asynchronous), one ok all-gather per prompt. The bubble is the fill and drain:
  (W - 1) chunk-stages of n_chunks + W - 1.

Failure: an error on any rank (the plan, the carve, an allocation mid-prompt, the NaN guard)
fails the prompt on every rank with the same line, "rank r of W: <what>" (the lowest failing
rank's), after each rank refilled its loan (its cache ends byte for byte as it started). Every
collective and every receive has a timeout (`DistConfig.timeout_s`): a rank that died leaves
the others with a timeout error, not a hang.
"""
from __future__ import annotations

import datetime
import logging
import os
import time
from dataclasses import dataclass, field, replace

import torch
import torch.distributed as dist

from strata.budget import check_machine
from strata.engine.device import Lane
from strata.engine.engine_config import (EngineConfig, dense_dtype, engine_policy, layer_blocks,
                                         resolved)
from strata.engine.finite import FiniteGuard
from strata.engine.handoff import Handoff, raise_first, rank_message
from strata.engine.host import HostExperts, expert_bytes, host_pinning
from strata.engine.prompt_kv import new_prompt_kv, uses_prompt_kv
from strata.engine.prompt_plan import check_prefix_pin, plan_inputs, plan_prompt, resolve_kv
from strata.engine.scratch import ParticipantScratch
from strata.engine.session import Borrowed, Part, PromptSession
from strata.engine.stats import PrefillStats
from strata.engine.warm import dry_tokens
from strata.errors import StrataError
from strata.memory import ExpertCache
from strata.models.kv import PromptKV
from strata.engine.load import kept_bytes, load_model, open_pack, resolve_device
from strata.planning import scratch_reserve
from strata.units import fmt_bytes

log = logging.getLogger("strata")

SEQUENTIAL, PIPELINED = "sequential", "pipelined"
SCHEDULES = (SEQUENTIAL, PIPELINED)
TIMEOUT_S = 600.0            # collectives and receives; a dead rank surfaces within this


@dataclass(frozen=True)
class DistConfig:
    schedule: str = SEQUENTIAL
    backend: str | None = None      # None: nccl on CUDA, gloo on the CPU
    timeout_s: float = TIMEOUT_S


@dataclass
class StageResult:
    """One rank's read of a prompt. `logits` only on the last rank."""
    logits: torch.Tensor | None
    plan: object                     # this rank's plan (the agreed chunk, forced)
    chunk: int
    ring: int | str
    rank: int
    world: int
    layers: range
    stats: PrefillStats = field(default_factory=PrefillStats)
    memory: list[Borrowed] = field(default_factory=list)
    handoff_s: float = 0.0           # time in send/recv of hidden states (this rank)
    handoff_bytes: int = 0           # hidden-state bytes this rank sent
    compute_s: float = 0.0           # time in its own layers (synced per chunk)


def init(backend: str | None = None, timeout_s: float = TIMEOUT_S, *,
         init_method: str | None = None, rank: int | None = None, world: int | None = None
         ) -> tuple[int, int, torch.device]:
    """Join the process group (torchrun's environment unless `init_method`/`rank`/`world` are
    given) and pick this rank's device: cuda:LOCAL_RANK (mod the visible GPUs, so two gloo ranks
    may share one GPU) when CUDA is there, else the CPU. NCCL refuses two ranks on one GPU and
    needs CUDA: both are refused here with one line."""
    backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    if backend not in ("nccl", "gloo"):
        raise StrataError(f"--distributed-backend must be nccl or gloo, got {backend!r}")
    if backend == "nccl" and not torch.cuda.is_available():
        raise StrataError("--distributed-backend nccl needs CUDA; use gloo on CPUs")
    if not dist.is_initialized():
        if init_method is None and "RANK" not in os.environ:
            raise StrataError("--distributed runs under torchrun (one process per GPU or host), "
                              "e.g. torchrun --nproc-per-node 2 -m strata prefill ... "
                              "--distributed")
        kw = {} if init_method is None else dict(init_method=init_method, rank=rank,
                                                 world_size=world)
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s), **kw)
    r, w = dist.get_rank(), dist.get_world_size()
    if torch.cuda.is_available():
        local = int(os.environ.get("LOCAL_RANK", r))   # torchrun's contract, not a strata knob
        n = torch.cuda.device_count()
        if backend == "nccl" and w > n and local >= n:
            raise StrataError(f"NCCL needs one GPU per rank but rank {r} has none of the {n} "
                              f"visible; use --distributed-backend gloo to share a GPU")
        dev = torch.device("cuda", local % n)
        torch.cuda.set_device(dev)
    else:
        dev = torch.device("cpu")
    return r, w, dev


def leave(code: int = 0) -> None:
    """End a spawned rank whose work is done and written: meet the other ranks, tear the group
    down, flush, and exit without the interpreter's teardown, where gloo's worker threads can
    abort the process (SIGABRT after every result was written) — as `strata prefill
    --distributed` leaves (strata.commands._dist). Never returns."""
    dist.barrier()
    dist.destroy_process_group()
    exit_flushed(code)


def exit_flushed(code: int) -> None:
    """Flush stdout and stderr, then leave by os._exit: no interpreter teardown (where gloo's
    worker threads can abort a finished process). Never returns."""
    import sys
    for f in (sys.stdout, sys.stderr):
        try:
            f.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def agree_chunk(every: list) -> int | None:
    """The chunk every rank reads from every rank's (scan chunk, rule, error or None, ...), in
    rank order: the smallest scan chunk when every rank's own scan found a full ring (or the
    chunk was forced); None when a rank fell back (the ranks then plan the whole rig jointly
    from the gathered participants: the fallback sizes each ring beside the smallest chunk).
    Raises the lowest failing rank's error, the same on every rank."""
    raise_first([(r, e[2]) for r, e in enumerate(every)], len(every))
    if all(e[1] in ("full-ring", "forced") for e in every):
        return min(e[0] for e in every)
    return None


class StageEngine:
    """One rank's participant of the layer split: plans, borrows, carves and streams its own
    layers only; `run(tokens)` reads a prompt with the other ranks (every rank calls it with
    the same tokens)."""

    def __init__(self, pack, cfg: EngineConfig, dcfg: DistConfig, *, rank: int, world: int,
                 device: torch.device):
        if dcfg.schedule not in SCHEDULES:
            raise StrataError(f"--schedule must be one of {', '.join(SCHEDULES)}, got "
                              f"{dcfg.schedule!r}")
        if cfg.scan == "legacy":
            raise StrataError("--prefill legacy is not supported with --distributed; the ranks "
                              "agree on a chunk of the auto scan (or a forced --chunk)")
        self.dcfg, self.rank, self.world = dcfg, rank, world
        self.pack = pack = open_pack(pack)
        self.shape = s = pack.shape
        vram = cfg.vram
        if len(vram) == 1:
            vram = vram * world
        if len(vram) != world:
            raise StrataError(f"{len(vram)} --vram budgets for {world} ranks; give one --vram "
                              f"(every rank) or one per rank")
        self.cfg = cfg = replace(cfg, vram=vram, devices=None)
        self.device = device = resolve_device(device)
        self.dtype = dense_dtype(cfg, device.type)
        self.cfg = cfg = resolved(cfg, device.type)    # one KV dtype, as one process keeps
        self.layouts = [pl.layout for pl in pack.layers]
        # the FFN's landing (the plane GEMM's: each blob re-laid into planes as it lands, in the
        # cache's slots and the ring's), as in one process; a layer it cannot read is refused here
        self.land = cfg.ffn.landing(self.layouts)
        blob_sizes = [pl.blob_size for pl in pack.layers]
        # the whole rig's participants (the same call as the single-process split), then ours
        # --kv-resident auto: every rank resolves the whole rig's window alike
        kept = kept_bytes(pack, device.type, self.dtype, layer_blocks=layer_blocks(cfg))
        self.cfg = cfg = resolve_kv(s, blob_sizes, pack.native, cfg, device.type, kept=kept)
        check_prefix_pin(s, cfg, device.type)
        parts, budgets, self.layout, self.fused = plan_inputs(s, blob_sizes, pack.native, cfg,
                                                              device.type, kept=kept)
        p, b = parts[rank], budgets[rank]
        self.layers = b.layers
        self.first, self.last = rank == 0, rank == world - 1
        method, pinned_bytes = host_pinning(
            pack, expert_bytes(pack, b.layers), cfg.pin,
            device.type == "cuda")
        check_machine([b], [device], host_blobs=pinned_bytes,
                      pin=cfg.pin, dense_host=b.dense * self.dtype.itemsize // 2,
                      host_kv=self.layout.sizes.kv_host_all(cfg.max_prompt, b.layers),
                      kv_tokens=cfg.max_prompt)
        self.host = HostExperts(pack.experts, blob_sizes, pin=cfg.pin, progress=cfg.progress,
                                spans=getattr(pack, "expert_span", None),
                                layers=b.layers, method=method)
        self.pinned = self.host.pinned or device.type != "cuda"
        cache = ExpertCache(p.cache, self.host.source, device, fill=False)
        cache.land = self.land
        cache.fill()
        self.part = Part(p.name, device, b.layers, p, b, cache, Lane(device),
                         ParticipantScratch(p.name, device, cache.buffer))
        self.finite = FiniteGuard()
        self.model = load_stage(pack, b.layers, device=device, dtype=self.dtype,
                                ffn=self.finite.wrap(cfg.ffn.forward()),
                                layer_blocks=layer_blocks(cfg))
        self.wire = Handoff(rank, world, device, dcfg.timeout_s, width=s.d_model,
                            dtype=self.dtype)
        self._warm: set = set()     # the warm-ups already read (warmup's keys)

    @property
    def cache(self) -> ExpertCache:
        return self.part.cache

    # -- planning ----------------------------------------------------------------------------
    def plan_alone(self, n_tokens: int, *, slab: bool = False, chunk: int | None = None,
                   policy=None):
        """This rank's plan of its own participant (`chunk`: forced; `policy`: the launch
        choices, None: the environment's, read now)."""
        reserve = scratch_reserve(self.shape, {self.part.name: self.device}, self.cfg.ffn, slab,
                                  self.layouts)
        cfg = self.cfg if chunk is None else replace(self.cfg, chunk=chunk)
        return plan_prompt(self.layout, [self.part.participant], cfg, pinned=self.pinned,
                           fused=self.fused, native=self.pack.native, n_tokens=n_tokens,
                           scratch_reserve=reserve, policy=policy)

    def plan(self, n_tokens: int, *, slab: bool = False, policy=None):
        """(plan, this rank's ParticipantPlan): the smallest of every rank's own scan chunk,
        planned forced here; when a rank's scan fell back, the joint plan of every rank's
        gathered participant (what the single-process split plans)."""
        try:   # a bad knob is this rank's error, raised on every rank
            policy = engine_policy(self.cfg) if policy is None else policy
            mine = self.plan_alone(n_tokens, slab=slab, policy=policy)
            if not mine.fits:
                raise StrataError(f"the plan does not fit: {mine.short_of()}")
            own = (mine.scan_chunk, mine.rule, None)
        except StrataError as e:
            own = (0, "error", rank_message(e))
        every = self.wire.gather((*own, self.part.participant, self.pinned))
        chunk = agree_chunk(every)
        if chunk is not None:
            plan = self.plan_alone(n_tokens, slab=slab, chunk=chunk, policy=policy)
            pp = plan.participants[0]
        else:
            parts = [e[3] for e in every]
            reserve = scratch_reserve(self.shape, {p.name: self.device for p in parts},
                                      self.cfg.ffn, slab, self.layouts)
            plan = plan_prompt(self.layout, parts, self.cfg, pinned=all(e[4] for e in every),
                               fused=self.fused, native=self.pack.native, n_tokens=n_tokens,
                               scratch_reserve=reserve, policy=policy)
            pp = plan.participants[self.rank]
        if not pp.fits:   # the smaller chunk fits wherever the larger did; a bug otherwise
            raise StrataError(f"rank {self.rank}: the agreed chunk {plan.chunk} does not fit: "
                              f"{plan.short_of()} (a bug)")
        return plan, pp

    # -- a prompt ----------------------------------------------------------------------------
    def warmup(self, n_tokens: int, *, seed: int = 0) -> float:
        """Every rank together, before a prompt of n_tokens is timed: a dry prompt of the chunk
        sizes that prompt reads (strata.engine.warm.dry_tokens) through the prompt's own plan,
        loan, carve and ring, so its kernels are compiled and loaded and the timed read pays
        none of it. An ordinary read with the hand-offs (the cache ends byte for byte as it
        started). Returns its seconds (0.0 when this length's plan was warmed already). What it
        does not cover: the long-prefix attention launches of host-held KV (the one-process
        warm-up's probes, strata.engine.warm.WarmKV) compile in the timed read."""
        policy = engine_policy(self.cfg)
        plan, pp = self.plan(n_tokens, slab=policy.slab, policy=policy)
        C = plan.chunk
        key = (C, pp.ring, n_tokens % C if n_tokens > C else n_tokens)
        if key in self._warm:
            return 0.0
        g = torch.Generator().manual_seed(seed)
        dry = torch.randint(0, self.shape.vocab, (dry_tokens(n_tokens, C),), generator=g)
        t0 = time.perf_counter()
        with torch.inference_mode():
            self.run(dry, logits="last", planned=(plan, pp))
        self._warm.add(key)
        return time.perf_counter() - t0

    def run(self, tokens, *, logits: str = "all", fail_after_layers: int | None = None,
            planned: tuple | None = None) -> StageResult:
        """Read `tokens` (1-D ids, the same on every rank). logits: "all" | "last" | "none"
        (the last rank returns them). `fail_after_layers`: this rank fails with an allocation
        error after that many layer batches (tests of the failure path). `planned`: (plan,
        this rank's ParticipantPlan) to read under instead of the prompt's own (the warm-up:
        the real prompt's; every rank passes one)."""
        if logits not in ("all", "last", "none"):
            raise StrataError(f"logits must be all, last or none, got {logits!r}")
        tokens = torch.as_tensor(tokens, dtype=torch.int64)
        T = tokens.numel()
        own_error = None
        try:
            tokens = self.model.check_tokens(tokens)
            if T > self.cfg.max_prompt:
                raise StrataError(f"the prompt has {T} tokens but this engine reserved KV for "
                                  f"{self.cfg.max_prompt}; raise max_prompt (--max-prompt)")
            policy = engine_policy(self.cfg)      # the prompt's launch choices, read now
        except StrataError as e:
            own_error = rank_message(e)
        raise_first(list(enumerate(self.wire.gather(own_error))), self.world)
        slab = policy.slab
        plan, pp = planned if planned is not None else self.plan(T, slab=slab, policy=policy)
        chunk = plan.chunk
        res = StageResult(None, plan, chunk, pp.ring, self.rank, self.world, self.layers,
                          PrefillStats(tokens=T))
        error = None
        with PromptSession([self.part], [pp], self.layout, chunk, self.cfg.lend_cap,
                           shape=self.shape, host=self.host, layouts=self.layouts,
                           land=self.land, slab=slab,
                           stage_below=plan.stream_all_min) as session:
            try:
                session.open(fail_after_layers)
                res.memory.extend(session.memory)
            except Exception as e:   # noqa: BLE001 — every rank must hear of it
                error = rank_message(e)
            error = self._read(tokens, chunk, session, logits, res, error)
            session.settle(res.stats)
        raise_first(list(enumerate(self.wire.gather(error))), self.world)
        return res

    def _read(self, tokens, chunk: int, session: PromptSession, logits: str, res: StageResult,
              error: str | None) -> str | None:
        """The chunk loop of this rank through `session`'s provider and KV; returns its own
        error (None: it read every chunk). A rank in error keeps receiving (and dropping) and
        sends "failed" headers."""
        T = tokens.numel()
        s = self.shape
        provider = session.provider       # None: its share failed to open
        kv = out = None
        try:
            kv = session.new_kv(T, self._prompt_kv, self.model, self.cfg.kv)
            if self.last and logits != "none":
                out = torch.zeros(T if logits == "all" else 1, s.vocab, dtype=torch.float32,
                                  device=self.device)
        except Exception as e:   # noqa: BLE001 — every rank must hear of it
            error = error or rank_message(e)
        sends: list = []
        upstream_ok = True
        seq = self.dcfg.schedule == SEQUENTIAL
        t_start = time.perf_counter()
        guard = self.finite.begin(s.n_layer)
        if provider is not None:
            provider.begin_prompt(T, min(chunk, T))
        for start in range(0, T, chunk):
            n = min(chunk, T - start)
            x = None
            if not self.first:
                t0 = time.perf_counter()
                ok, x = self.wire.recv(n, error is None and upstream_ok)
                res.handoff_s += time.perf_counter() - t0
                upstream_ok = upstream_ok and ok
            if error is None and upstream_ok:
                try:
                    t0 = time.perf_counter()
                    provider.begin_chunk(kv.length, n)
                    if self.first:
                        x = self.model.embed(tokens[start:start + n])
                    # the NaN guard sees this rank's layers (its chunk named for the message)
                    guard._chunk = (start, n)
                    x = self.model.forward_layers(x.to(self.device), kv, provider, self.layers,
                                                  observer=guard)
                    guard.check()
                    provider.end_chunk()
                    kv.commit(n)
                    if out is not None:
                        last = start + n == T
                        mode = logits if logits != "last" else ("last" if last else "none")
                        y = self.model.head(x, mode)
                        if mode == "all":
                            out[start:start + n] = y
                        elif mode == "last":
                            out[:] = y
                    _sync(self.device)
                    res.compute_s += time.perf_counter() - t0
                except Exception as e:   # noqa: BLE001 — every rank must hear of it
                    error = rank_message(e)
            if not self.last:
                t0 = time.perf_counter()
                healthy = error is None and upstream_ok
                sends += self.wire.send(x if healthy else None)
                res.handoff_bytes += x.numel() * x.element_size() if healthy else 0
                # sequential: this chunk is handed off before the next; pipelined: at most
                # two chunks in flight (their buffers stay referenced until sent)
                keep = 0 if seq else 2 * 2
                while len(sends) > keep:
                    self.wire.wait(sends.pop(0))
                res.handoff_s += time.perf_counter() - t0
            if seq and not self.wire.all_ok(error is None and upstream_ok):
                break   # every rank leaves after the same chunk
        for w in sends:
            self.wire.wait(w)
        if provider is not None:
            provider.end_prompt(error is None)
        res.stats.seconds = time.perf_counter() - t_start
        res.logits = out
        return error

    def _prompt_kv(self, T: int, stages: dict) -> PromptKV | None:
        """This rank's PromptKV for a prompt of T tokens, for its layers only, when one process
        keeps one with the same flags (strata.engine.prompt_kv); None: the model's own cache."""
        if not uses_prompt_kv(self.shape, self.cfg):
            return None
        return new_prompt_kv(self.shape, self.cfg, self.layout.sizes, T, layers=self.layers,
                             vram=self.part.budget.vram, devices=self.model.layer_devices,
                             stages=stages, lanes={l: self.part.lane for l in self.layers},
                             pin=self.pinned and self.device.type == "cuda")


def load_stage(pack, layers: range, *, device, dtype, ffn, layer_blocks: bool = False):
    """The model of one pipeline stage, of the pack's architecture (the registry's class, loaded
    as the one-process engine loads it): the dense weights of `layers` on `device`, every other
    layer's on the meta device (shapes only: never read from the pack, no memory), the
    embeddings with the first layer and the output norm + LM head with the last, so only the
    first and the last rank hold them."""
    pack = open_pack(pack)
    meta = torch.device("meta")
    device_map = [device if l in layers else meta for l in range(pack.shape.n_layer)]
    return load_model(pack, device=device, dtype=dtype, ffn=ffn, device_map=device_map,
                      layer_blocks=layer_blocks)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def bubble(schedule: str, n_chunks: int, world: int) -> float:
    """The idle fraction of a rank under equal stage times: sequential (W-1)/W; pipelined the
    fill and drain, (W-1)/(n_chunks + W - 1)."""
    if schedule == SEQUENTIAL:
        return (world - 1) / world
    return (world - 1) / (n_chunks + world - 1)


def fmt_stage(res: StageResult) -> str:
    return (f"rank {res.rank}/{res.world} layers {res.layers.start}-{res.layers.stop - 1}: "
            f"compute {res.compute_s:.3f} s, hand-off {res.handoff_s:.3f} s "
            f"({fmt_bytes(res.handoff_bytes)} sent)")
