"""`lightrail controller`, `lightrail agent`, `lightrail check-config`: the daemons' composition."""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import signal
import sys
from collections.abc import Coroutine, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lightrail.controller.cli.common import (
    AGENT_CONTROLLER_HELP,
    DEFAULT_TARGET,
    CliUsageError,
    add_tls_arguments,
    client_tls,
    positive_int,
    run_async,
)
from lightrail.controller.cli.exitcodes import (
    ExitCode,
    Failure,
    leaves,
    one_line,
    traceback_text,
)
from lightrail.controller.config import Config, ConfigError, load_config, parse_config
from lightrail.controller.logs import configure_logging
from lightrail.controller.store.errors import StoreError

if TYPE_CHECKING:
    from lightrail.agents.host.health import HealthSource


DAEMON_GC_THRESHOLDS = (100_000, 50, 100)
"""``gc.set_threshold`` of the controller daemon's process (``cmd_controller``): the hot path
allocates short-lived, acyclic objects (decisions, batches, messages) that reference counting
frees; collecting the young generation every 700 allocations (the default) costs 10-15 % of
boundaries/s in bench/hot_path.py. Every 100k is enough for the few cycles."""


def cmd_controller(args: argparse.Namespace) -> int:
    path = Path(args.config) if args.config else None
    try:
        loaded = load_config(path)
        cfg = _with_advertise(loaded, args.advertise, path)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return ExitCode.CONFIG_ERROR
    configure_logging(cfg.logging.level, cfg.logging.format)
    # The daemon's process only (not embedded or test runs)
    gc.set_threshold(*DAEMON_GC_THRESHOLDS)

    async def main() -> int:
        from lightrail.controller.app import (
            RunningController,
            ServingReplica,
            run_controller,
        )
        from lightrail.controller.cli.drivers import driver_registry
        from lightrail.controller.cli.embedded import embedded_config
        from lightrail.controller.reload import ConfigReloader
        from lightrail.controller.runtime.sdnotify import SystemdNotifier
        from lightrail.controller.store.etcd_server import EmbeddedEtcd

        stop = asyncio.Event()
        reload_requested = asyncio.Event()
        loop = asyncio.get_running_loop()
        notifier = SystemdNotifier.from_environ()
        reloader = ConfigReloader(path, loaded, notifier)

        def stopping() -> None:
            notifier.stopping("stopping: draining phase calls, resigning the leader lease")
            stop.set()

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stopping)
        # SIGHUP (systemctl reload) reloads the config file; it no longer ends the daemon
        loop.add_signal_handler(signal.SIGHUP, reload_requested.set)

        def announce(rc: RunningController) -> None:
            notifier.status(f"leading: serving phase calls on {rc.grpc_target}, fabric "
                            f"{rc.fabric.name!r}")
            if args.announce == "leader":
                print(json.dumps({"grpc": rc.grpc_target, "metrics": rc.metrics_url}),
                      flush=True)

        def announce_serving(sr: ServingReplica) -> None:
            # ready once gRPC and /metrics serve, as a standby (it redirects) or the leader
            notifier.ready(f"standby: serving {sr.grpc_target}, campaigning for the leader "
                           "lease")
            if args.announce == "serving":
                print(json.dumps({"grpc": sr.grpc_target, "metrics": sr.metrics_url,
                                  "advertise": sr.advertise}), flush=True)

        async def serve(c: Config) -> None:
            await _with_helpers(
                run_controller(c, stop, drivers=driver_registry(), on_started=announce,
                               on_serving=announce_serving, reloader=reloader),
                {"sd-watchdog": notifier.run_watchdog(),
                 "config-reload": reloader.follow(reload_requested)})

        try:
            if cfg.etcd.embedded:
                async with EmbeddedEtcd() as etcd:
                    c2 = embedded_config(etcd.endpoint, cfg.fabric)
                    await serve(c2.model_copy(update={"controller": cfg.controller}))
            else:
                await serve(cfg)
        except Exception as exc:  # one line and a documented code, no traceback
            # (a switch not opened at start names itself: DriverError; etcd: its endpoints)
            end = controller_failure(exc, cfg.etcd.endpoints)
            if args.debug:
                print(traceback_text(exc), file=sys.stderr, end="")
            print(f"lightrail controller: {end.message}", file=sys.stderr)
            return end.code
        return ExitCode.OK

    return run_async(main())


