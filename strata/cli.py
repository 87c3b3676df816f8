"""The `strata` command. Each subcommand lives in `strata/commands/<name>.py` with
`add_parser(subparsers)` and `run(args) -> int`.

Exit codes: 0 done; 2 bad input or an impossible request (a StrataError, a parser error, an OS
error such as a full disk, too little memory, stdout closed early by `| head`), always one line on
stderr; 130 interrupted (Ctrl-C, the shell's 128 + SIGINT); anything else is a bug in strata."""
from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys

from strata.errors import StrataError

COMMANDS = ("demo", "plan", "synth", "pack", "prefill", "generate", "bench", "verify", "perplexity")
EXIT_BAD_INPUT, EXIT_INTERRUPTED = 2, 130


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors (usage is one `--help` away)."""

    def error(self, message: str):
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: {message} (see {self.prog} --help)\n")


def _load(name: str):
    try:
        return importlib.import_module(f"strata.commands.{name}")
    except ModuleNotFoundError as e:
        if e.name == f"strata.commands.{name}":
            return None  # command not built yet
        raise


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="strata", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
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


def _say(command: str, text: str) -> None:
    try:
        print(f"strata {command}: {text}", file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


def _quiet_stdout() -> None:
    """stdout's reader is gone: point it at /dev/null so the interpreter's final flush does not
    raise a second BrokenPipeError."""
    try:
        fd = os.open(os.devnull, os.O_WRONLY)
        os.dup2(fd, sys.stdout.fileno())
        os.close(fd)
    except (OSError, ValueError, AttributeError):
        pass


_skip_teardown = False


def skip_interpreter_teardown() -> None:
    """For a command whose libraries can abort in the interpreter's teardown after the work is
    done and reported: gloo's worker threads, still joinable when their owners die during
    finalization, call std::terminate (SIGABRT with no Python frame left; torchrun then calls the
    whole run failed). `entry` then leaves by os._exit once stdout and stderr are flushed. Only
    the process entry point acts on it: `main` called in-process returns as usual."""
    global _skip_teardown
    _skip_teardown = True


def entry() -> int:
    """The process entry point (`strata`, `python -m strata`): main's exit code, leaving
    without the interpreter's teardown where a command asked for that."""
    rc = main()
    if _skip_teardown:
        from strata.engine.distributed import exit_flushed
        exit_flushed(rc)
    return rc


def main(argv: list[str] | None = None) -> int:
    from strata.engine.early import early_read_for
    argv = sys.argv[1:] if argv is None else list(argv)
    # before argparse's command modules import torch (3.5 s): a streamed read's pack starts
    # coming off the page cache now, beside that import
    early = early_read_for(argv)
    try:
        return _main(argv, early)
    finally:
        if early is not None:
            early.close()


def _pins(args):
    """The launch choices the flags pin for the whole command (plan and read alike): --delta,
    --prefix-attention."""
    import contextlib
    stack = contextlib.ExitStack()
    if getattr(args, "delta", None) is not None:
        from strata.kernels.deltanet.launch import launch_from_flag, pin_delta_launch
        stack.enter_context(pin_delta_launch(launch_from_flag(args.delta)))
    if getattr(args, "prefix_attention", None) is not None:
        from strata.kernels.attention.flash_prefix import pin_prefix_route
        stack.enter_context(pin_prefix_route(args.prefix_attention))
    return stack


def _main(argv: list[str], early) -> int:
    _log_to_stderr()
    parser = build_parser()
    args = parser.parse_args(argv)
    args._early = early
    if not getattr(args, "_run", None):
        parser.print_help()
        return EXIT_BAD_INPUT
    cmd = args.command
    try:
        with _pins(args):
            rc = int(args._run(args) or 0)
        sys.stdout.flush()
        return rc
    except StrataError as e:
        _say(cmd, str(e))
    except KeyboardInterrupt:
        _say(cmd, "interrupted (Ctrl-C); outputs are written whole or not at all, the pack and "
                  "the cache are untouched")
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        _quiet_stdout()
        _say(cmd, "the reader of the output closed it early (e.g. `| head`); output cut short")
    except MemoryError:
        _say(cmd, "out of host memory; try a smaller --vram/--cache, a shorter prompt or "
                  "--chunk, or a machine with more RAM")
    except OSError as e:
        from strata.atomic import os_error_line
        _say(cmd, os_error_line(e))
    return EXIT_BAD_INPUT


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
