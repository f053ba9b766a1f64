"""Serve a whole fabric's switches as emulated devices on 127.0.0.1 sockets, each speaking a
real management protocol (TL1 in the Polatis dialect, or RESTCONF ``optical-switch``), so the
controller drives them through the same drivers and code paths as hardware.

Each server wraps the ``EmulatedOcs`` of its switch from an ``EmulatedFabricDevices`` registry:
device state, timing, faults and the change log stay inspectable in-process (tests check the
safety invariant on them), and outlive a controller restart.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass

from lightrail.controller.config import FabricSection, SwitchConfig, build_fabric
from lightrail.controller.domain.fabric import BUILTIN_RAIL_SHAPES, Fabric, Switch, rail_shape
from lightrail.drivers.siph.options import SiphOptions
from lightrail.emulator.ocs import EmulatedFabricDevices
from lightrail.emulator.servers.mzi import MziMeshServer
from lightrail.emulator.servers.restconf import RestconfServer
from lightrail.emulator.servers.tl1 import ReceivedCommand, Tl1Server

EMULATOR_USER = "admin"
EMULATOR_PASSWORD = "root"  # the emulated devices' built-in account, not a real secret

OptionValue = str | int | float | bool

SERVED_MODELS = ("tl1", "restconf", "siph")
"""Driver models a served switch speaks: TL1 (Polatis dialect), RESTCONF (``optical-switch``),
the SiPh MZI mesh's Qontrol-style DAC protocol."""


RAIL_BUILTINS = {name: (shape.hosts, shape.gpus_per_host)
                 for name, shape in BUILTIN_RAIL_SHAPES.items()}
"""Built-in fabric names as (hosts, GPUs per host) of a rail fabric."""


def rail_section(
    name: str,
    *,
    spares: int = 0,
    delay_ms: float,
    protocol: str = "emulated",
    switch_options: dict[str, dict[str, OptionValue]] | None = None,
) -> FabricSection:
    """The config section of rail fabric ``name`` (a built-in name or ``rail:HOSTSxGPUS``:
    ``lightrail.controller.domain.fabric.rail_shape``; plus ``spares`` hosts), its switches
    driven by ``protocol`` with ``switch_options``. Raises ``FabricError`` naming an unknown
    or malformed ``name``."""
    shape = rail_shape(name)
    return FabricSection.model_validate({
        "name": shape.name + (f"+{spares}spare" if spares else ""),
        "rail": {"hosts": shape.hosts, "gpus_per_host": shape.gpus_per_host, "spares": spares,
                 "model": protocol, "switch_options": switch_options or {}},
        "reconfiguration_delay_ms": delay_ms,
    })


@dataclass(frozen=True, slots=True)
class ServedSwitch:
    """One switch served on a socket: the driver ``model`` the controller must use, the
    listening ``host``/``port``, and the complete driver ``options`` that reach it (address,
    credentials or the names of the environment variables holding them, calibration);
    ``commands`` reads the command log of a TL1 front end (None for other protocols)."""

    switch_id: str
    model: str
    host: str
    port: int
    options: Mapping[str, OptionValue]
    commands: Callable[[], list[ReceivedCommand]] | None = None


def served_model(switch: Switch, protocol: str) -> str:
    """The model ``switch`` is served with: its own when it is one of ``SERVED_MODELS``,
    ``protocol`` for ``model: emulated``. Raises ``ValueError`` naming the switch and model for
    any other model (no emulator speaks it)."""
    if switch.model in SERVED_MODELS:
        return switch.model
    if switch.model == "emulated":
        return protocol
    raise ValueError(f"switch {switch.switch_id!r}: model {switch.model!r} cannot be emulated "
                     f"(served models: {', '.join(SERVED_MODELS)}, or emulated)")


def _account(options: Mapping[str, OptionValue],
             environ: Mapping[str, str]) -> tuple[str, str, dict[str, OptionValue]]:
    """The emulated device's login and the credential options the controller uses: the
    switch's own ``username_env``/``password_env`` when both variables are set (so a config
    that reads real credentials from the environment works unchanged against the emulator),
    else the emulator's built-in account, inline."""
    user_env, pw_env = options.get("username_env"), options.get("password_env")
    if isinstance(user_env, str) and isinstance(pw_env, str) and (
            user_env in environ and pw_env in environ):
        return environ[user_env], environ[pw_env], {"username_env": user_env,
                                                    "password_env": pw_env}
    return EMULATOR_USER, EMULATOR_PASSWORD, {"username": EMULATOR_USER,
                                              "password": EMULATOR_PASSWORD}


