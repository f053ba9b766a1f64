"""The slices-eval report: the side-by-side table with what every row means, CSV, JSON, PNG.

Pure formatting of a :class:`~lightrail.controller.torus.evaluation.SliceEvaluation` (the
metrics are defined in ``lightrail.controller.torus.evaluation``): the table, the CSV rows and
the JSON document. ``lightrail.controller.cli.slices`` writes the files.
"""

from __future__ import annotations

from dataclasses import asdict

from lightrail.controller.torus.evaluation import (
    MORPHLUX_BANDWIDTH_GAIN,
    MORPHLUX_FRAGMENTATION_REDUCTION,
    Allocator,
    SliceEvaluation,
)

_COLUMNS: tuple[tuple[str, str, str, bool], ...] = (
    # label, attribute, format, ILP-only
    ("rejection rate", "rejection_rate", "{:.1%}", False),
    ("rejected chips", "rejected_chip_rate", "{:.1%}", False),
    ("fragmentation", "fragmentation", "{:.1%}", False),
    ("box fragmentation", "box_fragmentation", "{:.1%}", False),
    ("probes above box", "probe_beat_box", "{:.1%}", False),
    ("utilization", "utilization", "{:.1%}", False),
    ("bandwidth Gb/s", "bandwidth_gbps", "{:,.0f}", False),
    ("Gb/s per chip", "bandwidth_per_chip_gbps", "{:.0f}", False),
    ("stitched", "stitched_fraction", "{:.1%}", False),
    ("hops (stitched)", "mean_hops", "{:.2f}", False),
    ("accepted", "accepted", "{}", False),
    ("rejected", "rejected", "{}", False),
    ("ILP solves", "ilp_solves", "{}", True),
    ("ILP optimal", "ilp_optimal", "{}", True),
    ("ILP fell back (time limit)", "ilp_fallbacks", "{}", True),
    ("ILP too large", "ilp_too_large", "{}", True),
    ("ILP no placement", "ilp_infeasible", "{}", True),
    ("ILP improved", "ilp_improved", "{}", True),
    ("ILP rescued", "ilp_rescued", "{}", True),
    ("ILP not wired", "ilp_unroutable", "{}", True),
    ("max edge load, heuristic", "heuristic_max_load", "{:.3f}", True),
    ("max edge load, ILP", "ilp_max_load", "{:.3f}", True),
    ("ILP solver s", "ilp_solve_s", "{:.1f}", True),
    ("wall s", "wall_s", "{:.1f}", False),
)


def render_table(ev: SliceEvaluation) -> str:
    """The comparison as a plain-text table (one column per allocator; ILP rows show ``-``
    for the others), each photonic allocator's change against contiguous-only beside
    Morphlux's reported figures, the ILP's fallbacks, and what every row means."""
    head = (f"Slices on a {ev.torus} torus: {ev.requests} requests (first "
            f"{ev.warmup_fraction:.0%} warm-up), load {ev.load:g}, seed {ev.seed}, "
            f"{ev.spares_per_rack} spare(s) per rack, {ev.link_gbps:g} Gb/s lanes, ILP time "
            f"limit {ev.ilp_time_limit_s:g} s")
    names = [r.allocator for r in ev.results]
    has_ilp = Allocator.ILP.value in names
    rows = [[label, *("-" if ilp_only and r.allocator != Allocator.ILP.value
                      else fmt.format(getattr(r, attr)) for r in ev.results)]
            for label, attr, fmt, ilp_only in _COLUMNS if has_ilp or not ilp_only]
    widths = [max(len(x) for x in col) for col in zip(["metric", *names], *rows, strict=True)]
    lines = [head, "  ".join(h.ljust(w) if i == 0 else h.rjust(w) for i, (h, w)
                             in enumerate(zip(["metric", *names], widths, strict=True)))]
    lines += ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w)
                        in enumerate(zip(row, widths, strict=True))) for row in rows]
    for c in ev.changes:
        lines.append(
            f"{c.allocator} vs contiguous-only: fragmentation {c.fragmentation:+.0%} "
            f"(Morphlux: up to -{MORPHLUX_FRAGMENTATION_REDUCTION:.0%}), bandwidth per chip "
            f"{c.bandwidth:+.0%} (Morphlux: up to +{MORPHLUX_BANDWIDTH_GAIN:.0%}), "
            f"rejections {c.rejection:+.0%}")
    for r in ev.results:
        if r.allocator == Allocator.ILP.value and r.ilp_fallbacks:
            lines.append(f"ilp: fell back to the heuristic's plan {r.ilp_fallbacks} time(s) of "
                         f"{r.ilp_solves} at the {ev.ilp_time_limit_s:g} s time limit")
    lines += _LEGEND
    return "\n".join(lines)


