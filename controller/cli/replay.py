"""`lightrail replay`, `lightrail demo`: traces through a controller (`lightrail evaluate`,
the cost model: ``controller/cli/evaluate.py``)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
from rich.console import Console
from rich.table import Table

from lightrail.agents.channel import ClientTls
from lightrail.agents.leader import LeaderTargets, NoLeader, describe
from lightrail.controller.cli.common import (
    DLRM_TRACE,
    CliUsageError,
    add_tls_arguments,
    client_tls,
    delay_ms,
    fabric_choices,
    fabric_option,
    make_console,
    non_negative_float,
    positive_int,
    run_async,
    shared_data_dir,
)
from lightrail.controller.cli.progress import progress_display
from lightrail.controller.domain.fabric import (
    FabricError,
    rail_shape,
    rail_shape_for,
)
from lightrail.controller.logs import configure_logging
from lightrail.v1 import operator_pb2, operator_pb2_grpc

if TYPE_CHECKING:
    from lightrail.agents.replay.replayer import Replayer


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


@dataclass(frozen=True, slots=True)
class _Fabric:
    """What the replay needs of the controller's fabric: its non-spare ``hosts``
    (``HostSlot``), its ``name`` and its largest reconfiguration delay, ms."""

    hosts: list[Any]
    name: str
    delay_ms: float


async def _fabric(target: str, tls: ClientTls | None = None) -> _Fabric:
    """The fabric of the leader among ``target`` (``host:port`` or replicas ``a:1,b:2``), over
    TLS with ``tls`` when given. Raises ``NoLeader``, ``ValueError`` (empty list) and the
    leader's ``grpc.aio.AioRpcError``."""
    from lightrail.agents.replay.replayer import HostSlot

    targets = LeaderTargets(target, tls=tls)

    async def attempt(address: str) -> _Fabric:
        async with targets.channel(address) as ch:
            stub = operator_pb2_grpc.OperatorServiceStub(ch)
            hosts: operator_pb2.ListHostsResponse = await stub.ListHosts(
                operator_pb2.ListHostsRequest(), timeout=10.0)
            status: operator_pb2.GetStatusResponse = await stub.GetStatus(
                operator_pb2.GetStatusRequest(), timeout=10.0)
            switches: operator_pb2.ListSwitchesResponse = await stub.ListSwitches(
                operator_pb2.ListSwitchesRequest(), timeout=10.0)
        delay_s = max((sw.reconfiguration_delay_s for sw in switches.switches), default=0.0)
        return _Fabric([HostSlot(h.name, tuple(h.wired_gpus)) for h in hosts.hosts
                        if not h.spare], status.fabric, delay_s * 1000.0)

    return await targets.call(attempt)


def _controller_error(shown_as: str, exc: Exception) -> tuple[str, int]:
    """One line naming the address(es) and the cause, not a traceback, and the exit code:
    ``exc`` from ``_hosts``."""
    if isinstance(exc, ValueError):
        return f"lightrail replay: --{exc}", 2
    if isinstance(exc, NoLeader):
        cause = exc.attempts[0].reason if len(exc.attempts) == 1 else str(exc)
    else:
        assert isinstance(exc, grpc.aio.AioRpcError)
        cause = describe(exc)
    return f"lightrail replay: controller {shown_as}: {cause}", 1


