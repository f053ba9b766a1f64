"""``lightrail``: the command line of the controller, the host agent, replay and operators.

Subcommands: controller, agent, replay, demo, check-config, status, switches, circuits, jobs,
hosts. Operator commands print tables, or JSON with ``--json``. Exit codes: 0 success, 1 a
runtime failure (message on stderr), 2 bad usage or invalid input.
"""

from __future__ import annotations

import os

# The CLI forks etcd and controller processes; gRPC's fork handlers only print warnings then.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

import argparse
import asyncio
import json
import math
import signal
import sys
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any

import grpc
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from lightrail.controller.config import ConfigError, load_config
from lightrail.controller.logs import configure_logging
from lightrail.v1 import operator_pb2, operator_pb2_grpc

DEFAULT_TARGET = os.environ.get("LIGHTRAIL_CONTROLLER", "127.0.0.1:50051")
REPO_ROOT = Path(__file__).resolve().parents[2]


def shared_data_dir() -> Path:
    """Where the recorded traces live: ``$LIGHTRAIL_DATA`` or ``../shared/data`` beside the
    repository."""
    env = os.environ.get("LIGHTRAIL_DATA")
    return Path(env) if env else REPO_ROOT.parent / "shared" / "data"


DLRM_TRACE = "traces/param-dlrm-8rank/dlrm_kineto.tar.gz"


def _console(stderr: bool = False) -> Console:
    """A console that does not wrap tables at 80 columns when output is not a terminal."""
    stream = sys.stderr if stderr else sys.stdout
    return Console(stderr=stderr, width=None if stream.isatty() else 120)


