"""`lightrail slices-eval`: Morphlux torus slice allocation, contiguous-only vs the stitching
heuristic vs Morphlux's integer program."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lightrail.controller.cli.common import non_negative_float, positive_float, positive_int
from lightrail.controller.cli.progress import progress_display


def cmd_slices(args: argparse.Namespace) -> int:
    """``lightrail slices-eval``: torus slice allocation, contiguous-only vs the stitching
    heuristic vs Morphlux's ILP (``--allocator``, default all three) on one seeded trace; prints
    a table, writes CSV/JSON/PNG with ``--out``."""
    from lightrail.controller.torus.evaluation import Allocator, evaluate_slices
    from lightrail.controller.torus.report import render_table, write_outputs

    chosen = tuple(Allocator) if not args.allocator or "all" in args.allocator else tuple(
        a for a in Allocator if a.value in args.allocator)
    policies = len(chosen)
    try:
        with progress_display("slices-eval", policies) as bar:
            started: list[str] = []

            def on_policy(policy: str) -> None:
                bar.update(len(started), description=f"slices-eval: replaying the trace "
                                                     f"with {policy}")
                started.append(policy)

            ev = evaluate_slices(seed=args.seed, torus=args.torus, requests=args.requests,
                                 load=args.load, spares_per_rack=args.spares,
                                 allocators=chosen, ilp_time_limit_s=args.ilp_time_limit,
                                 on_policy=on_policy)
            bar.update(policies, description="slices-eval: every policy replayed")
    except ValueError as exc:
        print(f"lightrail slices-eval: {exc}", file=sys.stderr)
        return 2
    print(render_table(ev))
    if args.out:
        try:
            write_outputs(ev, Path(args.out))
        except OSError as exc:
            print(f"lightrail slices-eval: --out {args.out}: {exc}", file=sys.stderr)
            return 1
        print(f"wrote slices_eval.csv, slices_eval.json, slices_eval.png to {args.out}")
    return 0


def add_parsers(subcommands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``lightrail slices-eval``."""
    c = subcommands.add_parser("slices-eval", help="torus slice allocation: contiguous-only vs "
                                                   "the stitching heuristic vs Morphlux's ILP "
                                                   "on a seeded trace")
    c.add_argument("--seed", type=int, default=0, help="trace seed (default 0)")
    c.add_argument("--torus", default="8x8x8", help="torus extents in chips (default 8x8x8)")
    c.add_argument("--requests", type=positive_int, default=1000,
                   help="slice requests in the trace (default 1000)")
    c.add_argument("--load", type=non_negative_float, default=1.0,
                   help="offered load: requested chip-time / tenant chip-time (default 1)")
    c.add_argument("--spares", type=int, default=0, help="spare chips per rack (default 0)")
    c.add_argument("--allocator", action="append",
                   choices=["all", "contiguous-only", "heuristic", "ilp"],
                   help="allocator to evaluate (repeatable; default all: contiguous-only, "
                        "heuristic, ilp side by side)")
    c.add_argument("--ilp-time-limit", type=positive_float, default=2.0,
                   help="HiGHS time limit per stitched request in s; at the limit the "
                        "heuristic's plan is used and the table counts it (default 2)")
    c.add_argument("--out", default=None,
                   help="directory for slices_eval.csv, slices_eval.json, slices_eval.png")
    c.set_defaults(func=cmd_slices)
