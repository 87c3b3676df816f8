"""strata's memory manager: expert cache, loan, carve, prompt layout, ring, auto scan, scratch pool.

    cache.py   ExpertCache / CacheLayout: one device buffer of whole per-layer-sized slots
    loan.py    Loan: whole slots from the cache's top (lend cap 0.9), refilled after the prompt
    sizes.py   Sizes: what the model and its kernels tell memory (dims, KV, dense bytes)
    layout.py  PromptLayout: the prompt path's buffers as data; bytes_needed reads it
    carve.py   Carve: bump allocator over the loan executing the layout; the tail
    ring.py    ring_slots / chunk_ring / stream_all_min: the ring as a byte budget; RingPolicy
    scan.py    plan_prefill: auto (bisection) / fallback / legacy / forced chunk + ring
    pool.py    SlabPool / size_class: stream-k scratch from the loan's tail (SlabPool.dry counts)
    rig.py     participants of a rig: layer split, dense weights, cache size from VRAM
    kv_window.py  --kv-resident auto: the resident KV window chosen from plans (KVChoice)

Memory knows no model and no kernel: the buffers (a LayoutSpec) and every size taken from a
model or a kernel arrive from outside (strata.planning assembles them). It reads no environment:
the launch choices arrive as a RingPolicy (strata.config.ring_policy builds it).
"""
from strata.memory.cache import CacheLayout, ExpertCache, synthetic_source
from strata.memory.carve import Carve, Placement, Tail
from strata.memory.layout import Buf, LayoutSpec, Phase, PromptLayout
from strata.memory.loan import LEND_CAP, Loan
from strata.memory.pool import SlabPool, ordinary_alloc, scratch_allocator, size_class
from strata.memory.ring import (RING_MAX, RING_MIN, STAGE, RingPolicy, chunk_ring, ring_budget,
                                ring_cap, ring_slots, stream_all_min, use_fused)
from strata.memory.scan import Participant, Plan, plan_prefill
from strata.memory.sizes import Sizes

__all__ = ["Buf", "CacheLayout", "Carve", "ExpertCache", "LEND_CAP", "LayoutSpec",
           "Loan", "Participant", "Phase", "Placement", "Plan", "PromptLayout", "RING_MAX",
           "RING_MIN", "RingPolicy", "STAGE", "SlabPool", "Sizes", "Tail", "chunk_ring",
           "ordinary_alloc", "plan_prefill", "ring_budget", "ring_cap", "ring_slots",
           "scratch_allocator", "size_class", "stream_all_min", "synthetic_source", "use_fused"]
