"""An embedded controller for the demo, ``lightrail replay`` without ``--controller`` and tests:
a private single-member etcd (child process, temporary directory), the emulated switches as
their own process (``lightrail emulate``) and the controller daemon on loopback ports chosen by
the OS, all stopped on exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import tempfile
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

from lightrail.controller.app import RunningController, run_controller
from lightrail.controller.cli.drivers import driver_registry
from lightrail.controller.config import (
    Config,
    ControllerSection,
    EtcdSection,
    FabricSection,
)
from lightrail.controller.store.etcd_server import EmbeddedEtcd
from lightrail.emulator.ocs import EmulatedFabricDevices


def embedded_config(
    etcd_endpoint: str,
    fabric: FabricSection | None = None,
    *,
    admission_timeout_s: float = 30.0,
    replica_id: str = "embedded",
) -> Config:
    """A config for a controller on OS-chosen loopback ports against ``etcd_endpoint``."""
    return Config(
        controller=ControllerSection(
            replica_id=replica_id,
            listen="127.0.0.1:0",
            metrics_listen="127.0.0.1:0",
            admission_timeout_s=admission_timeout_s,
            shutdown_timeout_s=5.0,
        ),
        etcd=EtcdSection(endpoints=[etcd_endpoint], lease_ttl_s=5.0),
        fabric=fabric or FabricSection(builtin="demo-4x2"),
    )


@asynccontextmanager
async def running_controller(
    cfg: Config,
    *,
    devices: EmulatedFabricDevices | None = None,
    start_timeout_s: float = 30.0,
) -> AsyncIterator[RunningController]:
    """Run ``run_controller(cfg)`` as a task until the block exits; yields once it serves.
    ``model: emulated`` switches attach to ``devices`` (fresh ones when None).

    Raises whatever the controller raised if it stops before serving, ``TimeoutError`` if it
    does not serve within ``start_timeout_s``.
    """
    stop = asyncio.Event()
    started: asyncio.Future[RunningController] = asyncio.get_running_loop().create_future()

    def on_started(rc: RunningController) -> None:
        if not started.done():
            started.set_result(rc)

    task = asyncio.create_task(
        run_controller(cfg, stop, drivers=driver_registry(devices), on_started=on_started),
        name="controller",
    )
    try:
        waitables: set[asyncio.Future[object]] = {task, started}  # type: ignore[arg-type]
        done, _ = await asyncio.wait(waitables, timeout=start_timeout_s,
                                     return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            task.result()
            raise RuntimeError("controller exited before serving")
        if started not in done:
            raise TimeoutError(f"controller did not serve within {start_timeout_s} s")
        yield started.result()
    finally:
        stop.set()
        try:
            await asyncio.wait_for(asyncio.shield(task), cfg.controller.shutdown_timeout_s * 2)
        except TimeoutError:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


@dataclass(frozen=True, slots=True)
class ChildController:
    """A controller daemon running as a child process."""

    grpc_target: str
    metrics_url: str
    pid: int


@asynccontextmanager
async def spawn_controller(
    cfg: Config,
    *,
    start_timeout_s: float = 60.0,
    log_level: str = "warning",
    announce: Literal["leader", "serving"] = "leader",
) -> AsyncIterator[ChildController]:
    """Run ``lightrail controller --announce`` on ``cfg`` as a child process (its own CPU: the
    load a replay generates does not slow the controller it measures). Its logs go to this
    process's stderr. Stops it with SIGTERM (then SIGKILL after the shutdown timeout).
    ``announce``: yield once the child leads and serves phase calls (``leader``), or once it
    serves gRPC and /metrics, as a standby or leader (``serving``: replicas).

    Raises ``RuntimeError`` with the child's exit code if it exits before serving and
    ``TimeoutError`` if it does not announce itself within ``start_timeout_s``.
    """
    data = cfg.model_dump(mode="json")
    data["logging"] = {"level": log_level, "format": "console"}
    with tempfile.TemporaryDirectory(prefix="lightrail-ctl-") as tmp:
        path = Path(tmp) / "controller.yaml"
        path.write_text(yaml.safe_dump(data), encoding="utf-8")
        async with _announced_child(
                "controller", ["-m", "lightrail.controller", "--config", str(path),
                               f"--announce={announce}"],
                start_timeout_s=start_timeout_s,
                stop_timeout_s=cfg.controller.shutdown_timeout_s * 2) as (info, pid):
            yield ChildController(info["grpc"], info["metrics"], pid)


@asynccontextmanager
async def _announced_child(
    what: str, argv: Sequence[str], *, start_timeout_s: float, stop_timeout_s: float
) -> AsyncIterator[tuple[dict[str, Any], int]]:
    """Run ``python ARGV`` as a child process that prints one JSON line to stdout once it
    serves; yield that announcement and the child's pid. On exit SIGTERM it (unless the caller
    killed it), then SIGKILL after ``stop_timeout_s``. Its stderr is this process's. Raises
    ``RuntimeError`` with the exit code if it exits before announcing, ``TimeoutError`` if it
    does not announce within ``start_timeout_s``; ``what`` names it in both."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, *argv, stdout=asyncio.subprocess.PIPE, stdin=asyncio.subprocess.DEVNULL)
    try:
        assert proc.stdout is not None
        try:
            line = await asyncio.wait_for(proc.stdout.readline(), start_timeout_s)
        except TimeoutError:
            raise TimeoutError(f"{what} process did not serve within {start_timeout_s} s"
                               ) from None
        if not line:
            rc = await proc.wait()
            raise RuntimeError(f"{what} process exited with code {rc} before serving")
        yield json.loads(line), proc.pid
    finally:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):  # killed by the caller
                proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), stop_timeout_s)
            except TimeoutError:
                proc.kill()
                await proc.wait()


