"""`lightrail slices-eval`: Morphlux torus slice allocation, contiguous-only vs photonic
stitching."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lightrail.controller.cli.common import non_negative_float, positive_int
from lightrail.controller.cli.progress import progress_display


def cmd_slices(args: argparse.Namespace) -> int:
    """``lightrail slices-eval``: torus slice allocation, contiguous-only vs photonic stitching
    (Morphlux) on one seeded trace; prints a table, writes CSV/JSON/PNG with ``--out``."""
    from lightrail.controller.torus.allocator import AllocationPolicy
    from lightrail.controller.torus.evaluation import evaluate_slices, render_table

    policies = len(AllocationPolicy)
    try:
        with progress_display("slices-eval", policies) as bar:
            started: list[str] = []

            def on_policy(policy: str) -> None:
                bar.update(len(started), description=f"slices-eval: replaying the trace "
                                                     f"with {policy}")
                started.append(policy)

            ev = evaluate_slices(seed=args.seed, torus=args.torus, requests=args.requests,
                                 load=args.load, spares_per_rack=args.spares,
                                 out_dir=Path(args.out) if args.out else None,
                                 on_policy=on_policy)
            bar.update(policies, description="slices-eval: every policy replayed")
    except ValueError as exc:
        print(f"lightrail slices-eval: {exc}", file=sys.stderr)
        return 2
    print(render_table(ev))
    if args.out:
        print(f"wrote slices_eval.csv, slices_eval.json, slices_eval.png to {args.out}")
    return 0


def add_parsers(subcommands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``lightrail slices-eval``."""
    c = subcommands.add_parser("slices-eval", help="torus slice allocation: contiguous-only vs "
                                                   "photonic stitching (Morphlux) on a seeded "
                                                   "trace")
    c.add_argument("--seed", type=int, default=0, help="trace seed (default 0)")
    c.add_argument("--torus", default="8x8x8", help="torus extents in chips (default 8x8x8)")
    c.add_argument("--requests", type=positive_int, default=1000,
                   help="slice requests in the trace (default 1000)")
    c.add_argument("--load", type=non_negative_float, default=1.0,
                   help="offered load: requested chip-time / tenant chip-time (default 1)")
    c.add_argument("--spares", type=int, default=0, help="spare chips per rack (default 0)")
    c.add_argument("--out", default=None,
                   help="directory for slices_eval.csv, slices_eval.json, slices_eval.png")
    c.set_defaults(func=cmd_slices)
