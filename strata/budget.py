"""Budgets against the machine: checked before anything is allocated or pinned.

`--vram` is what a GPU may use; the machine must also have it. Before the engine allocates its
cache or pins the host blobs, `check_machine` compares each item with what the machine has and
refuses with one line naming the item that does not fit:

- host: the expert blobs to pin (GPU runs; on the CPU they stay memory-mapped pack pages), the
  KV outside the resident window (`--kv-resident`: pinned host memory), the dense weights (on
  the CPU), and on the CPU the expert cache and the resident KV as well; when the host-held KV
  is what does not fit, the line names the KV bytes, the VRAM and the host RAM (`check_kv_host`);
- device (CUDA): dense + KV + cache + reserve of each GPU against its free memory.

On the CPU, `--vram` is a budget, not an allocation: `cpu_cache_cap` caps the cache at every
expert of the participant's layers plus the working set of the largest prompt chunk (ring and
activations; a cache larger than that holds nothing more), so `--vram 12GiB` for a 230 KB model
allocates kilobytes, not 12 GB.

Host memory is read from /proc/meminfo (MemAvailable), else os.sysconf; no extra dependency.
"""
from __future__ import annotations

import os

import torch

from strata.errors import StrataError
from strata.hostmem import host_available  # noqa: F401  (strata.budget's callers use it)
from strata.memory.carve import align_up
from strata.units import fmt_bytes

SLACK = 1 << 20   # alignment and allocator rounding above the working set


def cpu_cache_cap(shape, blob_sizes, layers: range, layout, *, chunk: int, ring_slots: int,
                  lend_cap: float) -> int:
    """The most cache a CPU participant can use: every expert slot of its layers, plus the
    working set of one chunk (PromptLayout.bytes_needed, the same count the carve executes)
    scaled by the lend cap, plus slack."""
    slots = sum(align_up(int(blob_sizes[l])) for l in layers) * shape.n_expert
    work = layout.bytes_needed(chunk, ring_slots)
    return slots + int(work / lend_cap) + SLACK


def check_room(shape, vram, *, reserve: int, kv_tokens: int, split) -> None:
    """Each GPU's VRAM against its dense weights, the KV of `kv_tokens` and the reserve, from
    the rig's own count (strata.memory.rig.budgets with an explicit cache, which skips its own
    check): one line naming the KV when the KV is what leaves no room for a cache."""
    from strata.memory.rig import budgets
    for b in budgets(shape, vram, cache=1, reserve=reserve, kv_tokens=kv_tokens, split=split):
        left = b.vram - b.dense - b.reserve - b.kv
        if left <= 0:
            raise StrataError(
                f"{b.name} ({fmt_bytes(b.vram)}) has no room for an expert cache: the KV cache of "
                f"{kv_tokens:,} tokens takes {fmt_bytes(b.kv)}, the dense weights "
                f"{fmt_bytes(b.dense)} and the reserve {fmt_bytes(b.reserve)}; give more --vram, "
                f"add GPUs, read a shorter prompt (--max-prompt), or keep less KV in VRAM "
                f"(--kv int8, --kv-resident N)")


def check_fits(items: dict[str, int], available: int | None, where: str, advice: str) -> None:
    """Refuse when the items' sum exceeds `available`, naming the largest item."""
    if available is None:
        return
    need = sum(items.values())
    if need <= available:
        return
    big = max(items, key=items.get)
    parts = ", ".join(f"{k} {fmt_bytes(v)}" for k, v in items.items() if v)
    raise StrataError(f"{where} has {fmt_bytes(available)} available but this run needs "
                      f"{fmt_bytes(need)} ({parts}); the {big} does not fit: {advice}")


def check_kv_host(host_kv: int, kv_vram: int, vram: int, other: int, available: int | None,
                  n_tokens: int) -> None:
    """The KV kept in host memory (`host_kv` bytes, all layers) beside `other` host bytes against
    `available`: one line naming the KV bytes (resident and host), the VRAM and the host RAM."""
    if available is None or not host_kv or host_kv + other <= available:
        return
    raise StrataError(
        f"the KV cache of {n_tokens:,} tokens takes {fmt_bytes(kv_vram + host_kv)} "
        f"({fmt_bytes(kv_vram)} resident in {fmt_bytes(vram)} of VRAM, {fmt_bytes(host_kv)} in "
        f"host memory) but the host has {fmt_bytes(available)} available beside "
        f"{fmt_bytes(other)} of other host memory: use --kv int8, a larger --kv-resident (with "
        f"more --vram), a shorter prompt (--max-prompt), or a machine with more RAM")


def check_machine(budgets, devices, *, host_blobs: int, pin: bool, dense_host: int,
                  host_kv: int = 0, kv_tokens: int = 0) -> None:
    """Every budget against the machine, before any allocation or pinning (see module doc).
    `budgets`: strata.memory.rig.GpuBudget per participant; `devices` theirs;
    `host_blobs`: bytes of every expert blob; `dense_host`: dense weights as the CPU holds them;
    `host_kv`: bytes of the KV held in host memory for a prompt of `kv_tokens` (all layers)."""
    cpu = [b for b, d in zip(budgets, devices) if d.type != "cuda"]
    host = {}
    if any(d.type == "cuda" for d in devices) and pin:
        host["host blobs (pinned)"] = host_blobs
    if cpu:
        host["dense weights"] = dense_host
        host["KV cache"] = sum(b.kv for b in cpu)
        host["expert cache"] = sum(b.cache for b in cpu)
    available = host_available()
    check_kv_host(host_kv, sum(b.kv for b in budgets), sum(b.vram for b in budgets),
                  sum(host.values()), available, kv_tokens)
    if host_kv:
        host["KV (host)"] = host_kv
    check_fits(host, available, "host memory",
               "give a smaller --vram/--cache (on the CPU they are host memory), a shorter "
               "--max-prompt, --unpinned, or a machine with more RAM")
    for b, d in zip(budgets, devices):
        if d.type != "cuda":
            continue
        free, _ = torch.cuda.mem_get_info(d)
        # blocks this process's caching allocator holds but no tensor uses are free to it
        free += torch.cuda.memory_reserved(d) - torch.cuda.memory_allocated(d)
        check_fits({"dense weights": b.dense, "KV cache": b.kv, "expert cache": b.cache,
                    "reserve": b.reserve}, free, f"{d} ({b.name})",
                   "give a smaller --vram or --cache (the budget must fit the GPU's free memory)")
