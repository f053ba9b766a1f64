"""``lightrail``: the command line of the controller, the host agent, replay and operators.

Subcommands: controller, agent, replay, demo, check-config, status, switches, circuits, jobs,
hosts. Operator commands print tables, or JSON with ``--json``. Exit codes: 0 success, 1 a
runtime failure (message on stderr), 2 bad usage or invalid input.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence

from lightrail.controller.cli.common import DEFAULT_TARGET, non_negative_float, positive_int
from lightrail.controller.cli.daemons import cmd_agent, cmd_check_config, cmd_controller
from lightrail.controller.cli.operator import (
    cmd_circuits,
    cmd_drain,
    cmd_failover,
    cmd_gpus,
    cmd_hosts,
    cmd_jobs,
    cmd_status,
    cmd_switches,
)
from lightrail.controller.cli.replay import cmd_demo, cmd_evaluate, cmd_replay
from lightrail.controller.cli.slices import cmd_slices


def build_parser() -> argparse.ArgumentParser:
    """The ``lightrail`` argument parser."""
    p = argparse.ArgumentParser(prog="lightrail", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)

    c = sub.add_parser("controller", help="run the controller daemon")
    c.add_argument("--config", help="YAML config (default: built-in demo fabric, local etcd)")
    c.add_argument("--announce", action="store_true",
                   help="print one JSON line with the bound gRPC and metrics addresses to stdout "
                        "once serving (for supervisors and the embedded demo)")
    c.set_defaults(func=cmd_controller)

    c = sub.add_parser("check-config", help="validate a config file")
    c.add_argument("config")
    c.set_defaults(func=cmd_check_config)

    c = sub.add_parser("agent", help="run a host agent (phase relay)")
    c.add_argument("--controller", default=DEFAULT_TARGET, help="controller host:port")
    c.add_argument("--host", default=os.uname().nodename, help="this host's inventory name")
    c.add_argument("--socket", default="/run/lightrail/agent.sock",
                   help="Unix socket for the job-side library")
    c.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    c.add_argument("--health", choices=["nvml", "emulated"], default="nvml",
                   help="GPU health source: nvml (the NVIDIA driver's NVML; fails if it is "
                        "missing) or emulated (healthy emulated GPUs, for tests and demos "
                        "without GPUs) (default nvml)")
    c.add_argument("--emulated-gpus", type=positive_int, default=8,
                   help="GPUs of the emulated health source, with --health emulated "
                        "(default 8)")
    c.set_defaults(func=cmd_agent)

    def replay_opts(c: argparse.ArgumentParser, iterations: int) -> None:
        c.add_argument("--iterations", type=positive_int, default=iterations,
                       help=f"training steps to replay (default {iterations})")
        c.add_argument("--time-scale", type=non_negative_float, default=1.0,
                       help="multiply recorded compute gaps and transfer times (0: no waits; "
                            "default 1)")
        c.add_argument("--delay-ms", type=non_negative_float, default=10.0,
                       help="reconfiguration delay of the emulated OCSes, embedded controller "
                            "only (default 10)")
        c.add_argument("--devices", choices=["tl1", "restconf", "emulated"], default="tl1",
                       help="how the embedded controller reaches its emulated switches: TL1 or "
                            "RESTCONF over sockets, or the in-process driver (default tl1)")

    c = sub.add_parser("replay", help="replay a recorded trace or workload through a controller")
    c.add_argument("trace", help="Kineto dir/tarball/JSON, AICB CSV or SimAI text")
    c.add_argument("--controller", default=None,
                   help="controller host:port (default: start an embedded one)")
    c.add_argument("--fabric", choices=["demo-4x2", "rail-16x8"], default=None,
                   help="embedded fabric (default: by world size)")
    c.add_argument("--job-id", default="replay", help="job id to register (default replay)")
    c.add_argument("--json", action="store_true", help="print the summary as JSON")
    c.add_argument("--no-progress", action="store_true", help="no progress bar")
    c.add_argument("--max-ops", type=positive_int, default=None,
                   help="replay only the first N collectives of each rank's iteration")
    replay_opts(c, 3)
    c.set_defaults(func=cmd_replay)

    c = sub.add_parser("demo", help="the DLRM replay on an embedded etcd, controller and rails")
    c.add_argument("--trace", default=None,
                   help="trace to replay (default: the DLRM 8-rank Kineto trace in "
                        "$LIGHTRAIL_DATA or ../shared/data)")
    c.add_argument("--fail-gpu", nargs="?", const="host1:0", default=None, metavar="HOST:GPU",
                   help="fail this GPU (default host1:0) after 2 iterations: the controller "
                        "rewires a spare host into the job's circuits and the job goes on")
    replay_opts(c, 5)
    c.set_defaults(func=cmd_demo)

    c = sub.add_parser("evaluate", help="iteration time of a workload under five rail policies "
                                        "over reconfiguration delays (analytic, no controller)")
    c.add_argument("workload", help="Kineto dir/tarball/JSON, AICB CSV or SimAI text")
    c.add_argument("--delay-ms", type=float, nargs="+", default=None,
                   help="reconfiguration delays in ms (default: 0.004 0.1 1 10 25 100)")
    c.add_argument("--out", default=None,
                   help="directory for evaluation.csv, evaluation.json, overhead_vs_delay.png")
    c.add_argument("--fabric", choices=["demo-4x2", "rail-16x8"], default=None,
                   help="built-in fabric (default: by world size)")
    c.add_argument("--max-ops", type=int, default=None,
                   help="evaluate only the first N collectives of each rank's iteration")
    c.add_argument("--link-gbps", type=float, default=None, help="rail link Gb/s (default 100)")
    c.add_argument("--alpha-us", type=float, default=None, help="per-hop latency µs (default 5)")
    c.add_argument("--scale-up-gbps", type=float, default=None,
                   help="NVLink Gb/s per GPU (default 2400 = 300 GB/s)")
    c.add_argument("--json", action="store_true")
    c.set_defaults(func=cmd_evaluate)

    c = sub.add_parser("slices-eval", help="torus slice allocation: contiguous-only vs photonic "
                                           "stitching (Morphlux) on a seeded trace")
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

    for name, func, doc in (
        ("status", cmd_status, "controller status"),
        ("switches", cmd_switches, "switches and their cross-connect counts"),
        ("circuits", cmd_circuits, "confirmed cross-connects"),
        ("jobs", cmd_jobs, "registered jobs"),
        ("hosts", cmd_hosts, "hosts of the fabric"),
        ("gpus", cmd_gpus, "GPU health and which job rank runs where"),
    ):
        c = sub.add_parser(name, help=doc)
        c.add_argument("--controller", default=DEFAULT_TARGET)
        c.add_argument("--json", action="store_true")
        if name == "circuits":
            c.add_argument("--switch")
            c.add_argument("--job")
        c.set_defaults(func=func)

    c = sub.add_parser("failover", help="move a job rank to a spare GPU now")
    c.add_argument("--controller", default=DEFAULT_TARGET)
    c.add_argument("--json", action="store_true")
    c.add_argument("--job", required=True, help="job id")
    c.add_argument("--rank", required=True, type=int, help="rank to move")
    c.add_argument("--to", default="", help="spare as HOST:GPU (default: the controller picks "
                                             "a healthy one in the same failure domain and "
                                             "on the same switch)")
    c.add_argument("--reason", default="manual failover")
    c.set_defaults(func=cmd_failover)

    c = sub.add_parser("drain", help="take a host out of service (its ranks fail over)")
    c.add_argument("host")
    c.add_argument("--controller", default=DEFAULT_TARGET)
    c.add_argument("--json", action="store_true")
    c.add_argument("--reason", default="operator drain")
    c.set_defaults(func=cmd_drain)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``lightrail``."""
    args = build_parser().parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    return func(args)


if __name__ == "__main__":
    sys.exit(main())
