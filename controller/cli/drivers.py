"""The driver registry of a composed process: the built-in device families plus the emulator's
``model: emulated`` (in-process switches), registered here, by the composition root, so that
the daemon (``lightrail.controller.app``) and the drivers never import the emulator."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lightrail.drivers.registry import DriverRegistry

if TYPE_CHECKING:
    from lightrail.emulator.ocs import EmulatedFabricDevices


def driver_registry(devices: EmulatedFabricDevices | None = None) -> DriverRegistry:
    """A ``DriverRegistry`` with ``model: emulated`` drivers attached to ``devices`` (a fresh,
    empty ``EmulatedFabricDevices`` when None; the caller keeps its own to let device state
    outlive a controller instance)."""
    from lightrail.emulator.driver import emulated_factory
    from lightrail.emulator.ocs import EmulatedFabricDevices

    registry = DriverRegistry()
    if devices is None:  # not ``devices or ...``: an empty EmulatedFabricDevices is falsy
        devices = EmulatedFabricDevices()
    registry.register("emulated", emulated_factory(devices))
    return registry
