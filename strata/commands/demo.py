"""`strata demo`: strata's main job on an embedded default.

For now: the plan of the qwen3-30b-a3b preset (Q8_0 experts) on one 12 GiB card. The streaming
prefill demo replaces this once the engine exists.
"""
from __future__ import annotations

from strata.commands import plan as plan_cmd

DEMO_ARGS = ["--preset", "qwen3-30b-a3b", "--quant", "Q8_0", "--vram", "12GiB"]


def add_parser(sub):
    p = sub.add_parser("demo", help="plan qwen3-30b-a3b on a 12 GiB card (the default demo)")
    p.add_argument("--json", action="store_true")
    return p


def run(args) -> int:
    import argparse
    parser = argparse.ArgumentParser(prog="strata plan")
    sub = parser.add_subparsers()
    plan_cmd.add_parser(sub)
    pargs = parser.parse_args(["plan", *DEMO_ARGS] + (["--json"] if args.json else []))
    return plan_cmd.run(pargs)
