"""Which KV a prompt keeps, and the engine's own made for some layers: PromptKV (chunk_attention
over bf16/int8 segments, a resident window, the older tokens host-held) under --kv int8 or
--kv-resident, else the model's own cache. The single-process engine keeps every layer's, a
pipeline stage its own layers' (the others keep nothing).

    if uses_prompt_kv(shape, cfg):
        kv = new_prompt_kv(shape, cfg, sizes, T, layers=..., vram=..., devices=..., stages=...,
                           lanes=..., pin=...)
"""
from __future__ import annotations

import torch

from strata.budget import check_kv_host, host_available
from strata.engine.engine_config import EngineConfig
from strata.engine.host_kv import HostKVArena
from strata.kernels.attention.kv_int8 import kv_token_parts
from strata.models.kv import PromptKV, kv_windows
from strata.models.layer_state import new_states, state_dtype
from strata.planning import KVPolicy


def uses_prompt_kv(shape, cfg: EngineConfig) -> bool:
    """The engine's own KV (PromptKV: chunk_attention over bf16/int8 segments) whenever
    --kv int8 or a resident window is kept (--kv-resident N, or the window auto chose); the default bf16, all-resident run keeps the model's
    KVCache and its attention (the path every engine test and device run so far measured),
    until PromptKV's own device run says it may be the default. MLA keeps its own cache (bf16
    or int8: strata.models.mla) unless --kv-resident asks for a host-held window: PromptKV over
    the latent (PromptKV.attend_latent)."""
    # an unresolved auto keeps no window yet (the engines resolve it first: resolve_kv)
    window = cfg.kv_resident is not None and cfg.kv_resident != "auto"
    if shape.mla:
        return window
    return cfg.kv == "int8" or window


def host_kv_arena(shape, kv: KVPolicy, sizes, *, layers, vram: int, pin: bool
                  ) -> HostKVArena | None:
    """The engine's pinned host KV (strata.engine.host_kv): per full layer of `layers`, the
    host share of a kv.max_prompt-token prompt as the planner counts it (KVPolicy.host_tokens,
    kv_token_parts: its bytes are sizes.kv_host's, a test holds them equal); checked against
    the host's memory (strata.budget.check_kv_host) before anything is pinned. None: no layer
    keeps tokens in host memory."""
    n, mine = kv.max_prompt, set(layers)
    caps = {l: kv.host_tokens(n, w) for l, w in enumerate(kv_windows(shape)) if l in mine}
    if not n or not any(caps.values()):
        return None
    heads, key_dim, value_dim = shape.kv_heads
    arena = HostKVArena(caps, kv_token_parts(kv.dtype, heads, key_dim, value_dim), pin=pin)
    check_kv_host(sizes.kv_host_all(n, layers), sizes.kv_vram(n, layers), vram, 0,
                  host_available(), n)
    return arena


def new_prompt_kv(shape, cfg: EngineConfig, sizes, n_tokens: int, *, layers, vram: int, devices,
                  stages: dict, lanes: dict, pin: bool, make=PromptKV, host_arena=None
                  ) -> PromptKV:
    """A prompt's engine-owned KV (made by `make`, PromptKV's signature) keeping `layers` (the
    others are another process's: they keep nothing). Its host-held part views `host_arena`
    (host_kv_arena: pinned once, checked then) where given; else it is checked against the
    host's memory before anything is pinned (strata.budget.check_kv_host)."""
    if host_arena is None:
        check_kv_host(sizes.kv_host_all(n_tokens, layers), sizes.kv_vram(n_tokens, layers), vram,
                      0, host_available(), n_tokens)
    heads, key_dim, value_dim = shape.kv_heads    # MLA: one "head", the latent and rope key
    kv = make(shape.n_layer, heads, key_dim, n_tokens, kv=cfg.kv, resident=cfg.kv_resident,
              devices=devices, stages=stages, lanes=lanes, pin=pin, windows=kv_windows(shape),
              value_dim=value_dim, layers=layers, host_arena=host_arena)
    # linear-attention layers' recurrent state, its conv part in the activations' dtype
    # (state_dtype: fp32 beside fp32 KV, else bf16; the count the plan charges)
    try:
        kv.states = new_states(shape, dtype=state_dtype(cfg.kv, torch.bfloat16),
                               devices=devices, layers=layers)
    except BaseException:
        kv.release()        # lets the engine's host KV arena go
        raise
    return kv