@asynccontextmanager
async def serve_switches(
    fabric: Fabric,
    devices: EmulatedFabricDevices,
    *,
    protocol: str = "tl1",
    host: str = "127.0.0.1",
    environ: Mapping[str, str] | None = None,
    accounts: Mapping[str, str] | None = None,
) -> AsyncIterator[dict[str, ServedSwitch]]:
    """Serve every switch of ``fabric`` on ``host`` (one OS-chosen TCP port each) in the
    protocol of its model (``served_model``; ``model: emulated`` switches speak ``protocol``),
    each over the ``EmulatedOcs`` of ``devices`` with its capabilities (ports, settle time).
    Yields the ``ServedSwitch`` per switch id; stops every server on exit.

    A SiPh mesh is emulated with the calibration its options select (the device's true
    calibration is the one the driver is configured with). TL1 and RESTCONF devices accept the
    account of ``_account`` (``environ``: default ``os.environ``); TL1 devices also accept the
    logins of ``accounts`` (user -> password: e.g. one per controller replica, so the command
    log says which replica sent what). Raises ``ValueError`` naming the switch for a model no
    emulator speaks, ``protocol`` not in tl1/restconf, or SiPh
    options that do not validate; ``OSError`` when a port cannot be bound.
    """
    if protocol not in ("tl1", "restconf"):
        raise ValueError(f"protocol: expected 'tl1' or 'restconf', got {protocol!r}")
    env = os.environ if environ is None else environ
    models = {sid: served_model(sw, protocol) for sid, sw in fabric.switches.items()}
    served: dict[str, ServedSwitch] = {}
    async with contextlib.AsyncExitStack() as stack:
        for sid, sw in fabric.switches.items():
            model = models[sid]
            device = devices.ensure(sid, sw.capabilities)
            options: dict[str, OptionValue] = {"host": host}
            commands: Callable[[], list[ReceivedCommand]] | None = None
            if model == "siph":
                kept = {k: v for k, v in sw.options.items() if k not in ("host", "port")}
                try:
                    siph = SiphOptions.model_validate({**kept, "host": host, "port": 1})
                    calibration = siph.calibration_table(sw.capabilities.port_count)
                except (ValueError, OSError) as e:
                    raise ValueError(f"switch {sid!r}: options: {e}") from e
                mzi = MziMeshServer(sid, sw.capabilities.port_count, calibration=calibration,
                                    host=host, ocs=device)
                await stack.enter_async_context(mzi)
                port = mzi.port
                options.update(kept)
            else:
                user, password, credentials = _account(sw.options, env)
                if model == "tl1":
                    tl1 = Tl1Server(device, host=host, users={**(accounts or {}), user: password})
                    await stack.enter_async_context(tl1)
                    port = tl1.port
                    commands = _command_log(tl1)
                else:
                    rc = RestconfServer(device, host=host, username=user, password=password)
                    await stack.enter_async_context(rc)
                    port = rc.port
                options.update(credentials)
            options["port"] = port
            served[sid] = ServedSwitch(sid, model, host, port, options, commands)
        yield served


def _command_log(server: Tl1Server) -> Callable[[], list[ReceivedCommand]]:
    return lambda: server.commands


def served_section(section: FabricSection, served: Mapping[str, ServedSwitch]) -> FabricSection:
    """``section`` with every switch pointed at its served device: each switch's ``model`` and
    ``options`` replaced by those of ``served``, hosts and wiring unchanged. A ``builtin``
    fabric becomes the equivalent ``rail`` section (a built-in name carries no options).
    Raises ``KeyError`` for a switch ``served`` lacks."""
    if section.builtin is not None or (section.rail is None and not section.switches):
        name = section.builtin or "demo-4x2"
        section = rail_section(name, delay_ms=section.reconfiguration_delay_ms)
        section = section.model_copy(update={"name": name})
    if section.rail is not None:
        fabric = build_fabric(section)
        rail = section.rail.model_copy(update={
            "models": {sid: served[sid].model for sid in fabric.switches},
            "switch_options": {sid: dict(served[sid].options) for sid in fabric.switches},
        })
        return section.model_copy(update={"rail": rail})
    switches: list[SwitchConfig] = [
        s.model_copy(update={"model": served[s.id].model, "options": dict(served[s.id].options)})
        for s in section.switches]
    return section.model_copy(update={"switches": switches})
