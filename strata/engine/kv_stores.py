"""A prompt's KV read out of, and written back into, the stores the engine keeps it in: the
model's KVCache (GQA), its MLACache (the latent and rope key) and the engine's PromptKV (either,
a resident window in VRAM and the older tokens in host memory, sliding layers as rings), and
the recurrent state a hybrid's linear-attention layers keep instead of KV (the cache's
`states`, strata.models.layer_state).

Every store is seen in one form, PromptKV's token-major one: per layer the parts of
kv_token_parts (k [n, Hkv, hd], v [n, Hkv, Hv], and under int8 k_scale, v_scale [n, Hkv]; MLA is
one "head": c [n, 1, Lkv], k_pe [n, 1, R], c_scale, k_pe_scale [n, 1]) of the positions the
layer holds, start..P-1 (start 0 for a full layer, P - min(P, W - 1) for a sliding one, P for
a linear-attention layer: it holds no position, its state stands after position P - 1).

A linear layer's state is two whole tensors, conv [K-1, C] (the activations' dtype) and S
[Hv, dk, dv] fp32, as they stand after the last position read: it cannot be cut back to an
earlier position, so a state restores only whole (reusable: n == saved).

    layout = store_layout(cache)                  # kind, heads, dims, dtype, windows
    for l in range(n_layer):
        start, pieces = layer_pieces(cache, l)    # per part: its tensors in position order
    restore(cache, n, get)                        # get(l, part, a, b) -> rows a..b (positions)
    lin = state_layout(cache)                     # None, or the linear layers and their dtypes
    for name, t in state_pieces(cache): ...       # state.<l>.conv, state.<l>.S
    restore_states(cache, got)                    # got(l, "conv" | "S") -> the saved tensor

`layer_pieces` hands out the host-held part of a PromptKV as the pinned host tensor itself (a
file writer copies it from there, never through VRAM) and the resident part as its device view.
"""
from __future__ import annotations

import torch

from strata.errors import StrataError
from strata.models.kv import NO_KV, KVCache, PromptKV
from strata.models.mla import MLACache

GQA_PARTS = ("k", "v", "k_scale", "v_scale")
MLA_PARTS = ("c", "k_pe", "c_scale", "k_pe_scale")
DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float32: "fp32"}
STATE_PARTS = ("conv", "S")


def store_layout(cache, shape) -> dict:
    """What a state file's KV is: {kind gqa | mla, heads, key_dim, value_dim, dtype, parts,
    windows} (the manifest's `kv`)."""
    mla = bool(shape.mla)
    heads, key_dim, value_dim = shape.kv_heads if mla else (shape.n_kv_head, shape.head_dim,
                                                            shape.head_dim)
    if isinstance(cache, PromptKV):
        dtype = cache.kv
    elif isinstance(cache, MLACache):
        dtype = cache.kv or DTYPE_NAMES[cache.c[0].dtype]
    elif isinstance(cache, KVCache):
        dtype = DTYPE_NAMES[cache.k[0].dtype]
    else:
        raise StrataError(f"cannot save the KV of a {type(cache).__name__}")
    names = MLA_PARTS if mla else GQA_PARTS
    return {"kind": "mla" if mla else "gqa", "heads": heads, "key_dim": key_dim,
            "value_dim": value_dim, "dtype": dtype,
            "parts": list(names[:4 if dtype == "int8" else 2]),
            "windows": list(getattr(cache, "windows", (0,) * shape.n_layer))}


def _held(P: int, window: int) -> int:
    """Tokens a layer holds after P positions (a sliding one its last W - 1)."""
    return min(P, window - 1) if window else P


def layer_pieces(cache, layer: int) -> tuple[int, list[list[torch.Tensor]]]:
    """(start, per part the tensors whose rows, joined, are positions start..P-1 token-major)."""
    P = cache.length
    if getattr(cache, "windows", None) and cache.windows[layer] == NO_KV:
        return P, []
    if isinstance(cache, PromptKV):
        return _prompt_kv_pieces(cache, layer, P)
    if isinstance(cache, MLACache):
        stores = cache._stores()
        return 0, [[s[layer][:P][:, None] if i < 2 else s[layer][:P]]
                   for i, s in enumerate(stores)]
    W = cache.windows[layer]
    n = _held(P, W)
    return P - n, [[cache.k[layer][:, :n].transpose(0, 1)], [cache.v[layer][:, :n].transpose(0, 1)]]