@dataclass(frozen=True, slots=True)
class ChildEmulator:
    """A ``lightrail emulate`` child process: its fault-control API (``control_url``, see
    ``lightrail.emulator.control``), the fabric section whose switches point at its devices
    (``section``: give it to the controller's config) and its process id."""

    control_url: str
    section: FabricSection
    switches: dict[str, str]
    pid: int


@asynccontextmanager
async def spawn_emulator(
    section: FabricSection,
    *,
    protocol: str = "tl1",
    start_timeout_s: float = 30.0,
    log_level: str = "warning",
    accounts: Mapping[str, str] | None = None,
) -> AsyncIterator[ChildEmulator]:
    """Run ``lightrail emulate`` on ``section`` as a child process: every switch served on a
    loopback port in its model's protocol (``protocol``, tl1 or restconf, for ``model:
    emulated`` switches), with the control API. The devices live in that process, so they
    outlive any controller. ``accounts`` (user -> password) are extra TL1 logins (``--account``).
    ``switches`` maps each switch id to its ``host:port``. Stops it
    with SIGTERM (then SIGKILL after 10 s) on exit.

    Raises ``RuntimeError`` with the child's exit code if it exits before serving and
    ``TimeoutError`` if it does not announce itself within ``start_timeout_s``.
    """
    with tempfile.TemporaryDirectory(prefix="lightrail-emu-") as tmp:
        path = Path(tmp) / "fabric.yaml"
        path.write_text(yaml.safe_dump({"fabric": section.model_dump(mode="json")}),
                        encoding="utf-8")
        async with _announced_child(
                "emulator", ["-m", "lightrail.controller.cli.main", "emulate", "--fabric",
                             str(path), "--protocol", protocol, "--log-level", log_level,
                             *(f"--account={u}:{p}" for u, p in (accounts or {}).items())],
                start_timeout_s=start_timeout_s, stop_timeout_s=10.0) as (info, pid):
            served = FabricSection.model_validate(info["fabric"])
            addresses = {sid: f"{s['host']}:{s['port']}" for sid, s in info["switches"].items()}
            yield ChildEmulator(info["control"], served, addresses, pid)


@asynccontextmanager
async def embedded_stack(
    fabric: FabricSection | None = None,
    *,
    devices: EmulatedFabricDevices | None = None,
    admission_timeout_s: float = 30.0,
) -> AsyncIterator[RunningController]:
    """Start a private etcd and a controller on it; stop both on exit.
    Raises ``EtcdNotInstalledError`` when the etcd binary is missing."""
    async with EmbeddedEtcd() as etcd:
        cfg = embedded_config(etcd.endpoint, fabric, admission_timeout_s=admission_timeout_s)
        async with running_controller(cfg, devices=devices) as rc:
            yield rc
