"""In-process driver for ``lightrail.emulator.ocs.EmulatedOcs`` (config ``model: emulated``).

Used by unit tests and the in-process demo; the wire-protocol drivers (TL1, RESTCONF, MZI) talk
to the socket emulators instead. Port ids are canonical on both sides, so there is no vendor
naming to translate.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable

import structlog

from lightrail.drivers.base import (
    ApplyMode,
    ApplyResult,
    CommandGate,
    CrossConnect,
    DeviceAlarm,
    DeviceInfo,
    DeviceUnreachable,
    Driver,
    DriverError,
    PartialApply,
    PortAdmin,
    PortStatus,
    SwitchSpec,
    check_apply_request,
    check_gate,
    check_read_back,
    minimal_diff,
)
from lightrail.drivers.options import DriverContext, DriverFactory, DriverOptions
from lightrail.emulator.ocs import AlarmSubscription, EmulatedFabricDevices, EmulatedOcs

_log = structlog.get_logger(__name__)


class EmulatedDriver:
    """A ``lightrail.drivers.base.Driver`` for the emulated device ``switch_id`` in ``devices``.

    ``open`` looks the device up (``DeviceUnreachable`` when there is none or it does not
    answer); every other call before ``open`` or after ``close`` raises ``DeviceUnreachable``.
    ``command_gate`` is asked before every device call, as by the socket drivers
    (``NotLeader``).
    """

    def __init__(self, switch_id: str, devices: EmulatedFabricDevices,
                 command_gate: CommandGate | None = None) -> None:
        self._switch_id = switch_id
        self._gate = command_gate
        self._devices = devices
        self._device: EmulatedOcs | None = None
        self._subscriptions: list[AlarmSubscription] = []
        self._log = _log.bind(switch=switch_id)

    @property
    def switch_id(self) -> str:
        """The switch this driver controls."""
        return self._switch_id

    async def open(self) -> None:
        """Connect. Raises ``DeviceUnreachable``."""
        device = self._devices.get(self._switch_id)
        if device is None:
            raise DeviceUnreachable(self._switch_id, "no emulated device with this id")
        check_gate(self._gate, self._switch_id)
        await device.info()
        self._device = device
        self._log.debug("opened")

    async def close(self) -> None:
        """Disconnect and end every ``events()`` iterator; idempotent."""
        subscriptions, self._subscriptions = self._subscriptions, []
        for sub in subscriptions:
            await sub.aclose()
        self._device = None

    def _dev(self) -> EmulatedOcs:
        if self._device is None:
            raise DeviceUnreachable(self._switch_id, "driver is not open")
        check_gate(self._gate, self._switch_id)
        return self._device

    async def info(self) -> DeviceInfo:
        """Identity and capabilities. Raises ``DeviceUnreachable``."""
        return await self._dev().info()

    async def get_cross_connects(self) -> frozenset[CrossConnect]:
        """Read back every cross-connect on the switch. Raises ``DeviceUnreachable``."""
        return await self._dev().get_cross_connects()

    async def apply(
        self,
        target: frozenset[CrossConnect],
        ports: frozenset[int],
        mode: ApplyMode = ApplyMode.MINIMAL,
        *,
        current: frozenset[CrossConnect] | None = None,
    ) -> ApplyResult:
        """Make the cross-connects on ``ports`` equal ``target`` in one bulk command (breaks,
        then makes, then one settle); cross-connects on other ports are left alone.

        The changes are ``minimal_diff`` of ``current`` (the caller's confirmed state; default:
        the device's state, taken without a device command) and ``target``. Nothing to do
        returns an empty ``ApplyResult`` without a device command. When the device has
        ``max_batch``, breaks then makes go out in chunks of at most that size, each with its
        own settle. Then, where the device reads back (``SwitchCapabilities.readback``), the
        ports it changed are read back (one command) and checked (``check_read_back``): the
        result is ``verified``; else it is what the device acknowledged.

        Raises ``InvalidPort`` (a port the switch lacks, a target cross-connect using a port
        outside ``ports``, a cross-connect on ``ports`` that also uses a port outside them: it
        cannot be broken without touching that port), ``VerificationMismatch`` (the read-back
        differs: e.g. a silent port), ``CrossConnectConflict`` (``target`` is
        not a partial permutation, or the device rejects the batch), ``PartialApply`` (part of
        it took effect; ``result`` says what), ``DeviceUnreachable``, ``HardwareFault``.
        """
        device = self._dev()
        sid = self._switch_id
        caps = device.capabilities
        check_apply_request(sid, caps, target, ports)
        state = device.cross_connects if current is None else current
        diff = minimal_diff(sid, state, target, ports, mode)
        if diff.empty:
            return ApplyResult()
        breaks, makes = diff.breaks, diff.makes
        limit = caps.max_batch
        if limit is None or len(breaks) + len(makes) <= limit:
            result = await device.apply_bulk(breaks, makes)
        else:
            result = await self._apply_chunked(device, list(breaks), list(makes), limit)
        if not caps.readback:
            return result  # what the device acknowledged; it cannot be read back
        # Confirm like a real device: read back the ports it changed (not the whole switch).
        changed = diff.changed_ports()
        check_read_back(sid, target, changed, await device.get_cross_connects_on(changed))
        return ApplyResult(result.removed, result.added, result.failed, verified=True)

    async def _apply_chunked(
        self,
        device: EmulatedOcs,
        breaks: list[CrossConnect],
        makes: list[CrossConnect],
        limit: int,
    ) -> ApplyResult:
        chunks: list[tuple[list[CrossConnect], list[CrossConnect]]] = [
            (breaks[i : i + limit], []) for i in range(0, len(breaks), limit)
        ]
        chunks += [([], makes[i : i + limit]) for i in range(0, len(makes), limit)]
        removed: list[CrossConnect] = []
        added: list[CrossConnect] = []
        failed: dict[CrossConnect, str] = {}
        for n, (chunk_breaks, chunk_makes) in enumerate(chunks):
            try:
                result = await device.apply_bulk(chunk_breaks, chunk_makes)
            except PartialApply as e:
                result = e.result
            except DriverError as e:
                if not removed and not added:
                    raise
                result = ApplyResult(failed=dict.fromkeys(chunk_breaks + chunk_makes, str(e)))
            removed += result.removed
            added += result.added
            failed.update(result.failed)
            if failed:
                for later_breaks, later_makes in chunks[n + 1 :]:
                    for xc in later_breaks + later_makes:
                        failed[xc] = "not attempted: an earlier chunk failed"
                raise PartialApply(
                    self._switch_id, ApplyResult(tuple(removed), tuple(added), failed)
                )
        return ApplyResult(tuple(removed), tuple(added))

    async def set_port_admin(self, port: int, admin: PortAdmin) -> None:
        """Enable or disable ``port``. Raises ``InvalidPort``, ``DeviceUnreachable``."""
        await self._dev().set_port_admin(port, admin)

    async def get_port_status(self, ports: Iterable[int] | None = None) -> list[PortStatus]:
        """Status of ``ports`` (default: all). Raises ``InvalidPort``, ``DeviceUnreachable``."""
        return await self._dev().get_port_status(ports)

    async def get_power(self, ports: Iterable[int] | None = None) -> dict[int, float]:
        """Optical power per port in dBm. Raises ``InvalidPort``, ``DeviceUnreachable``."""
        return await self._dev().get_power(ports)

    def events(self) -> AsyncIterator[DeviceAlarm]:
        """Alarms from now on, until ``close``. Raises ``DeviceUnreachable`` when not open."""
        sub = self._dev().alarms()
        self._subscriptions.append(sub)
        return sub


class EmulatedOptions(DriverOptions):
    """Options of ``model: emulated``: none (the device is in-process, its capabilities come
    from config); any key is rejected as unknown (``DriverOptions``)."""


def make_driver(spec: SwitchSpec, devices: EmulatedFabricDevices,
                command_gate: CommandGate | None = None) -> Driver:
    """The driver for an emulated switch (config ``model: emulated``): the device is taken
    from ``devices`` or created there, empty, with ``spec.capabilities``. Raises
    ``lightrail.drivers.options.DriverConfigError`` for any option (``EmulatedOptions``) and
    ``ValueError`` when the registered device has other capabilities."""
    EmulatedOptions.from_spec(spec)
    devices.ensure(spec.switch_id, spec.capabilities)
    return EmulatedDriver(spec.switch_id, devices, command_gate)


def emulated_factory(devices: EmulatedFabricDevices) -> DriverFactory:
    """The factory a composition root registers for ``model: emulated``
    (``lightrail.drivers.registry.DriverRegistry.register``): drivers attached to ``devices``,
    which the caller keeps so that device state outlives a controller instance."""

    def factory(spec: SwitchSpec, context: DriverContext) -> Driver:
        return make_driver(spec, devices, context.command_gate)  # no environment read

    return factory
