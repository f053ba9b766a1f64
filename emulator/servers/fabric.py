"""Serve a whole fabric's switches as emulated devices on 127.0.0.1 sockets, each speaking a
real management protocol (TL1 in the Polatis dialect, or RESTCONF ``optical-switch``), so the
controller drives them through the same drivers and code paths as hardware.

Each server wraps the ``EmulatedOcs`` of its switch from an ``EmulatedFabricDevices`` registry:
device state, timing, faults and the change log stay inspectable in-process (tests check the
safety invariant on them), and outlive a controller restart.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from lightrail.controller.config import FabricSection, build_fabric
from lightrail.controller.domain.fabric import Fabric
from lightrail.emulator.ocs import EmulatedFabricDevices
from lightrail.emulator.servers.restconf import RestconfServer
from lightrail.emulator.servers.tl1 import Tl1Server

EMULATOR_USER = "admin"
EMULATOR_PASSWORD = "root"  # the emulated devices' built-in account, not a real secret

OptionValue = str | int | float | bool


RAIL_BUILTINS = {"demo-4x2": (4, 2), "rail-16x8": (16, 8)}
"""Built-in fabric names as (hosts, GPUs per host) of a rail fabric."""


def rail_section(
    name: str,
    *,
    spares: int = 0,
    delay_ms: float,
    protocol: str = "emulated",
    switch_options: dict[str, dict[str, OptionValue]] | None = None,
) -> FabricSection:
    """The config section of built-in rail fabric ``name`` (plus ``spares`` hosts), its
    switches driven by ``protocol`` with ``switch_options``. Raises ``KeyError`` for an unknown
    name."""
    hosts, gpus = RAIL_BUILTINS[name]
    return FabricSection.model_validate({
        "name": name + (f"+{spares}spare" if spares else ""),
        "rail": {"hosts": hosts, "gpus_per_host": gpus, "spares": spares, "model": protocol,
                 "switch_options": switch_options or {}},
        "reconfiguration_delay_ms": delay_ms,
    })


@asynccontextmanager
async def emulated_rails(
    section: FabricSection, devices: EmulatedFabricDevices, protocol: str = "tl1"
) -> AsyncIterator[FabricSection]:
    """Serve the switches of a generated rail fabric over ``protocol`` ("tl1", "restconf";
    "emulated" serves nothing: the in-process driver) and yield the section that points the
    controller's drivers at them."""
    if protocol == "emulated":
        yield section
        return
    fabric = build_fabric(section)
    async with serve_fabric(fabric, devices, protocol) as options:
        assert section.rail is not None
        rail = section.rail.model_copy(update={"model": protocol, "switch_options": options})
        yield section.model_copy(update={"rail": rail})


@asynccontextmanager
async def serve_fabric(
    fabric: Fabric,
    devices: EmulatedFabricDevices,
    protocol: str = "tl1",
) -> AsyncIterator[dict[str, dict[str, OptionValue]]]:
    """Start one ``protocol`` ("tl1" or "restconf") server per switch of ``fabric``; yield the
    driver options per switch id (``host``, ``port``, credentials) to put in the controller's
    config with ``model: <protocol>``. Stops every server on exit. Raises ``ValueError`` for an
    unknown protocol."""
    if protocol not in ("tl1", "restconf"):
        raise ValueError(f"protocol: expected 'tl1' or 'restconf', got {protocol!r}")
    options: dict[str, dict[str, OptionValue]] = {}
    async with contextlib.AsyncExitStack() as stack:
        for sid, sw in fabric.switches.items():
            device = devices.ensure(sid, sw.capabilities)
            if protocol == "tl1":
                tl1 = Tl1Server(device, users={EMULATOR_USER: EMULATOR_PASSWORD})
                await stack.enter_async_context(tl1)
                port = tl1.port
            else:
                rc = RestconfServer(device, username=EMULATOR_USER, password=EMULATOR_PASSWORD)
                await stack.enter_async_context(rc)
                port = rc.port
            options[sid] = {"host": "127.0.0.1", "port": port, "username": EMULATOR_USER,
                            "password": EMULATOR_PASSWORD}
        yield options
