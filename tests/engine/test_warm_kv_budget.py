"""The warm-up's KV stays inside what the plan counts for the real prompt: WarmKV's stores (on
the meta device: counted, not allocated) hold at most the real prompt's bytes
(sizes.kv_vram / kv_host_all of the real prompt, the plan's count), and every resident prefix a
probe of the real prompt's chunks reads fits in the store it is cut from (a probe never
allocates; a prefix longer than its store would be cut short silently)."""
from __future__ import annotations

import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from strata.engine.warm import ProbePlan, WarmKV, dry_tokens
from strata.models.kv import kv_windows
from strata.planning import KVPolicy, model_sizes
from strata.shapes import Window, get_preset


@settings(max_examples=80, deadline=None)
@given(n_real=st.integers(1, 400), chunk=st.integers(1, 96),
       resident=st.one_of(st.none(), st.integers(1, 400)), kv=st.sampled_from(["bf16", "int8"]),
       n_layer=st.integers(1, 3), window=st.sampled_from([0, 5, 64]))
@example(n_real=131, chunk=32, resident=100, kv="int8", n_layer=2, window=0).via(
    "the dry prompt (32 + 3) keeps fewer resident tokens than the real prompt's 100")
def test_the_warmup_kv_fits_the_real_prompts_count(n_real, chunk, resident, kv, n_layer,
                                                   window):
    shape = get_preset("tiny").with_(n_layer=n_layer, window=Window(window) if window else None)
    sizes = model_sizes(shape, kv=KVPolicy(kv, resident, n_real))
    n_dry = dry_tokens(n_real, chunk)
    probe = ProbePlan(n_real, chunk, resident)
    heads, key_dim, value_dim = shape.kv_heads
    meta = torch.device("meta")
    stage = torch.empty(1 << 30, dtype=torch.uint8, device=meta)
    kv_ = WarmKV(n_layer, heads, key_dim, n_dry, kv=kv, resident=resident,
                 devices=[meta] * n_layer, stages={l: stage for l in range(n_layer)},
                 windows=kv_windows(shape), value_dim=value_dim, probe=probe,
                 stage_bufs={l: stage for l in range(n_layer)})
    assert kv_.vram_bytes <= sizes.kv_vram(n_real)
    assert kv_.host_bytes <= sizes.kv_host_all(n_real)
    if not any(kv_.windows):
        assert kv_.vram_bytes == sizes.kv_vram(n_real)
    for l, w in enumerate(kv_.windows):
        if w:
            continue
        rows = kv_.resident[l][0].shape[0]
        for T in {min(chunk, n_real - P) for P in range(0, n_real, chunk)}:
            for _, r in probe.prefixes(T):
                assert r <= rows, (l, T, r, rows)
