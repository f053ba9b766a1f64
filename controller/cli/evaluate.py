"""`lightrail evaluate`: a workload's iteration time under the rail policies, from the cost
model (``lightrail.agents.replay.evaluate``; an Opus experiment folder:
``lightrail.agents.replay.opus_compare``)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from lightrail.controller.cli.common import fabric_choices, fabric_option, non_negative_float
from lightrail.controller.cli.progress import progress_display

POWER_COST_OPTIONS = (
    ("--eps-radix", "eps_radix", "ports of one electrical packet switch (two tiers beyond it)"),
    ("--eps-port-watts", "eps_port_power_w", "W per electrical switch port, optics excluded"),
    ("--transceiver-watts", "transceiver_power_w", "W per optical transceiver module"),
    ("--ocs-port-watts", "ocs_port_power_w", "W per OCS port (duplex)"),
    ("--eps-port-usd", "eps_port_cost_usd", "USD per electrical switch port"),
    ("--transceiver-usd", "transceiver_cost_usd", "USD per optical transceiver module"),
    ("--ocs-port-usd", "ocs_port_cost_usd", "USD per OCS port (duplex)"),
)
"""``lightrail evaluate``'s power/cost options: flag, ``PowerCostConfig`` field, help."""


def _radix(text: str) -> int:
    """argparse type: an electrical switch radix, an integer >= 2."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 2:
        raise argparse.ArgumentTypeError(f"must be >= 2, got {value}")
    return value


def power_cost_config(args: argparse.Namespace) -> Any:
    """The ``PowerCostConfig`` of ``evaluate``'s power/cost options: the defaults with the
    options given replacing their fields."""
    import dataclasses

    from lightrail.controller.core.costmodel import PowerCostConfig

    given = {field: getattr(args, field) for _flag, field, _help in POWER_COST_OPTIONS
             if getattr(args, field) is not None}
    return dataclasses.replace(PowerCostConfig(), **given)


def cmd_evaluate(args: argparse.Namespace) -> int:
    from lightrail.agents.replay.evaluate import evaluate_main
    from lightrail.agents.replay.trace.opus import is_opus_folder

    if is_opus_folder(Path(args.workload)) and any(Path(args.workload).glob("*.csv")):
        from lightrail.agents.replay.opus_compare import opus_evaluate_main

        # an Opus experiment folder (patterns + latency CSVs): measured beside predicted
        unused = [flag for flag, v in (("--delay-ms", args.delay_ms), ("--fabric", args.fabric),
                                       ("--max-ops", args.max_ops),
                                       ("--link-gbps", args.link_gbps),
                                       ("--alpha-us", args.alpha_us),
                                       ("--scale-up-gbps", args.scale_up_gbps)) if v is not None]
        return opus_evaluate_main(Path(args.workload), as_json=args.json,
                                  out_dir=Path(args.out) if args.out else None, unused=unused)

    with progress_display(f"evaluating {Path(args.workload).name}") as bar:

        def on_progress(done: int, total: int) -> None:
            bar.update(done, total)
            if done >= total:
                bar.finish()  # off the screen before the table is printed

        return evaluate_main(
            Path(args.workload), args.delay_ms, Path(args.out) if args.out else None,
            fabric=args.fabric, max_ops=args.max_ops, link_gbps=args.link_gbps,
            alpha_us=args.alpha_us, scale_up_gbps=args.scale_up_gbps,
            power=power_cost_config(args), as_json=args.json, on_progress=on_progress,
        )


def add_parsers(subcommands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``lightrail evaluate``."""
    c = subcommands.add_parser("evaluate",
                               help="iteration time of a workload under five rail policies "
                                    "over reconfiguration delays (analytic, no controller)")
    c.add_argument("workload", help="Kineto dir/tarball/JSON, AICB CSV, SimAI text or an Opus "
                                    "pattern folder; an Opus experiment folder (patterns and "
                                    "latency CSVs) prints Opus's measured table beside the "
                                    "prediction")
    c.add_argument("--delay-ms", type=float, nargs="+", default=None,
                   help="reconfiguration delays in ms (default: 0.004 0.1 1 10 25 100)")
    c.add_argument("--out", default=None,
                   help="directory for evaluation.csv, evaluation.json, overhead_vs_delay.png "
                        "(an Opus experiment folder: opus_comparison.json)")
    c.add_argument("--fabric", type=fabric_option, choices=fabric_choices(), default=None,
                   metavar="FABRIC",
                   help="rail fabric: demo-4x2, rail-16x8 or rail:HOSTSxGPUS (e.g. "
                        "rail:1152x8) (default: demo-4x2 up to 8 ranks, rail-16x8 up to 128, "
                        "else sized from the job with 8 GPUs per host)")
    c.add_argument("--max-ops", type=int, default=None,
                   help="evaluate only the first N collectives of each rank's iteration")
    c.add_argument("--link-gbps", type=float, default=None, help="rail link Gb/s (default 100)")
    c.add_argument("--alpha-us", type=float, default=None, help="per-hop latency µs (default 5)")
    c.add_argument("--scale-up-gbps", type=float, default=None,
                   help="NVLink Gb/s per GPU (default 2400 = 300 GB/s)")
    from lightrail.controller.core.costmodel import PowerCostConfig

    defaults = PowerCostConfig()
    for flag, field, doc in POWER_COST_OPTIONS:
        c.add_argument(flag, dest=field, type=_radix if field == "eps_radix"
                       else non_negative_float, default=None, metavar="N",
                       help=f"power/cost estimate: {doc} (default "
                            f"{getattr(defaults, field):.4g})")
    c.add_argument("--json", action="store_true", help="print the results as JSON")
    c.set_defaults(func=cmd_evaluate)
