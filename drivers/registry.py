"""Driver selection by the config's ``model:`` of a switch (DESIGN.md, "Drivers").

``FACTORIES`` maps each model name to a factory; ``create_driver`` picks one. A new device
family adds its module under ``drivers/`` and one entry here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from lightrail.controller.domain.fabric import Switch
from lightrail.drivers.base import Driver
from lightrail.emulator import driver as emulated
from lightrail.emulator.ocs import EmulatedFabricDevices


class DriverConfigError(ValueError):
    """A switch's ``model`` has no driver, or the driver lacks what it needs; the message names
    the switch id and the model."""

    def __init__(self, switch_id: str, model: str, message: str) -> None:
        super().__init__(f"switches[{switch_id}].model {model!r}: {message}")
        self.switch_id = switch_id
        self.model = model


@dataclass(frozen=True, slots=True)
class DriverContext:
    """What factories may need besides the switch itself.

    ``emulated_devices``: the emulated devices ``model: emulated`` drivers attach to (kept by
    the caller so device state outlives a controller instance).
    """

    emulated_devices: EmulatedFabricDevices | None = None


DriverFactory = Callable[[Switch, DriverContext], Driver]
"""Builds an unopened driver for one switch."""


def _emulated(switch: Switch, context: DriverContext) -> Driver:
    if context.emulated_devices is None:
        raise DriverConfigError(
            switch.switch_id, switch.model, "needs DriverContext.emulated_devices"
        )
    return emulated.make_driver(switch, context.emulated_devices)


def _siph(switch: Switch, context: DriverContext) -> Driver:
    from lightrail.drivers.siph import driver as siph

    return siph.make_driver(switch, context)


def _tl1(switch: Switch, context: DriverContext) -> Driver:
    from lightrail.drivers.tl1 import driver as tl1

    return tl1.make_driver(switch, context)


def _restconf(switch: Switch, context: DriverContext) -> Driver:
    from lightrail.drivers.restconf import driver as restconf

    return restconf.make_driver(switch, context)


FACTORIES: Mapping[str, DriverFactory] = MappingProxyType({
    "emulated": _emulated,
    "siph": _siph,
    "tl1": _tl1,
    "restconf": _restconf,
})
"""Driver factory by ``model`` name."""


def create_driver(switch: Switch, *, context: DriverContext) -> Driver:
    """An unopened driver for ``switch`` chosen by ``switch.model``.

    Raises ``DriverConfigError`` naming the switch id and the model when the model is unknown
    or the context lacks what its driver needs.
    """
    factory = FACTORIES.get(switch.model)
    if factory is None:
        known = ", ".join(sorted(FACTORIES))
        raise DriverConfigError(
            switch.switch_id, switch.model, f"unknown driver model (known: {known})"
        )
    return factory(switch, context)
