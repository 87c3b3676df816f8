"""What a prefill run is configured by (EngineConfig; the CLI fills it from its flags) and what
it resolves to on a device: the dense dtype, the one KV dtype every cache of the run keeps, the
launch choices of a prompt starting now (the environment's STRATA_* knobs, read once as a
RingPolicy), the participants' devices.

    cfg = resolved(EngineConfig(vram=12 << 30), "cuda")    # kv "auto" -> the dense dtype's
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from strata import config
from strata.errors import StrataError
from strata.kernels.attention.kv_int8 import resolve_kv
from strata.memory import RingPolicy
from strata.memory.kv_window import KVChoice, parse as parse_window
from strata.memory.rig import RESERVE
from strata.models.moe import ExpertFFNs, ffn_named
from strata.planning import KVPolicy

DENSE_LAYERS = ("blocks", "decoded")


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
    kv_resident: int | str | None = "auto"   # tokens of KV per full layer in VRAM (None or
                                       # "all": all; "auto": the largest window the plan leaves,
                                       # strata.memory.kv_window; prompt_plan.resolve_kv sets
                                       # it); the rest in pinned host memory
    kv_choice: KVChoice | None = None  # what auto chose and why (set with the window it chose)
    reserve: int = RESERVE             # CUDA context, allocator slack, attention workspace
    device: str | None = None          # cuda when available
    devices: list[str] | None = None   # one per participant (default: cuda:0.. or cpu)
    layer_split: list[int] | None = None  # layers per participant (default: by VRAM)
    dtype: torch.dtype | None = None   # dense math: bf16 on CUDA, fp32 on the CPU
    ffn: str | ExpertFFNs = "auto"     # expert FFN: auto | kernel | decoded | plane | int8 |
                                       # plane-int8 | torch | ref,
                                       # held as its object (strata.models.moe.EXPERT_FFNS)
    batch: int | None = None           # experts per streamed batch (default ring // 2)
    slab: bool | None = None           # scratch slab from the loan's tail; None: STRATA_MMQ_SLAB
    dense_layers: str = "blocks"       # a layer's matrices held as blocks, on CUDA: "blocks"
                                       # (kept so, decoded for the layer's turn) | "decoded"
                                       # (decoded once at load); strata.models.block_weight
    progress: bool = False

    def __post_init__(self):
        # one VRAM budget or one per participant, held as a list once, read as one everywhere
        self.vram = list(self.vram) if isinstance(self.vram, (list, tuple)) else [self.vram]
        # the FFN's name read once, here: the planner and the engine read its declaration
        self.ffn = ffn_named(self.ffn)
        # "all", "auto" or N, as the flag is written; a bad one is one line here
        self.kv_resident = parse_window(self.kv_resident) if isinstance(self.kv_resident, str) \
            else self.kv_resident
        if self.dense_layers not in DENSE_LAYERS:
            raise StrataError(f"--dense-layers {self.dense_layers!r}: use one of "
                              f"{', '.join(DENSE_LAYERS)}")


def dense_dtype(cfg: EngineConfig, device_type: str) -> torch.dtype:
    """The dense math's dtype: --dtype, else bf16 on CUDA and fp32 on the CPU."""
    return cfg.dtype or (torch.bfloat16 if device_type == "cuda" else torch.float32)


def layer_blocks(cfg) -> bool:
    """Whether a read keeps a layer's block-format matrices as blocks (--dense-layers): the
    load (strata.engine.load.load_model) and the plan's count (kept_bytes) both ask. `cfg`: an
    EngineConfig, or the parsed flags of an all-resident read (both carry dense_layers)."""
    return cfg.dense_layers == "blocks"


def resolved(cfg: EngineConfig, device_type: str) -> EngineConfig:
    """The config with its KV dtype resolved (auto -> the dense dtype's: kv_int8.resolve_kv), the
    one dtype the plan counts and every cache of the run allocates, and its expert FFN as it runs
    on `device_type` (auto: the reference on the CPU, as the CLI's --experts)."""
    return replace(cfg, kv=resolve_kv(cfg.kv, dense_dtype(cfg, device_type)),
                   ffn=cfg.ffn.on(device_type))


def kv_policy(cfg: EngineConfig, device_type: str = "cpu") -> KVPolicy:
    """The KV dtype (resolved for `device_type`) and resident window the config names, for
    prompts up to cfg.max_prompt (auto resolved first: strata.engine.prompt_plan.resolve_kv)."""
    if cfg.kv_resident == "auto":
        raise StrataError("--kv-resident auto is chosen from the plan: resolve it first "
                          "(strata.engine.prompt_plan.resolve_kv)")
    return KVPolicy(resolved(cfg, device_type).kv, cfg.kv_resident, cfg.max_prompt)


def engine_policy(cfg: EngineConfig) -> RingPolicy:
    """The launch choices of a prompt starting now: the environment's (strata.config.ring_policy),
    the slab EngineConfig.slab when set (else STRATA_MMQ_SLAB). A bad value: StrataError."""
    return config.ring_policy(slab=cfg.slab)


def default_devices(device: str | None, n: int) -> list[str]:
    """n participants: cuda:0..n-1 when CUDA is there (and no device named), else the named
    device (or cpu) n times — two simulated participants on the CPU share its memory."""
    if device is None and torch.cuda.is_available():
        if n > torch.cuda.device_count():
            raise StrataError(f"{n} --vram budgets but only {torch.cuda.device_count()} GPUs are "
                              f"visible")
        return [f"cuda:{i}" for i in range(n)]
    return [device or "cpu"] * n
