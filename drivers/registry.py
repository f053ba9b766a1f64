"""Driver selection by the config's ``model:`` of a switch (DESIGN.md, "Drivers").

A ``DriverRegistry`` maps model names to factories. It starts with the built-in device families
(``tl1``, ``restconf``, ``siph``; each module is imported when its first driver is built);
whoever composes the process adds more with ``register`` (the CLI registers the emulator's
``emulated`` model: production code never imports the emulator). A new device family adds its
package under ``drivers/`` and one entry in ``BUILTIN_MODELS``.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from lightrail.drivers.base import Driver, SwitchSpec
from lightrail.drivers.options import DriverConfigError, DriverContext, DriverFactory


def _siph(spec: SwitchSpec, context: DriverContext) -> Driver:
    from lightrail.drivers.siph import driver as siph

    return siph.make_driver(spec, context)


def _tl1(spec: SwitchSpec, context: DriverContext) -> Driver:
    from lightrail.drivers.tl1 import driver as tl1

    return tl1.make_driver(spec, context)


def _restconf(spec: SwitchSpec, context: DriverContext) -> Driver:
    from lightrail.drivers.restconf import driver as restconf

    return restconf.make_driver(spec, context)


BUILTIN_MODELS: Mapping[str, DriverFactory] = MappingProxyType({
    "siph": _siph,
    "tl1": _tl1,
    "restconf": _restconf,
})
"""The device families every registry knows, by ``model`` name."""


class DriverRegistry:
    """Driver factories by ``model`` name: the built-in families plus those ``register`` adds.

    One registry per composed process (or per test); it holds no device state itself (a
    registered factory may, e.g. the emulated devices it attaches drivers to).
    """

    def __init__(self) -> None:
        self._factories: dict[str, DriverFactory] = dict(BUILTIN_MODELS)

    @property
    def models(self) -> frozenset[str]:
        """Every model name a driver can be built for."""
        return frozenset(self._factories)

    def register(self, model: str, factory: DriverFactory) -> None:
        """Build drivers of ``model`` with ``factory`` from now on. Raises ``ValueError`` when
        ``model`` is empty or already registered (a built-in family is never replaced)."""
        if not model:
            raise ValueError("model: must be a non-empty name")
        if model in self._factories:
            raise ValueError(f"model {model!r} is already registered")
        self._factories[model] = factory

    def create(self, spec: SwitchSpec, context: DriverContext | None = None) -> Driver:
        """An unopened driver for ``spec`` chosen by ``spec.model`` (nothing is sent to the
        device: ``lightrail check-config`` uses this to validate a config).

        Raises ``DriverConfigError`` naming the switch id and the model when the model is
        unknown, and naming the option when the driver's options model rejects
        ``spec.options`` (``lightrail.drivers.options.DriverOptions.from_spec``).
        """
        factory = self._factories.get(spec.model)
        if factory is None:
            known = ", ".join(sorted(self._factories))
            raise DriverConfigError(
                spec.switch_id, spec.model, f"unknown driver model (known: {known})"
            )
        return factory(spec, DriverContext() if context is None else context)
