"""``lightrail``: the command line of the controller, the host agent, replay and operators.

Subcommands: ``lightrail --help`` lists them (each command group's module registers its own;
``lightrail completion`` writes shell completion from the same parser). Operator commands print
tables, or JSON with ``--json``. Exit codes:
0 success, 1 a runtime failure (message on stderr), 2 bad usage or invalid input.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import signal
import sys
from collections.abc import Callable, Sequence

from lightrail.controller.cli import (
    completion,
    daemons,
    emulate,
    evaluate,
    events,
    operator,
    replay,
    slices,
    switch_ops,
)


def build_parser() -> argparse.ArgumentParser:
    """The ``lightrail`` argument parser: each command group's module registers its own
    subcommands (``add_parsers``), in the order ``lightrail --help`` lists them."""
    p = argparse.ArgumentParser(prog="lightrail", description=__doc__.splitlines()[0])
    p.add_argument("--version", action="version", version=f"lightrail {_version()}")
    sub = p.add_subparsers(dest="cmd", required=True)
    daemons.add_parsers(sub)
    emulate.add_parsers(sub)
    replay.add_parsers(sub)
    evaluate.add_parsers(sub)
    slices.add_parsers(sub)
    operator.add_parsers(sub)
    switch_ops.add_parsers(sub)
    events.add_parsers(sub)
    completion.add_parsers(sub, p)  # last: it reads the whole parser
    return p


def _version() -> str:
    try:
        return importlib.metadata.version("lightrail")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


EXIT_CLOSED_PIPE = 128 + signal.SIGPIPE
"""Exit code when the reader of our output went away (``lightrail circuits | head``): what a
Unix tool killed by SIGPIPE reports, without a traceback."""


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``lightrail``. A closed stdout (the reader went away) ends the command
    quietly with ``EXIT_CLOSED_PIPE``."""
    args = build_parser().parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        rc = func(args)
        sys.stdout.flush()
    except BrokenPipeError:
        # Python's advice: point stdout at devnull so the flush at exit cannot fail again
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_CLOSED_PIPE
    return rc


if __name__ == "__main__":
    sys.exit(main())