_LEGEND = (
    "Morphlux's figures are the abstract's 'up to' values (arXiv:2508.03674), on its own "
    "TPU-cluster simulator and traces; ours are one seeded trace of this model.",
    "rejection rate: requests refused at arrival / requests (no queueing); rejected chips: the "
    "same weighted by chips.",
    "fragmentation: 1 - L/F, mean over arrivals, F = free tenant chips, L = largest slice the "
    "allocator could grant then (a free box, or for the photonic allocators a dry-run stitched "
    "whole-server slice if larger); box fragmentation: the same with L = largest free box for "
    "all; the rows are equal when no stitched probe beats the box, and 'probes above box' is "
    "how often one did.",
    "utilization: allocated / tenant chips, time-averaged; bandwidth: injection bandwidth of "
    "the live slices (per chip and logical axis, the lanes of the thinnest link x lane rate, "
    "doubled when the axis closes into a ring), summed, and per allocated chip.",
    "Why bandwidth grows with few or no stitched slices: a fixed torus gives a box only the "
    "wires inside it, so a 2x2x1 slice uses 2 of each chip's 6 lanes (200 Gb/s per chip) and a "
    "2x1x1 slice 1 (100); the per-server photonic switch joins every idle lane to the slice's "
    "own links (R1), 3 lanes per axis (600) and 6 (600): +200 % and +500 % per slice. On a "
    "4x4x1 torus the z lanes are wired to nothing (A2) and most slices fit one or two servers, "
    "so the gain is large there with 0-2 % stitched; it is a property of the model, not of "
    "stitching.",
    "stitched: accepted slices built from servers joined by circuits; hops: fibres per "
    "inter-server circuit of those slices.",
    "ILP rows (the ilp column only, over the whole trace including warm-up and fragmentation "
    "probes): programs solved; proven optimal; fell back to the heuristic's plan at the time "
    "limit; too large to solve (over 12,000 variables; heuristic used); no placement among the "
    "candidate servers (by a necessary-condition check or the solver); a strictly lower max "
    "edge load than the heuristic's plan (used); a placement where the heuristic had none "
    "(used); solved but not wired at chip level (heuristic kept).",
    "max edge load: the ILP's objective, circuits / usable fibres on the busiest "
    "server-to-server edge of the slice's mesh links, mean over the requests both placed "
    "(heuristic's plan vs the proven optimum; the optimum is never higher).",
)
"""What the rows mean, printed under the table (the module docstring has the definitions)."""


def report_rows(ev: SliceEvaluation) -> list[dict[str, object]]:
    """One dict per allocator (``slices_eval.csv``'s rows: the ``PolicyResult`` fields)."""
    return [asdict(r) for r in ev.results]


def report_document(ev: SliceEvaluation) -> dict[str, object]:
    """``slices_eval.json``: the configuration, rows, relative changes and Morphlux's figures."""
    doc = asdict(ev)
    doc["morphlux_reported"] = {"fragmentation_reduction_up_to": MORPHLUX_FRAGMENTATION_REDUCTION,
                                "bandwidth_gain_up_to": MORPHLUX_BANDWIDTH_GAIN,
                                "source": "arXiv:2508.03674 (abstract)"}
    return doc