def controller_failure(exc: BaseException, etcd_endpoints: Sequence[str]) -> Failure:
    """The exit code and one line for what ended ``lightrail controller`` (README "Exit
    codes"): fenced, etcd unreachable (naming ``etcd_endpoints``), a TLS setup error (a config
    error), a switch not opened at start, else an internal error. Inside a task group the most
    telling error counts, in that order."""
    from lightrail.controller.app import LeadershipLost, TlsSetupError
    from lightrail.drivers.base import DriverError

    found = leaves(exc)
    kinds: tuple[tuple[type[BaseException], ExitCode], ...] = (
        (LeadershipLost, ExitCode.FENCED), (StoreError, ExitCode.STORE_UNAVAILABLE),
        (TlsSetupError, ExitCode.CONFIG_ERROR), (DriverError, ExitCode.DEVICE_UNAVAILABLE))
    for kind, code in kinds:
        for leaf in found:
            if isinstance(leaf, kind):
                where = f"etcd {', '.join(etcd_endpoints)}: " if kind is StoreError else ""
                return Failure(code, f"{where}{one_line(leaf)}")
    first = found[0] if found else exc
    return Failure(ExitCode.INTERNAL_ERROR,
                   f"internal error: {type(first).__name__}: {one_line(first)} (a bug: run "
                   "with --debug for the traceback and report it)")


def _with_advertise(cfg: Config, advertise: str | None, path: Path | None) -> Config:
    """``cfg`` with ``controller.advertise`` set to ``advertise`` (``lightrail controller
    --advertise``: one config file for every replica, each advertising its own address, e.g.
    a Kubernetes pod's ``$(POD_IP):50051``); ``cfg`` itself when None. Raises ``ConfigError``
    naming ``controller.advertise`` and the value."""
    if advertise is None:
        return cfg
    data = cfg.model_dump(mode="json")
    data["controller"]["advertise"] = advertise
    return parse_config(data, f"--advertise (over {path or '<defaults>'})")


async def _with_helpers(main: Coroutine[Any, Any, None],
                        helpers: Mapping[str, Coroutine[Any, Any, None]]) -> None:
    """Run ``main`` with each of ``helpers`` as a task of that name beside it (the systemd
    watchdog, the SIGHUP reloads); they are cancelled when ``main`` ends. A helper may return
    early (no watchdog asked for); one that raises ends ``main`` and the error propagates
    (fail loud). Returns or raises what ``main`` does."""
    main_task = asyncio.create_task(main, name="controller")
    tasks = [asyncio.create_task(c, name=name) for name, c in helpers.items()]
    try:
        pending: set[asyncio.Task[None]] = {main_task, *tasks}
        while not main_task.done():
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if task is not main_task and not task.cancelled() and task.exception():
                    raise RuntimeError(f"task {task.get_name()} failed") from task.exception()
        main_task.result()
    finally:
        for task in (*tasks, main_task):
            task.cancel()
        await asyncio.gather(*tasks, main_task, return_exceptions=True)


def cmd_check_config(args: argparse.Namespace) -> int:
    try:
        cfg = load_config(Path(args.config))
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    from lightrail.controller.cli.drivers import driver_registry
    from lightrail.controller.config import build_fabric
    from lightrail.drivers.credentials import CredentialEnviron
    from lightrail.drivers.options import DriverConfigError, DriverContext

    fabric = build_fabric(cfg.fabric)
    registry = driver_registry()  # the daemon's registry, with emulated devices of its own
    problems = []
    for sw in fabric.switches.values():
        try:
            # parses model and options, credentials from the environment or systemd's
            # $CREDENTIALS_DIRECTORY, as the daemon does; opens nothing
            registry.create(sw.spec, DriverContext(environ=CredentialEnviron()))
        except DriverConfigError as exc:
            problems.append(str(exc))
    if problems:
        print(f"{args.config}: invalid configuration:\n  " + "\n  ".join(problems),
              file=sys.stderr)
        return 2
    print(f"{args.config}: OK: fabric {fabric.name!r}, {len(fabric.hosts)} hosts, "
          f"{len(fabric.switches)} switches, {len(fabric.endpoints)} endpoints")
    return 0


class HealthSourceUnavailable(Exception):
    """The GPU health source the agent was asked for cannot be opened; the message says what to
    install, or to pass ``--health emulated`` on a machine without GPUs."""


async def open_health_source(kind: str, host: str, *, emulated_gpus: int) -> HealthSource:
    """The GPU health source of ``lightrail agent --health KIND`` for ``host``: ``nvml``, an
    opened ``lightrail.agents.host.nvml.NvmlHealthSource``; ``emulated``, an
    ``lightrail.emulator.gpus.EmulatedHealthSource`` with ``emulated_gpus`` healthy GPUs (tests,
    demos). Never falls back from one to the other: an agent on a GPU host must not report
    healthy fake GPUs. Raises ``HealthSourceUnavailable`` when the NVML binding is not installed
    or NVML cannot be initialised, ``ValueError`` for another ``kind``."""
    if kind == "emulated":
        from lightrail.emulator.gpus import EmulatedHealthSource

        return EmulatedHealthSource(host, emulated_gpus)
    if kind != "nvml":
        raise ValueError(f"--health: {kind!r} is neither 'nvml' nor 'emulated'")
    try:
        from lightrail.agents.host.nvml import NvmlHealthSource
        from lightrail.agents.host.nvml_binding import NvmlUnavailableError
    except ImportError as exc:
        raise HealthSourceUnavailable(
            f"{exc}; on a machine without GPUs pass --health emulated") from exc
    source = NvmlHealthSource(host)
    try:
        await source.open()
    except NvmlUnavailableError as exc:
        raise HealthSourceUnavailable(str(exc)) from exc
    return source


