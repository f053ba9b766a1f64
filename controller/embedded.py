"""An embedded controller for the demo, ``lightrail replay`` without ``--controller`` and tests:
a private single-member etcd (child process, temporary directory) and the controller daemon
on loopback ports chosen by the OS, both stopped on exit.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from controller.app import RunningController, run_controller
from controller.config import (
    Config,
    ControllerSection,
    EtcdSection,
    FabricSection,
)
from controller.etcd_server import EmbeddedEtcd
from emulator.ocs import EmulatedFabricDevices


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

    Raises whatever the controller raised if it stops before serving, ``TimeoutError`` if it
    does not serve within ``start_timeout_s``.
    """
    stop = asyncio.Event()
    started: asyncio.Future[RunningController] = asyncio.get_running_loop().create_future()

    def on_started(rc: RunningController) -> None:
        if not started.done():
            started.set_result(rc)

    task = asyncio.create_task(
        run_controller(cfg, stop, devices=devices, on_started=on_started), name="controller"
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