def _prompt_kv_pieces(kv: PromptKV, layer: int, P: int):
    kv.settle()                 # a restore's host-held rows are written before they are read
    W = kv.windows[layer]
    if W:
        R, n = kv.kept[layer], _held(P, W)
        slots = [p % R for p in range(P - n, P)]
        idx = torch.tensor(slots, dtype=torch.int64)
        return P - n, [[t[idx.to(t.device)]] for t in kv.resident[layer]]
    h = min(P, kv.held[layer])
    out = []
    for host, res in zip(kv.hosted[layer], kv.resident[layer]):
        pieces = [host[:h]] if h else []
        if P > h:
            pieces.append(res[:P - h])
        out.append(pieces)
    return 0, out


def restore(cache, n: int, get) -> None:
    """Positions 0..n-1 of every layer back into an empty `cache` (its capacity counts them
    and what follows), then its length set to n: `get(layer, part_index, a, b)` gives rows of
    positions a..b token-major (host tensors). The device-resident rows of every layer go up in
    one staged bulk copy a device (strata.engine.pinning.stage_to_device, not one pageable copy
    a layer) before it returns. A PromptKV's host-held rows are copied host to host by one
    thread beside the read that follows, layer by layer in the order the read needs them: the
    layer's first stage waits for its rows (PromptKV.stage), so the copy of the older tokens (5
    GB at 131K under a 32K window) hides under the read instead of preceding it."""
    if cache.length:
        raise StrataError("the KV is restored into an empty cache only")
    n_layer = len(cache.windows) if hasattr(cache, "windows") else len(cache.c)
    ups: list = []              # (device destination, host rows) of a PromptKV's resident rows
    beside: list = []           # (layer, [(host destination, its rows' get args)]) of PromptKV
    for l in range(n_layer):
        if getattr(cache, "windows", None) and cache.windows[l] == NO_KV:
            continue            # a linear layer: its state is restore_states'
        if isinstance(cache, PromptKV):
            if l in cache.mine:
                up, host = _restore_prompt_kv(cache, l, n, get)
                ups += up
                if host:
                    beside.append((l, host))
        elif isinstance(cache, MLACache):
            for i, s in enumerate(cache._stores()):
                x = get(l, i, 0, n)
                s[l][:n] = (x[:, 0] if i < 2 else x).to(s[l].device)
        else:
            W = cache.windows[l]
            m = _held(n, W)
            for i, store in enumerate((cache.k, cache.v)):
                x = get(l, i, n - m, n).transpose(0, 1).to(store[l].device)
                if cache.capacity is None:
                    store[l] = x.clone()
                else:
                    store[l][:, :m] = x
    _upload(ups)
    cache.length = n
    if beside:
        _restore_beside(cache, beside, get)


def _restore_beside(kv: PromptKV, jobs: list, get) -> None:
    """Each layer's host-held rows written by one thread, in layer order, under the caller's
    inference mode (a restore under torch.inference_mode writes inference tensors); each
    layer's Future goes to kv.restoring."""
    from concurrent.futures import ThreadPoolExecutor

    from strata.engine.pinning import in_callers_mode

    def copy(pairs) -> None:
        for dst, args in pairs:
            dst.copy_(get(*args))

    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="strata-restore")
    run = in_callers_mode(copy)
    for layer, pairs in jobs:
        kv.restoring(layer, pool.submit(run, pairs))
    pool.shutdown(wait=False)   # the thread ends with its last layer


def _upload(pairs: list) -> None:
    """Each (dst, src): dst.copy_(src); the contiguous destinations of one device in one staged
    bulk copy (strata.engine.pinning.stage_to_device), any other one by one."""
    from strata.engine.pinning import stage_to_device
    by_device: dict = {}
    for dst, src in pairs:
        if dst.is_contiguous():
            by_device.setdefault(dst.device, []).append((dst, src))
        else:
            dst.copy_(src)
    for device, group in by_device.items():
        stage_to_device(group, device)


