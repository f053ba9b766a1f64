"""``lightrail``: the command line of the controller, the host agent, replay and operators.

Subcommands: controller, agent, emulate, replay, demo, check-config, status, switches,
circuits, jobs, hosts. Operator commands print tables, or JSON with ``--json``. Exit codes:
0 success, 1 a runtime failure (message on stderr), 2 bad usage or invalid input.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from lightrail.controller.cli import daemons, emulate, operator, replay, slices


def build_parser() -> argparse.ArgumentParser:
    """The ``lightrail`` argument parser: each command group's module registers its own
    subcommands (``add_parsers``), in the order ``lightrail --help`` lists them."""
    p = argparse.ArgumentParser(prog="lightrail", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    daemons.add_parsers(sub)
    emulate.add_parsers(sub)
    replay.add_parsers(sub)
    slices.add_parsers(sub)
    operator.add_parsers(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``lightrail``."""
    args = build_parser().parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    return func(args)


if __name__ == "__main__":
    sys.exit(main())