async def _inject_gpu_failure(
    target: str, gpu: tuple[str, int], reached: asyncio.Event, tls: ClientTls | None = None
) -> None:
    """Once ``reached`` is set, report ``gpu`` lost (XID 79) as its host agent would, to the
    leader among ``target`` (a standby's redirect comes with the first read)."""
    from lightrail.v1 import agent_pb2, agent_pb2_grpc

    await reached.wait()
    report = agent_pb2.HealthReport(host=gpu[0], gpus=[agent_pb2.GpuHealth(
        gpu=gpu[1], state=agent_pb2.GPU_FAILED, reason="GPU has fallen off the bus",
        xid=79, has_xid=True)])
    channels: list[grpc.aio.Channel] = []

    targets = LeaderTargets(target, tls=tls)

    async def attempt(address: str) -> None:
        ch = targets.channel(address)
        channels.append(ch)
        call = agent_pb2_grpc.AgentServiceStub(ch).HealthStream()  # type: ignore[call-arg]
        with contextlib.suppress(asyncio.InvalidStateError):  # ended: read() raises why
            await call.write(report)
        await call.read()

    try:
        await targets.call(attempt)
        await asyncio.Event().wait()  # keep the stream (the host's heartbeat) open
    finally:
        for ch in channels:
            await ch.close(None)


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
    tls: ClientTls | None = None,
    mqtt: bool = False,
) -> int:
    """Load ``trace``, run it through a controller (embedded when ``controller`` is None),
    print the summary. ``mqtt``: the embedded controller publishes its events to a private
    mosquitto broker when mosquitto is installed (the demo). ``fail_gpu`` (host, gpu): after
    ``fail_after`` iterations that GPU's
    emulated host reports it lost (NVML XID 79) and the job goes on with a spare. ``tls``:
    TLS to ``controller`` (the embedded one is plaintext on loopback). Returns the exit
    code."""
    from lightrail.agents.client import ControllerClient, JobRegistrationError
    from lightrail.agents.replay.replayer import Replayer, ReplayError, report_to_json
    from lightrail.agents.replay.trace.loader import load_workload
    from lightrail.agents.replay.trace.model import TraceError

    err = make_console(stderr=True)
    try:
        workload = load_workload(trace)
        fabric_name = fabric or ("demo-4x2" if workload.world_size <= 8 else "rail-16x8")
        if controller is None:
            _check_embedded_fabric(workload.world_size, fabric_name)
    except (TraceError, OSError, FabricError, _TooSmall) as exc:
        err.print(f"lightrail replay: {exc}", markup=False, highlight=False, soft_wrap=True)
        return 2

    async def run(target: str, shown_as: str, tls: ClientTls | None = None) -> int:
        """Replay against the controller at ``target`` (TLS with ``tls``); the summary names
        it ``shown_as``."""
        try:
            served = await _fabric(target, tls)
        except (grpc.aio.AioRpcError, NoLeader, ValueError) as exc:
            message, code = _controller_error(shown_as, exc)
            err.print(message, markup=False, highlight=False, soft_wrap=True)
            return code
        try:
            replayer = Replayer(workload, target, served.hosts, job_id=job_id,
                                iterations=iterations,
                                time_scale=time_scale, max_ops=max_ops, tls=tls)
        except ReplayError as exc:
            err.print(_replayer_error(exc, served.name, shown_as, external=controller is not None),
                      markup=False, highlight=False, soft_wrap=True)
            return 2
        reached = asyncio.Event()
        with progress_display(f"replaying {trace.name}", iterations, console=err,
                              enabled=progress and not as_json) as bar:

            def on_progress(done: int, _total: int) -> None:
                bar.update(done)
                if done >= fail_after:
                    reached.set()

            replayer.on_progress = on_progress
            injector = (asyncio.create_task(_inject_gpu_failure(target, fail_gpu, reached, tls),
                                            name="inject-failure")
                        if fail_gpu is not None else None)
            async with ControllerClient(target, tls=tls) as client:
                try:
                    report = await replayer.run(client)
                except (ReplayError, JobRegistrationError) as exc:
                    err.print(f"lightrail replay: {exc}", markup=False)
                    for note in getattr(exc, "__notes__", ()):  # e.g. a failed cleanup
                        err.print(f"  {note}", markup=False)
                    return 1
                finally:
                    if injector is not None:
                        injector.cancel()
        if fail_gpu is not None and not as_json:
            _print_failovers(err, replayer)
        if as_json:
            print(json.dumps(report_to_json(report), indent=2))
        else:
            where = served.name if shown_as == served.name else (
                f"{served.name} at {shown_as}")
            _print_report(make_console(), report, where, served.delay_ms)
        return 0

    if controller is not None:
        return await run(controller, controller, tls)
    return await _replay_embedded(run, fabric_name, spare_host=fail_gpu is not None,
                                  delay_ms=delay_ms, devices=devices,
                                  err=err if progress and not as_json and err.is_terminal
                                  else None, mqtt=mqtt)


