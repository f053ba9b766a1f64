"""`lightrail slices-eval`: Morphlux torus slice allocation, contiguous-only vs the stitching
heuristic vs Morphlux's integer program."""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from lightrail.controller.cli.common import (
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
)
from lightrail.controller.cli.progress import progress_display

if TYPE_CHECKING:
    from lightrail.controller.torus.evaluation import SliceEvaluation


def cmd_slices(args: argparse.Namespace) -> int:
    """``lightrail slices-eval``: torus slice allocation, contiguous-only vs the stitching
    heuristic vs Morphlux's ILP (``--allocator``, default all three) on one seeded trace; prints
    a table, writes CSV/JSON/PNG with ``--out``."""
    from lightrail.controller.torus.evaluation import Allocator, evaluate_slices
    from lightrail.controller.torus.report import render_table

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


def write_outputs(ev: SliceEvaluation, out_dir: Path) -> list[Path]:
    """Write ``slices_eval.csv`` (one row per allocator), ``slices_eval.json`` (configuration,
    rows, relative changes, Morphlux's figures; ``controller.torus.report``) and
    ``slices_eval.png`` (bar charts) into ``out_dir`` (created if needed). Returns the paths
    written. Raises ``OSError``."""
    from lightrail.controller.torus.report import report_document, report_rows

    out_dir.mkdir(parents=True, exist_ok=True)
    csv_path = out_dir / "slices_eval.csv"
    rows = report_rows(ev)
    with csv_path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    json_path = out_dir / "slices_eval.json"
    json_path.write_text(json.dumps(report_document(ev), indent=2) + "\n")
    png_path = out_dir / "slices_eval.png"
    _plot(ev, png_path)
    return [csv_path, json_path, png_path]


def _plot(ev: SliceEvaluation, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = (("rejection rate", "rejection_rate", 100.0, "%"),
               ("fragmentation", "fragmentation", 100.0, "%"),
               ("bandwidth per chip", "bandwidth_per_chip_gbps", 1.0, "Gb/s"))
    fig, axes = plt.subplots(1, len(metrics), figsize=(11, 3.4))
    for ax, (title, attr, scale, unit) in zip(axes, metrics, strict=True):
        values = [float(getattr(r, attr)) * scale for r in ev.results]
        ax.bar([r.allocator for r in ev.results], values,
               color=["#888888", "#2a7ab9", "#d9822b"][:len(values)])
        ax.set_title(title)
        ax.set_ylabel(unit)
    fig.suptitle(f"{ev.torus} torus, {ev.requests} requests, load {ev.load:g}, "
                 f"seed {ev.seed}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def add_parsers(subcommands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``lightrail slices-eval``."""
    c = subcommands.add_parser("slices-eval", help="torus slice allocation: contiguous-only vs "
                                                   "the stitching heuristic vs Morphlux's ILP "
                                                   "on a seeded trace")
    c.add_argument("--seed", type=non_negative_int, default=0, help="trace seed (default 0)")
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
