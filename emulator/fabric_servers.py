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

from controller.fabric import Fabric
from emulator.ocs import EmulatedFabricDevices
from emulator.restconf_server import RestconfServer
from emulator.tl1_server import Tl1Server

EMULATOR_USER = "admin"
EMULATOR_PASSWORD = "root"  # the emulated devices' built-in account, not a real secret

OptionValue = str | int | float | bool


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
