"""`strata demo`: strata's main job on an embedded default, on whatever machine this is.

Synthesizes a small Qwen3-MoE (random weights that route like a trained MoE), packs it, and reads
a prompt through it under a cache budget small enough that most experts must stream: the plan
(auto scan), the resolved ring, bytes streamed, cache hits. On a GPU the experts stream over PCIe
through the ring while the Triton expert GEMM computes; on the CPU the same engine runs with the
plain-torch expert FFN (the Triton interpreter would take minutes).
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch

from strata.shapes import get_preset

DEMO_PRESET, DEMO_QUANT, DEMO_TOKENS = "demo", "Q8_0", 1024
CACHE_SHARE = 0.4   # of all expert bytes: the rest must stream


def add_parser(sub):
    p = sub.add_parser("demo", help="synthesize a small MoE, pack it, stream a prompt through it",
                       description=__doc__.split("\n\n")[1])
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--tokens", type=int, default=DEMO_TOKENS, help="prompt length")
    p.add_argument("--keep", metavar="DIR", help="write the pack here instead of a temp dir")
    return p


def run(args) -> int:
    from strata.commands import prefill as pf
    from strata.packs.synth import ExpertFormats, synth_pack

    shape = get_preset(DEMO_PRESET)
    with tempfile.TemporaryDirectory() as tmp:
        where = Path(args.keep) if args.keep else Path(tmp)
        where.mkdir(parents=True, exist_ok=True)
        pack = synth_pack(where / f"demo-{DEMO_PRESET}-{DEMO_QUANT}.pack", shape,
                          ExpertFormats.of(DEMO_QUANT), progress=not args.json)
        from strata.engine.host import expert_bytes
        from strata.packs import Pack
        blobs = expert_bytes(Pack.open(pack))
        cache = int(blobs * CACHE_SHARE)
        argv = [str(pack), "--prompt-tokens", str(args.tokens), "--cache", str(cache),
                "--prefill", "auto:1024"] + (["--json"] if args.json else [])
        parser = argparse.ArgumentParser(prog="strata prefill")
        pf.add_parser(parser.add_subparsers())
        pargs = parser.parse_args(["prefill", *argv])
        if not args.json:
            dev = "cuda" if torch.cuda.is_available() else "cpu"
            print(f"strata demo: a small Qwen3-MoE ({shape.n_layer} layers, {shape.n_expert} "
                  f"experts, top-{shape.top_k}), {DEMO_QUANT} experts; a cache sized for "
                  f"{int(CACHE_SHARE * 100)}% of them lends most of itself to the prompt (ring + "
                  f"activations), the rest stream through the ring ({dev})")
        return pf.run(pargs)
