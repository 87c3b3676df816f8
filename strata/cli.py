"""The `strata` command. Each subcommand lives in `strata/commands/<name>.py` with
`add_parser(subparsers)` and `run(args) -> int`. A StrataError becomes one line and exit 2."""
from __future__ import annotations

import argparse
import importlib
import logging
import sys

from strata.errors import StrataError

COMMANDS = ("demo", "plan", "synth", "pack", "prefill")


def _load(name: str):
    try:
        return importlib.import_module(f"strata.commands.{name}")
    except ModuleNotFoundError as e:
        if e.name == f"strata.commands.{name}":
            return None  # command not built yet
        raise


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="strata", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        mod = _load(name)
        if mod is not None:
            sp = mod.add_parser(sub)
            sp.set_defaults(_run=mod.run)
    return p


def _log_to_stderr() -> None:
    """strata's INFO lines (e.g. the scratch pool's check line) on stderr, once."""
    log = logging.getLogger("strata")
    if not any(getattr(h, "_strata", False) for h in log.handlers):
        h = logging.StreamHandler(sys.stderr)
        h.setFormatter(logging.Formatter("%(message)s"))
        h._strata = True
        log.addHandler(h)
    if log.level == logging.NOTSET:
        log.setLevel(logging.INFO)


def main(argv: list[str] | None = None) -> int:
    _log_to_stderr()
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    try:
        return int(args._run(args) or 0)
    except StrataError as e:
        print(f"strata {args.command}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