def _restore_prompt_kv(kv: PromptKV, layer: int, n: int, get) -> tuple[list, list]:
    """`layer`'s resident rows as (device destination, host rows) pairs for restore's bulk
    upload, and its host-held rows as (host destination, get's arguments) pairs for the copy
    beside the read. A sliding layer's ring holds position p at slot p % R: the held rows land
    in at most two runs of slots."""
    W = kv.windows[layer]
    ups, host_rows = [], []
    if W:
        R, m = kv.kept[layer], _held(n, W)
        if not m:
            return ups, host_rows
        if m > R:
            raise StrataError(f"layer {layer} keeps {R} positions of its window, not {m}")
        first = (n - m) % R
        a = min(m, R - first)                  # the run up to the ring's end, then its start
        for i, dst in enumerate(kv.resident[layer]):
            rows = get(layer, i, n - m, n)
            ups.append((dst[first:first + a], rows[:a]))
            if m > a:
                ups.append((dst[:m - a], rows[a:]))
        return ups, host_rows
    h = min(n, kv.held[layer])
    for i, (host, res) in enumerate(zip(kv.hosted[layer], kv.resident[layer])):
        if h:
            host_rows.append((host[:h], (layer, i, 0, h)))
        if n > h:
            ups.append((res[:n - h], get(layer, i, h, n)))
    return ups, host_rows


def reusable(n: int, saved: int, starts: list[int], windows: list[int]) -> bool:
    """Whether positions 0..n-1 can be rebuilt from a state of `saved` positions whose layers
    start at `starts`: a sliding layer needs its last W - 1 positions before n, which the state
    holds only when its start is at or before n - (W - 1) (or it kept every position); a
    linear layer's recurrent state stands after the saved prompt's last position only, so a
    model with one reuses the whole saved prompt or nothing."""
    if n > saved:
        return False
    return all(n == saved if w == NO_KV else (not w or s == 0 or n - _held(n, w) >= s)
               for s, w in zip(starts, windows))


def state_layout(cache) -> dict | None:
    """What a state file's recurrent state is (the manifest's `linear`): {layers, conv: {dtype,
    shape}, S: {dtype, shape}}; None for a cache without linear layers."""
    states = getattr(cache, "states", None)
    if states is None or not states.S:
        return None
    layers = sorted(states.S)
    first = {"conv": states.conv[layers[0]], "S": states.S[layers[0]]}
    return {"layers": layers, **{name: {"dtype": DTYPE_NAMES[t.dtype], "shape": list(t.shape)}
                                 for name, t in first.items()}}


def state_pieces(cache) -> list[tuple[str, torch.Tensor]]:
    """(state.<l>.conv | S, the tensor on its layer's device) for every linear layer kept."""
    states = getattr(cache, "states", None)
    if states is None:
        return []
    return [(f"state.{l}.{name}", getattr(states, name)[l])
            for l in sorted(states.S) for name in STATE_PARTS]


def restore_states(cache, got) -> None:
    """Every linear layer's conv state and S back into `cache.states` (the ones the engine
    allocated and the plan counted), from `got(layer, "conv" | "S")`; a saved tensor of another
    shape or dtype is refused in one line."""
    states = getattr(cache, "states", None)
    if states is None:
        return
    for l in sorted(states.S):
        for name in STATE_PARTS:
            dst, src = getattr(states, name)[l], got(l, name)
            if src.shape != dst.shape or src.dtype != dst.dtype:
                raise StrataError(f"layer {l}'s saved {name} state is {_name(src.dtype)} "
                                  f"{list(src.shape)} but this run keeps {_name(dst.dtype)} "
                                  f"{list(dst.shape)}; read the prompt again")
            dst.copy_(src.to(dst.device))


def _name(dtype: torch.dtype) -> str:
    return DTYPE_NAMES.get(dtype, str(dtype).removeprefix("torch."))
