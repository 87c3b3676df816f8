"""Where a streamed decode step's host time goes: qwen3-30b-a3b's layer and expert counts (48
layers, 128 experts, top-8) at tiny widths, an expert cache of about 28 experts a layer and a
ring of 104 slots (passes of 52), as the 12 GiB plan of the real model leaves them, so each
decode token stages its routed experts and streams the misses. A short prompt, then `decode`
under cProfile: ms a token and a layer, the expert FFN's passes a layer, the host reads a token
(strata.engine.syncs.SyncGuard, --guard: slower, counts only) and the top functions.

    python experiments/decode_profile.py                    # CPU, the reference FFN
    python experiments/decode_profile.py --stub-ffn         # CPU, the FFN a no-op: the rest's cost
    python experiments/decode_profile.py --device cuda      # the GPU path (experts auto)

On the CPU the torch ops run inline, so the numbers are the Python and dispatch cost of the
engine's path, not a GPU's launch latency or its copies.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import cProfile
import io
import pstats
import time

import torch

import strata.models.moe as moe
from strata.engine import syncs
from strata.engine.generate import Sampler, decode
from strata.engine.prefill import EngineConfig, PrefillEngine
from strata.packs.memory import MemoryPack
from strata.packs.synth import ExpertFormats
from strata.shapes import ModelShape


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=32, help="tokens decoded under the profile")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--ring", type=int, default=104)
    ap.add_argument("--cached", type=int, default=28, help="experts a layer cached")
    ap.add_argument("--stub-ffn", action="store_true", help="CPU: the expert FFN does nothing")
    ap.add_argument("--guard", action="store_true", help="count host reads (SyncGuard)")
    ap.add_argument("--top", type=int, default=30)
    args = ap.parse_args(argv)
    real = moe.moe_ffn_ref
    if args.stub_ffn:   # swapped for this run only: a caller in the same process (a test
        # suite, a notebook) gets the real reference back however the run ends
        moe.moe_ffn_ref = lambda x, ids, w, experts, *, out=None, **_: (
            out if out is not None else torch.zeros_like(x))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)   # a shared CPU: one thread, no oversubscription in the timings
    try:
        return profile(args)
    finally:
        moe.moe_ffn_ref = real
        torch.set_num_threads(threads)


def profile(args) -> int:
    """The decode profiled as `args` says (main's flags); prints its figures."""
    shape = ModelShape("qwen3moe", n_layer=48, d_model=64, n_expert=128, top_k=8, d_expert=32,
                       n_head=4, n_kv_head=2, head_dim=16, vocab=256, max_pos=4096)
    pack = MemoryPack(shape, ExpertFormats.of("Q8_0"))
    slot = -(-pack.layers[0].blob_size // 256) * 256
    cuda = args.device != "cpu"
    eng = PrefillEngine(pack, EngineConfig(
        vram=1 << 30, cache=(shape.n_layer * args.cached + args.ring + 16) * slot,
        max_prompt=256, kv="bf16" if cuda else "fp32", kv_resident=None, chunk=16,
        ring=args.ring, ffn="auto" if cuda else "ref", device=None if cuda else "cpu"))
    calls = collections.Counter()
    res = {}

    def then(session, logits):
        pick = Sampler()
        decode(eng.model, session.provider, session.kv, logits, 3, pick,   # warm: not counted
               providers=session.providers)
        passes = session.provider.passes
        session.provider.passes = lambda l, ids: (calls.update(["layers"]),
                                                  _count(passes(l, ids), calls))[1]
        pr = cProfile.Profile()
        guard = syncs.SyncGuard() if args.guard else contextlib.nullcontext(syncs.SyncGuard())
        with guard as g:
            eng._sync()
            t0 = time.perf_counter()
            pr.enable()
            out = decode(eng.model, session.provider, session.kv, logits, args.n, pick,
                         providers=session.providers, sync=eng._sync)
            pr.disable()
            res.update(wall=time.perf_counter() - t0, pr=pr, guard=g)
        return out

    prompt = torch.randint(0, shape.vocab, (32,), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        out = eng.run(prompt, logits="last", extra=args.n + 3, then=then).then
    f, L = out.forwards, shape.n_layer
    print(f"{f} forwards: {res['wall'] / f * 1e3:.2f} ms a token, "
          f"{res['wall'] / f / L * 1e3:.3f} ms a layer; "
          f"{calls['passes'] / max(calls['layers'], 1):.2f} passes a layer; "
          f"{out.bytes_streamed / f / 1e3:.1f} kB streamed a token, "
          f"hits {out.cache_hits}/{out.routed}")
    if args.guard:
        seen = collections.Counter(f"{c.call} at {c.where.split('strata/')[-1]}"
                                   for c in res["guard"].caught)
        for k, v in seen.most_common():
            print(f"  {v / f:8.2f} a token  {k}")
        for k, v in collections.Counter(res["guard"].declared).items():
            print(f"  {v / f:8.2f} a token  declared: {k}")
    s = io.StringIO()
    pstats.Stats(res["pr"], stream=s).sort_stats("cumulative").print_stats(args.top)
    print(s.getvalue())
    return 0


def _count(gen, calls):
    for p in gen:
        calls.update(["passes"])
        yield p


if __name__ == "__main__":
    raise SystemExit(main())