def _fit_hint(world_size: int, *, external: bool) -> str:
    """Which rail fabric holds ``world_size`` ranks and how to ask for it: ``--fabric
    rail:HOSTSxGPUS`` (``rail_shape_for``) on the embedded controller; with an ``external``
    controller, that its fabric must be as large, or the embedded one with that option."""
    try:
        fit = rail_shape_for(world_size)
    except FabricError as exc:
        return f"no rail fabric fits: {exc}"
    size = f"{fit.hosts} hosts x {fit.gpus_per_host} GPUs = {fit.gpus}"
    if external:
        return (f"replay against a controller whose fabric has at least {world_size} GPUs, "
                f"or without --controller with --fabric {fit.option} ({size}) for an "
                "embedded one that fits")
    return f"a fabric that fits: --fabric {fit.option} ({size})"


def _replayer_error(exc: Exception, fabric: str, shown_as: str, *, external: bool) -> str:
    """The line for a ``ReplayError`` of building the replay on ``fabric`` (served at
    ``shown_as``): a job larger than the fabric says which fabric would fit and how to ask
    for it."""
    from lightrail.agents.replay.replayer import FabricTooSmall

    if not isinstance(exc, FabricTooSmall):
        return f"lightrail replay: {exc}"
    where = f"fabric {fabric} of the controller at {shown_as}" if external else f"fabric {fabric}"
    return f"lightrail replay: {exc} ({where}); {_fit_hint(exc.world_size, external=external)}"


class _TooSmall(ValueError):
    """The embedded fabric has fewer GPUs than the job has ranks (the message says which
    fabric would fit and how to ask for it)."""


def _check_embedded_fabric(world_size: int, fabric: str) -> None:
    """Raise ``_TooSmall`` when the embedded fabric ``fabric`` (a built-in name or
    ``rail:HOSTSxGPUS``) has fewer GPUs than the job has ranks; before anything starts."""
    shape = rail_shape(fabric)
    if world_size > shape.gpus:
        raise _TooSmall(f"job has {world_size} ranks but fabric {shape.name} offers "
                        f"{shape.hosts} hosts x {shape.gpus_per_host} GPUs = {shape.gpus}; "
                        f"{_fit_hint(world_size, external=False)}")


def _print_failovers(err: Console, replayer: Replayer) -> None:
    """One paragraph per placement change ``replayer`` saw: the controller's message and the
    failover timeline from detection (planned, switch confirmed, placement stored; ms)."""
    for ev in replayer.placement_events:
        f = ev.fields
        err.print(
            f"[bold]failover[/]: {ev.message}\n  timeline from detection: planned "
            f"{float(f.get('planned_s', 0)) * 1e3:.1f} ms, switch confirmed "
            f"{float(f.get('device_confirmed_s', 0)) * 1e3:.1f} ms, placement stored "
            f"{float(f.get('stored_s', 0)) * 1e3:.1f} ms; the job restarted the "
            f"iteration from its checkpoint ({replayer.restarts} restart(s))")


