"""`lightrail slices-eval`: Morphlux torus slice allocation, contiguous-only vs photonic
stitching."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def cmd_slices(args: argparse.Namespace) -> int:
    """``lightrail slices-eval``: torus slice allocation, contiguous-only vs photonic stitching
    (Morphlux) on one seeded trace; prints a table, writes CSV/JSON/PNG with ``--out``."""
    from lightrail.controller.torus.evaluation import evaluate_slices, render_table

    try:
        ev = evaluate_slices(seed=args.seed, torus=args.torus, requests=args.requests,
                             load=args.load, spares_per_rack=args.spares,
                             out_dir=Path(args.out) if args.out else None)
    except ValueError as exc:
        print(f"lightrail slices-eval: {exc}", file=sys.stderr)
        return 2
    print(render_table(ev))
    if args.out:
        print(f"wrote slices_eval.csv, slices_eval.json, slices_eval.png to {args.out}")
    return 0