def cmd_agent(args: argparse.Namespace) -> int:
    configure_logging(args.log_level, "json")
    try:
        tls = client_tls(args)
    except CliUsageError as exc:
        print(f"lightrail agent: {exc}", file=sys.stderr)
        return 2

    async def main() -> int:
        from lightrail.agents.host.agent import HostAgent
        from lightrail.agents.host.local_endpoint import serve_local
        from lightrail.agents.host.reporter import HealthReporter

        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        try:
            source = await open_health_source(args.health, args.host,
                                              emulated_gpus=args.emulated_gpus)
        except HealthSourceUnavailable as exc:
            print(f"lightrail agent: {exc}", file=sys.stderr)
            return 1
        try:
            reporter = HealthReporter(source, args.controller, tls=tls)
        except ValueError as exc:
            print(f"lightrail agent: --{exc}", file=sys.stderr)
            return 2
        async with HostAgent(args.host, args.controller, tls=tls) as agent, \
                asyncio.TaskGroup() as tg:
            monitor = tg.create_task(source.run(), name="health-monitor")
            link = tg.create_task(reporter.run(), name="health-reporter")
            if args.nccl_socket:
                from lightrail.agents.host.nccl_endpoint import NcclEndpoint

                tg.create_task(NcclEndpoint(agent).serve(args.nccl_socket, stop),
                               name="nccl-endpoint")
            await serve_local(agent, args.controller, args.socket, stop, tls=tls)
            monitor.cancel()
            link.cancel()
        return 0

    return run_async(main())


def add_parsers(subcommands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``lightrail controller``, ``lightrail check-config`` and ``lightrail agent``."""
    c = subcommands.add_parser("controller", help="run the controller daemon")
    c.add_argument("--config", help="YAML config (default: built-in demo fabric, local etcd)")
    c.add_argument("--announce", nargs="?", const="leader", choices=["leader", "serving"],
                   help="print one JSON line with the bound gRPC and metrics addresses to stdout "
                        "once this replica leads and serves phase calls (--announce or "
                        "--announce leader), or once it serves gRPC and /metrics, as a standby "
                        "(--announce serving) (for supervisors and the embedded demo)")
    c.add_argument("--debug", action="store_true",
                   help="print the traceback of what ended the daemon, not only its one-line "
                        "message (exit codes: README \"Exit codes\")")
    c.add_argument("--advertise", metavar="HOST:PORT", default=None,
                   help="the address this replica publishes while it leads, over the config's "
                        "controller.advertise (one config for every replica, e.g. "
                        "--advertise $(POD_IP):50051 in Kubernetes)")
    c.set_defaults(func=cmd_controller)

    c = subcommands.add_parser("check-config", help="validate a config file")
    c.add_argument("config", help="the controller's YAML config file to check")
    c.set_defaults(func=cmd_check_config)

    c = subcommands.add_parser("agent", help="run a host agent (phase relay)")
    c.add_argument("--controller", default=DEFAULT_TARGET, help=AGENT_CONTROLLER_HELP)
    add_tls_arguments(c)
    c.add_argument("--host", default=os.uname().nodename, help="this host's inventory name")
    c.add_argument("--socket", default="/run/lightrail/agent.sock",
                   help="Unix socket for the job-side library")
    c.add_argument("--nccl-socket", metavar="PATH", default=None,
                   help="also serve the NCCL profiler plugin (libnccl-profiler-lightrail.so) "
                        "and the framework side's communicator registrations on this Unix "
                        "socket (the plugin's LIGHTRAIL_NCCL_SOCKET, e.g. "
                        "/run/lightrail/nccl.sock); off by default")
    c.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"],
                   help="log level (default info)")
    c.add_argument("--health", choices=["nvml", "emulated"], default="nvml",
                   help="GPU health source: nvml (the NVIDIA driver's NVML; fails if it is "
                        "missing) or emulated (healthy emulated GPUs, for tests and demos "
                        "without GPUs) (default nvml)")
    c.add_argument("--emulated-gpus", type=positive_int, default=8,
                   help="GPUs of the emulated health source, with --health emulated "
                        "(default 8)")
    c.set_defaults(func=cmd_agent)