def _run(coro: Coroutine[Any, Any, int]) -> int:
    import uvloop

    return uvloop.run(coro)


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def non_negative_float(text: str) -> float:
    """argparse type: a finite number >= 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return value


# --- controller / agent ------------------------------------------------------------------


def cmd_controller(args: argparse.Namespace) -> int:
    try:
        cfg = load_config(Path(args.config) if args.config else None)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    configure_logging(cfg.logging.level, cfg.logging.format)

    async def main() -> int:
        from lightrail.controller.app import LeadershipLost, RunningController, run_controller
        from lightrail.controller.cli.embedded import embedded_config
        from lightrail.controller.store.etcd_server import EmbeddedEtcd

        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        def announce(rc: RunningController) -> None:
            if args.announce:
                print(json.dumps({"grpc": rc.grpc_target, "metrics": rc.metrics_url}),
                      flush=True)

        try:
            if cfg.etcd.embedded:
                async with EmbeddedEtcd() as etcd:
                    c2 = embedded_config(etcd.endpoint, cfg.fabric)
                    c2 = c2.model_copy(update={"controller": cfg.controller})
                    await run_controller(c2, stop, on_started=announce)
            else:
                await run_controller(cfg, stop, on_started=announce)
        except LeadershipLost as exc:
            print(f"lightrail controller: {exc}", file=sys.stderr)
            return 1
        return 0

    return _run(main())


def cmd_check_config(args: argparse.Namespace) -> int:
    try:
        cfg = load_config(Path(args.config))
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    from lightrail.controller.config import build_fabric
    from lightrail.drivers.registry import DriverConfigError, DriverContext, create_driver
    from lightrail.emulator.ocs import EmulatedFabricDevices

    fabric = build_fabric(cfg.fabric)
    context = DriverContext(emulated_devices=EmulatedFabricDevices())
    problems = []
    for sw in fabric.switches.values():
        try:
            create_driver(sw, context=context)  # validates model and options; opens nothing
        except DriverConfigError as exc:
            problems.append(str(exc))
    if problems:
        print(f"{args.config}: invalid configuration:\n  " + "\n  ".join(problems),
              file=sys.stderr)
        return 2
    print(f"{args.config}: OK: fabric {fabric.name!r}, {len(fabric.hosts)} hosts, "
          f"{len(fabric.switches)} switches, {len(fabric.endpoints)} endpoints")
    return 0


def cmd_agent(args: argparse.Namespace) -> int:
    configure_logging(args.log_level, "json")

    async def main() -> int:
        from lightrail.agents.host.agent import HostAgent
        from lightrail.agents.host.health import (
            HealthConfig,
            NvmlUnavailableError,
            create_health_source,
        )
        from lightrail.agents.host.local_endpoint import serve_local
        from lightrail.agents.host.reporter import HealthReporter

        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        try:
            source = await create_health_source(args.host, HealthConfig(
                emulated_fallback=args.health == "auto", emulated_gpus=args.emulated_gpus))
        except NvmlUnavailableError as exc:
            print(f"lightrail agent: {exc}", file=sys.stderr)
            return 1
        reporter = HealthReporter(source, args.controller)
        async with HostAgent(args.host, args.controller) as agent, asyncio.TaskGroup() as tg:
            monitor = tg.create_task(source.run(), name="health-monitor")
            link = tg.create_task(reporter.run(), name="health-reporter")
            await serve_local(agent, args.controller, args.socket, stop)
            monitor.cancel()
            link.cancel()
        return 0

    return _run(main())


# --- replay / demo -------------------------------------------------------------------------


def _print_report(console: Console, report: Any, fabric: str, delay_ms: float) -> None:
    from lightrail.agents.replay.replayer import ReplayReport

    assert isinstance(report, ReplayReport)
    hosts = sorted({p.host for p in report.placements})
    console.print(
        f"[bold]job {report.job_id}[/]: {report.world_size} ranks on {len(hosts)} hosts of "
        f"fabric {fabric} (reconfiguration delay {delay_ms:g} ms), {report.iterations} "
        f"iterations in {report.wall_s:.2f} s"
    )
    for note in report.notes:
        console.print(f"  note: {note}")
    if report.scale_up_ops:
        console.print(f"  note: {report.scale_up_ops} rank-ops were on groups inside one host "
                      "(scale-up, e.g. TP over NVLink): no circuit, no controller call")
    if report.unplanned_ops:
        console.print(f"  note: {report.unplanned_ops} rank-ops had no known process group and "
                      "ran without circuits")
    table = Table(title="Per-phase summary (admission latency: last arrival -> admission, "
                        "device delay excluded)")
    for col in ("phase", "count", "reconfig", "adm p50 ms", "adm p99 ms", "device ms",
                "stall ms/iter"):
        table.add_column(col, justify="left" if col == "phase" else "right")
    for r in report.rows:
        table.add_row(r.phase, str(r.count), str(r.reconfigurations), f"{r.p50_ms:.3f}",
                      f"{r.p99_ms:.3f}", f"{r.device_ms:.2f}", f"{r.stall_ms_per_iter:.2f}")
    console.print(table)
    console.print(f"total stall per iteration (mean per rank): {report.stall_ms_per_iter:.2f} ms")
    prov = report.provisioning
    if prov is not None:
        state = "learned" if prov.learned else "not learned"
        console.print(
            f"provisioning (schedule {state}): {prov.hits} phases switched ahead and ready, "
            f"{prov.late} still switching when ranks came, {prov.misses} switched on demand "
            f"-> hit rate {prov.hit_rate:.0%}")


async def _hosts(target: str) -> list[Any]:
    from lightrail.agents.replay.replayer import HostSlot

    async with grpc.aio.insecure_channel(target) as ch:
        resp = await operator_pb2_grpc.OperatorServiceStub(ch).ListHosts(
            operator_pb2.ListHostsRequest(), timeout=10.0)
    return [HostSlot(h.name, tuple(h.wired_gpus)) for h in resp.hosts if not h.spare]


async def _inject_gpu_failure(
    target: str, gpu: tuple[str, int], reached: asyncio.Event
) -> None:
    """Once ``reached`` is set, report ``gpu`` lost (XID 79) as its host agent would."""
    from lightrail.v1 import agent_pb2, agent_pb2_grpc

    await reached.wait()
    async with grpc.aio.insecure_channel(target) as ch:
        call = agent_pb2_grpc.AgentServiceStub(ch).HealthStream()  # type: ignore[call-arg]
        await call.write(agent_pb2.HealthReport(host=gpu[0], gpus=[agent_pb2.GpuHealth(
            gpu=gpu[1], state=agent_pb2.GPU_FAILED, reason="GPU has fallen off the bus",
            xid=79, has_xid=True)]))
        await call.read()
        await asyncio.Event().wait()  # keep the stream (the host's heartbeat) open


async def replay_main(
    trace: Path,
    *,
    controller: str | None,
    fabric: str | None,
    delay_ms: float,
    iterations: int,
    time_scale: float,
    job_id: str,
    as_json: bool,
    progress: bool,
    max_ops: int | None = None,
    fail_gpu: tuple[str, int] | None = None,
    fail_after: int = 2,
    devices: str = "tl1",
) -> int:
    """Load ``trace``, run it through a controller (embedded when ``controller`` is None),
    print the summary. ``fail_gpu`` (host, gpu): after ``fail_after`` iterations that GPU's
    emulated host reports it lost (NVML XID 79) and the job goes on with a spare. Returns the
    exit code."""
    from lightrail.agents.client import ControllerClient, JobRegistrationError
    from lightrail.agents.replay.replayer import Replayer, ReplayError, report_to_json
    from lightrail.agents.replay.trace.loader import load_workload
    from lightrail.agents.replay.trace.model import TraceError

    err = _console(stderr=True)
    try:
        workload = load_workload(trace)
    except (TraceError, OSError) as exc:
        err.print(f"lightrail replay: {exc}")
        return 2
    fabric_name = fabric or ("demo-4x2" if workload.world_size <= 8 else "rail-16x8")

    async def run(target: str) -> int:
        hosts = await _hosts(target)
        try:
            replayer = Replayer(workload, target, hosts, job_id=job_id, iterations=iterations,
                                time_scale=time_scale, max_ops=max_ops)
        except ReplayError as exc:
            err.print(f"lightrail replay: {exc}")
            return 2
        bar = Progress(TextColumn("replaying {task.description}"), BarColumn(),
                       MofNCompleteColumn(), TimeElapsedColumn(), console=err,
                       disable=not progress or as_json)
        reached = asyncio.Event()
        with bar:
            task = bar.add_task(trace.name, total=iterations)

            def on_progress(done: int, _total: int) -> None:
                bar.update(task, completed=done)
                if done >= fail_after:
                    reached.set()

            replayer.on_progress = on_progress
            injector = (asyncio.create_task(_inject_gpu_failure(target, fail_gpu, reached),
                                            name="inject-failure")
                        if fail_gpu is not None else None)
            async with ControllerClient(target) as client:
                try:
                    report = await replayer.run(client)
                except (ReplayError, JobRegistrationError) as exc:
                    err.print(f"lightrail replay: {exc}")
                    return 1
                finally:
                    if injector is not None:
                        injector.cancel()
        if fail_gpu is not None and not as_json:
            for ev in replayer.placement_events:
                f = ev.fields
                err.print(
                    f"[bold]failover[/]: {ev.message}\n  timeline from detection: planned "
                    f"{float(f.get('planned_s', 0)) * 1e3:.1f} ms, switch confirmed "
                    f"{float(f.get('device_confirmed_s', 0)) * 1e3:.1f} ms, placement stored "
                    f"{float(f.get('stored_s', 0)) * 1e3:.1f} ms; the job restarted the "
                    f"iteration from its checkpoint ({replayer.restarts} restart(s))")
        if as_json:
            print(json.dumps(report_to_json(report), indent=2))
        else:
            _print_report(_console(), report, fabric_name if controller is None else target,
                          delay_ms)
        return 0

    if controller is not None:
        return await run(controller)
    from lightrail.controller.cli.embedded import embedded_config, spawn_controller
    from lightrail.controller.store.etcd_server import EmbeddedEtcd
    from lightrail.emulator.ocs import EmulatedFabricDevices
    from lightrail.emulator.servers.fabric import emulated_rails, rail_section

    # the demo fabric plus one spare host wired to both rails when failover needs a spare
    spares = 1 if fail_gpu is not None else 0
    section = rail_section(fabric_name, spares=spares, delay_ms=delay_ms)
    fabric_name = section.name or fabric_name
    if progress and not as_json:
        how = {"tl1": "TL1 (Polatis dialect) over TCP", "restconf": "RESTCONF over HTTP",
               "emulated": "the in-process driver"}[devices]
        err.print(f"starting an embedded etcd, emulated switches speaking {how}, and a "
                  f"controller process (fabric {fabric_name}) ...")
    async with EmbeddedEtcd() as etcd, \
            emulated_rails(section, EmulatedFabricDevices(), devices) as served:
        cfg = embedded_config(etcd.endpoint, served)
        async with spawn_controller(cfg) as child:
            return await run(child.grpc_target)


def cmd_replay(args: argparse.Namespace) -> int:
    configure_logging("warning", "console")
    return _run(replay_main(
        Path(args.trace), controller=args.controller, fabric=args.fabric,
        delay_ms=args.delay_ms, iterations=args.iterations, time_scale=args.time_scale,
        job_id=args.job_id, as_json=args.json, progress=not args.no_progress,
        max_ops=args.max_ops, devices=args.devices,
    ))


def cmd_demo(args: argparse.Namespace) -> int:
    configure_logging("warning", "console")
    trace = Path(args.trace) if args.trace else shared_data_dir() / DLRM_TRACE
    fail_gpu = None
    if args.fail_gpu:
        host, _, gpu = args.fail_gpu.rpartition(":")
        if not host or not gpu.isdigit():
            print(f"lightrail demo: --fail-gpu: expected HOST:GPU, got {args.fail_gpu!r}",
                  file=sys.stderr)
            return 2
        fail_gpu = (host, int(gpu))
    if not trace.exists():
        print(f"lightrail demo: trace not found: {trace} (set LIGHTRAIL_DATA to the folder "
              "holding traces/param-dlrm-8rank)", file=sys.stderr)
        return 2
    console = _console(stderr=True)
    console.print("[bold]Lightrail demo[/]: an embedded etcd, the controller driving 2 emulated "
                  "rail OCSes over TL1 sockets (4 hosts x 2 GPUs), and 4 host agents replaying "
                  "the recorded DLRM training step of 8 ranks (PyTorch Kineto)"
                  + (", failing a GPU after 2 iterations." if args.fail_gpu else "."))
    return _run(replay_main(
        trace, controller=None, fabric="demo-4x2", delay_ms=args.delay_ms,
        iterations=args.iterations, time_scale=args.time_scale, job_id="dlrm-demo",
        as_json=False, progress=True, fail_gpu=fail_gpu, devices=args.devices,
    ))


def cmd_evaluate(args: argparse.Namespace) -> int:
    from lightrail.agents.replay.evaluate import evaluate_main

    return evaluate_main(
        Path(args.workload), args.delay_ms, Path(args.out) if args.out else None,
        fabric=args.fabric, max_ops=args.max_ops, link_gbps=args.link_gbps,
        alpha_us=args.alpha_us, scale_up_gbps=args.scale_up_gbps, as_json=args.json,
    )


# --- operator commands ---------------------------------------------------------------------


async def _operator_call(
    target: str, call: Callable[[operator_pb2_grpc.OperatorServiceStub], Any]
) -> Message:
    async with grpc.aio.insecure_channel(target) as ch:
        stub = operator_pb2_grpc.OperatorServiceStub(ch)
        result: Message = await call(stub)
        return result


def _operator(args: argparse.Namespace, call: Callable[[Any], Any],
              render: Callable[[Any], Table | str]) -> int:
    async def main() -> int:
        try:
            resp = await _operator_call(args.controller, call)
        except grpc.aio.AioRpcError as exc:
            print(f"lightrail {args.cmd}: {exc.code().name}: {exc.details()}", file=sys.stderr)
            return 1
        if args.json:
            print(json.dumps(MessageToDict(resp, always_print_fields_with_no_presence=True),
                             indent=2))
        else:
            _console().print(render(resp))
        return 0

    return _run(main())


def _table(title: str, cols: Sequence[str], rows: Sequence[Sequence[object]]) -> Table:
    t = Table(title=title)
    for c in cols:
        t.add_column(c)
    for r in rows:
        t.add_row(*(str(x) for x in r))
    return t


def cmd_status(args: argparse.Namespace) -> int:
    def render(r: operator_pb2.GetStatusResponse) -> Table:
        return _table("controller", ["replica", "leader", "fabric", "jobs", "switches",
                                     "cross-connects", "reconfigurations", "uptime s"],
                      [[r.replica_id, r.leader, r.fabric, r.jobs, r.switches, r.cross_connects,
                        r.reconfigurations, f"{r.uptime_s:.0f}"]])
    return _operator(args, lambda s: s.GetStatus(operator_pb2.GetStatusRequest(), timeout=10),
                     render)


def cmd_switches(args: argparse.Namespace) -> int:
    def render(r: operator_pb2.ListSwitchesResponse) -> Table:
        return _table("switches", ["switch", "model", "kind", "ports", "rail", "delay ms",
                                   "cross-connects", "reconfigurations"],
                      [[s.switch_id, s.model, s.kind, s.port_count,
                        s.rail if s.has_rail else "-", f"{s.reconfiguration_delay_s * 1e3:g}",
                        s.cross_connects, s.reconfigurations] for s in r.switches])
    return _operator(args, lambda s: s.ListSwitches(operator_pb2.ListSwitchesRequest(),
                                                    timeout=10), render)


def cmd_circuits(args: argparse.Namespace) -> int:
    def render(r: operator_pb2.ListCircuitsResponse) -> Table:
        return _table("cross-connects", ["switch", "ingress", "egress", "from", "to", "job"],
                      [[c.switch_id, c.ingress, c.egress, c.from_endpoint or "-",
                        c.to_endpoint or "-", c.job_id or "-"] for c in r.cross_connects])
    req = operator_pb2.ListCircuitsRequest(switch_id=args.switch or "", job_id=args.job or "")
    return _operator(args, lambda s: s.ListCircuits(req, timeout=10), render)


def cmd_jobs(args: argparse.Namespace) -> int:
    def render(r: operator_pb2.ListJobsResponse) -> Table:
        return _table("jobs", ["job", "tenant", "ranks", "hosts", "admitted", "reconfigurations",
                               "last phase"],
                      [[j.job_id, j.tenant, j.world_size, len(j.hosts), j.phases_admitted,
                        j.reconfigurations, j.current_phase or "-"] for j in r.jobs])
    return _operator(args, lambda s: s.ListJobs(operator_pb2.ListJobsRequest(), timeout=10),
                     render)


def cmd_gpus(args: argparse.Namespace) -> int:
    def render(r: operator_pb2.ListGpusResponse) -> Table:
        return _table("GPUs", ["host", "gpu", "domain", "spare host", "health", "reason",
                               "job", "rank", "heartbeat age s"],
                      [[g.host, g.gpu, g.failure_domain, g.spare_host, g.state, g.reason or "-",
                        g.job_id or "-", g.rank if g.has_rank else "-",
                        f"{g.heartbeat_age_s:.1f}" if g.heartbeat_age_s >= 0 else "-"]
                       for g in r.gpus])
    return _operator(args, lambda s: s.ListGpus(operator_pb2.ListGpusRequest(), timeout=10),
                     render)


def _timeline_table(title: str, fos: Sequence[operator_pb2.FailoverResponse]) -> Table:
    return _table(title, ["job", "rank", "from", "to", "planned ms", "confirmed ms",
                          "notified ms"],
                  [[f.job_id, f.rank, f"{f.from_host}/gpu{f.from_gpu}",
                    f"{f.to_host}/gpu{f.to_gpu}", f"{f.planned_s * 1e3:.1f}",
                    f"{f.device_confirmed_s * 1e3:.1f}", f"{f.job_notified_s * 1e3:.1f}"]
                   for f in fos])


def cmd_failover(args: argparse.Namespace) -> int:
    spare_host, spare_gpu = "", 0
    if args.to:
        host, _, gpu = args.to.rpartition(":")
        if not host or not gpu.isdigit():
            print(f"lightrail failover: --to: expected HOST:GPU, got {args.to!r}",
                  file=sys.stderr)
            return 2
        spare_host, spare_gpu = host, int(gpu)
    req = operator_pb2.FailoverRequest(job_id=args.job, rank=args.rank, spare_host=spare_host,
                                       spare_gpu=spare_gpu, reason=args.reason)
    return _operator(args, lambda s: s.Failover(req, timeout=60),
                     lambda r: _timeline_table("failover", [r]))


def cmd_drain(args: argparse.Namespace) -> int:
    req = operator_pb2.DrainRequest(host=args.host, reason=args.reason)
    return _operator(args, lambda s: s.Drain(req, timeout=120),
                     lambda r: _timeline_table(f"drained {args.host}", list(r.failovers)))


def cmd_hosts(args: argparse.Namespace) -> int:
    def render(r: operator_pb2.ListHostsResponse) -> Table:
        return _table("hosts", ["host", "failure domain", "gpus", "spare"],
                      [[h.name, h.failure_domain, h.gpus, h.spare] for h in r.hosts])
    return _operator(args, lambda s: s.ListHosts(operator_pb2.ListHostsRequest(), timeout=10),
                     render)


# --- parser ----------------------------------------------------------------------------------


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
    c.add_argument("--health", choices=["nvml", "auto"], default="auto",
                   help="GPU health from NVML; auto falls back to emulated GPUs where NVML is "
                        "missing (default auto)")
    c.add_argument("--emulated-gpus", type=positive_int, default=8,
                   help="GPUs of the emulated health source (default 8)")
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