async def _replay_embedded(
    run: Callable[[str, str], Awaitable[int]],
    fabric_name: str,
    *,
    spare_host: bool,
    delay_ms: float,
    devices: str,
    err: Console | None,
    mqtt: bool = False,
) -> int:
    """``run(target, fabric)`` against an embedded etcd, emulated rails of the built-in fabric
    ``fabric_name`` (``delay_ms`` reconfiguration delay; plus one spare host wired to both rails
    when ``spare_host``, for failover) and a controller child process. ``devices`` tl1 or
    restconf: the switches run in a ``lightrail emulate`` child process and the controller
    drives them over sockets; emulated: the controller's in-process driver. ``fabric`` is the
    section's name. ``err``, when given, gets a one-line note before startup. Returns ``run``'s
    exit code."""
    from lightrail.controller.cli.broker import Mosquitto, mosquitto_binary
    from lightrail.controller.cli.embedded import (
        embedded_config,
        spawn_controller,
        spawn_emulator,
    )
    from lightrail.controller.config import MqttSection
    from lightrail.controller.store.etcd_server import EmbeddedEtcd
    from lightrail.emulator.servers.fabric import rail_section

    section = rail_section(fabric_name, spares=1 if spare_host else 0, delay_ms=delay_ms)
    fabric_name = section.name or fabric_name
    if err is not None:
        how = {"tl1": "TL1 (Polatis dialect) over TCP", "restconf": "RESTCONF over HTTP",
               "emulated": "the in-process driver"}[devices]
        where = ("in the controller" if devices == "emulated"
                 else "in an emulator process")
        err.print(f"starting an embedded etcd, emulated switches {where} speaking {how}, and "
                  f"a controller process (fabric {fabric_name}) ...")
    async with EmbeddedEtcd() as etcd, contextlib.AsyncExitStack() as stack:
        if devices != "emulated":
            emulator = await stack.enter_async_context(spawn_emulator(section, protocol=devices))
            section = emulator.section
        cfg = embedded_config(etcd.endpoint, section)
        if mqtt and mosquitto_binary() is not None:
            broker = await stack.enter_async_context(Mosquitto())
            cfg = cfg.model_copy(update={"mqtt": MqttSection(host=broker.host,
                                                             port=broker.port)})
            if err is not None:
                topics = f"lightrail/{fabric_name}/#"
                sub = (f"mosquitto_sub -h {broker.host} -p {broker.port} -t '{topics}' -v"
                       if shutil.which("mosquitto_sub") else
                       f"an MQTT client on {broker.host}:{broker.port}, topic {topics}")
                err.print(f"events and alarms over MQTT: subscribe with {sub}", markup=False,
                          highlight=False)
        async with spawn_controller(cfg) as child:
            if err is not None:
                err.print(f"events over gRPC: lightrail events --follow --controller "
                          f"{child.grpc_target}", markup=False, highlight=False)
            return await run(child.grpc_target, fabric_name)


def cmd_replay(args: argparse.Namespace) -> int:
    configure_logging("warning", "console")
    try:
        tls = client_tls(args)
    except CliUsageError as exc:
        print(f"lightrail replay: {exc}", file=sys.stderr)
        return 2
    return run_async(replay_main(
        Path(args.trace), controller=args.controller, fabric=args.fabric,
        delay_ms=args.delay_ms, iterations=args.iterations, time_scale=args.time_scale,
        job_id=args.job_id, as_json=args.json, progress=not args.no_progress,
        max_ops=args.max_ops, devices=args.devices, tls=tls,
    ))


def cmd_demo(args: argparse.Namespace) -> int:
    if args.torch and (args.trace or args.fail_gpu or args.devices != "tl1"):
        print("lightrail demo: --torch runs its own job on TL1 switches: no --trace, "
              "--fail-gpu or --devices", file=sys.stderr)
        return 2
    configure_logging("warning", "console")
    if args.torch:
        from lightrail.controller.cli.torch_demo import torch_demo_main

        return run_async(torch_demo_main(make_console(), make_console(stderr=True),
                                         steps=args.iterations, delay_ms=args.delay_ms))
    trace = Path(args.trace) if args.trace else shared_data_dir() / DLRM_TRACE
    fail_gpu = None
    if args.fail_gpu:
        host, _, gpu = args.fail_gpu.rpartition(":")
        if not host or not gpu.isdecimal():
            print(f"lightrail demo: --fail-gpu: expected HOST:GPU, got {args.fail_gpu!r}",
                  file=sys.stderr)
            return 2
        fail_gpu = (host, int(gpu))
    if not trace.exists():
        print(f"lightrail demo: trace not found: {trace} (set LIGHTRAIL_DATA to the folder "
              "holding traces/param-dlrm-8rank)", file=sys.stderr)
        return 2
    console = make_console(stderr=True)
    console.print("[bold]Lightrail demo[/]: an embedded etcd, the controller driving 2 emulated "
                  "rail OCSes over TL1 sockets (4 hosts x 2 GPUs), and 4 host agents replaying "
                  "the recorded DLRM training step of 8 ranks (PyTorch Kineto)"
                  + (", failing a GPU after 2 iterations." if args.fail_gpu else "."))
    return run_async(replay_main(
        trace, controller=None, fabric="demo-4x2", delay_ms=args.delay_ms,
        iterations=args.iterations, time_scale=args.time_scale, job_id="dlrm-demo",
        as_json=False, progress=True, fail_gpu=fail_gpu, devices=args.devices, mqtt=True,
    ))


def _add_replay_options(c: argparse.ArgumentParser, iterations: int) -> None:
    """The options ``replay`` and ``demo`` share; ``iterations`` is the default step count."""
    c.add_argument("--iterations", type=positive_int, default=iterations,
                   help=f"training steps to replay (default {iterations})")
    c.add_argument("--time-scale", type=non_negative_float, default=1.0,
                   help="multiply recorded compute gaps and transfer times (0: no waits; "
                        "default 1)")
    c.add_argument("--delay-ms", type=delay_ms, default=10.0,
                   help="reconfiguration delay of the emulated OCSes, embedded controller "
                        "only (default 10)")
    c.add_argument("--devices", choices=["tl1", "restconf", "emulated"], default="tl1",
                   help="how the embedded controller reaches its emulated switches: TL1 or "
                        "RESTCONF over sockets, or the in-process driver (default tl1)")


def add_parsers(subcommands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``lightrail replay`` and ``lightrail demo``."""
    c = subcommands.add_parser("replay",
                               help="replay a recorded trace or workload through a controller")
    c.add_argument("trace", help="Kineto dir/tarball/JSON, AICB CSV, SimAI text or an Opus "
                                 "experiment/pattern folder")
    c.add_argument("--controller", default=None,
                   help="controller host:port, or the replicas' addresses "
                        "HOST:PORT,HOST:PORT,... (the leader answers) (default: start an "
                        "embedded one)")
    add_tls_arguments(c)
    c.add_argument("--fabric", type=fabric_option, choices=fabric_choices(), default=None,
                   metavar="FABRIC",
                   help="embedded fabric: demo-4x2, rail-16x8 or rail:HOSTSxGPUS (e.g. "
                        "rail:32x8) (default: demo-4x2 up to 8 ranks, else rail-16x8)")
    c.add_argument("--job-id", default="replay", help="job id to register (default replay)")
    c.add_argument("--json", action="store_true", help="print the summary as JSON")
    c.add_argument("--no-progress", action="store_true", help="no progress bar")
    c.add_argument("--max-ops", type=positive_int, default=None,
                   help="replay only the first N collectives of each rank's iteration")
    _add_replay_options(c, 3)
    c.set_defaults(func=cmd_replay)

    c = subcommands.add_parser("demo",
                               help="the DLRM replay on an embedded etcd, controller and rails")
    c.add_argument("--trace", default=None,
                   help="trace to replay (default: the DLRM 8-rank Kineto trace in "
                        "$LIGHTRAIL_DATA or ../shared/data)")
    c.add_argument("--fail-gpu", nargs="?", const="host1:0", default=None, metavar="HOST:GPU",
                   help="fail this GPU (default host1:0) after 2 iterations: the controller "
                        "rewires a spare host into the job's circuits and the job goes on")
    c.add_argument("--torch", action="store_true",
                   help="instead of the replay, train examples/torch/train_pp_dp.py (PP=2 x "
                        "DP=2, torchrun, 4 CPU processes) through the lightrail backend on 4 "
                        "emulated hosts of one rail, then on plain gloo: the per-phase summary "
                        "and both runs' losses (needs lightrail[torch]; --iterations: steps)")
    _add_replay_options(c, 5)
    c.set_defaults(func=cmd_demo)
