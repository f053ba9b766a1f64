"""Heater calibration of an MZI mesh: per-element bar/cross set-points (volts) and the
read-back tolerance, from defaults, the inline ``calibration`` option or a JSON
``calibration_file`` (used by ``lightrail.drivers.siph.driver`` and the emulated mesh
``lightrail.emulator.servers.mzi``).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from lightrail.drivers.siph import benes
from lightrail.drivers.siph.benes import BenesNetwork, ElementState

DEFAULT_V_BAR = 1.5
"""Default heater voltage (V) that puts an element in the bar state (per-element values come
from the calibration table; real meshes need one per element because of fabrication phase
errors)."""
DEFAULT_V_CROSS = 2.5
"""Default heater voltage (V) for the cross state."""
DEFAULT_TOLERANCE_V = 0.05
"""A read-back within this many volts of a calibrated set-point counts as that state."""


@dataclass(frozen=True, slots=True)
class ElementCalibration:
    """Heater set-points of one MZI element in volts: ``v_bar`` gives the bar state,
    ``v_cross`` the cross state (measured per element in the lab). ``ValueError`` naming the
    field when one is negative or not finite."""

    v_bar: float
    v_cross: float

    def __post_init__(self) -> None:
        for name, v in (("v_bar", self.v_bar), ("v_cross", self.v_cross)):
            if not math.isfinite(v) or v < 0:
                raise ValueError(f"{name}: must be a finite voltage >= 0, got {v!r}")

    def volts(self, state: ElementState) -> float:
        """The set-point for ``state`` (V)."""
        return self.v_bar if state is ElementState.BAR else self.v_cross

    def state(self, volts: float, tolerance_v: float) -> ElementState | None:
        """The state a heater at ``volts`` gives: BAR or CROSS within ``tolerance_v`` of its
        set-point, None (undefined, lossy) otherwise."""
        if abs(volts - self.v_bar) <= tolerance_v:
            return ElementState.BAR
        if abs(volts - self.v_cross) <= tolerance_v:
            return ElementState.CROSS
        return None

    def off_volts(self, tolerance_v: float) -> float:
        """A set-point that is neither state: 0 V when that is far enough from both, else the
        midpoint of the two."""
        if self.state(0.0, 2 * tolerance_v) is None:
            return 0.0
        return (self.v_bar + self.v_cross) / 2


@dataclass(frozen=True, slots=True)
class CalibrationTable:
    """Per-element calibration of a ``size``-port mesh, ``elements`` indexed by heater channel
    (``BenesNetwork.channel``), and the read-back ``tolerance_v`` (V).

    Raises ``ValueError`` naming the field: wrong element count, tolerance not > 0, or an element
    whose bar and cross set-points are within 2 * ``tolerance_v`` of each other (read-back could
    not tell them apart).
    """

    size: int
    elements: tuple[ElementCalibration, ...]
    tolerance_v: float = DEFAULT_TOLERANCE_V

    def __post_init__(self) -> None:
        net = BenesNetwork(self.size)
        if len(self.elements) != net.element_count:
            raise ValueError(
                f"calibration: expected {net.element_count} elements for {self.size} ports, "
                f"got {len(self.elements)}"
            )
        if not math.isfinite(self.tolerance_v) or self.tolerance_v <= 0:
            raise ValueError(f"tolerance_v: must be > 0, got {self.tolerance_v!r}")
        for channel, cal in enumerate(self.elements):
            if abs(cal.v_bar - cal.v_cross) <= 2 * self.tolerance_v:
                raise ValueError(
                    f"calibration[{net.element(channel)}]: v_bar {cal.v_bar} and v_cross "
                    f"{cal.v_cross} are within 2 * tolerance_v ({self.tolerance_v}) of each other"
                )

    @classmethod
    def uniform(
        cls,
        size: int,
        v_bar: float = DEFAULT_V_BAR,
        v_cross: float = DEFAULT_V_CROSS,
        tolerance_v: float = DEFAULT_TOLERANCE_V,
    ) -> CalibrationTable:
        """Every element with the same set-points."""
        net = BenesNetwork(size)
        cal = ElementCalibration(v_bar, v_cross)
        return cls(size, (cal,) * net.element_count, tolerance_v)

    def with_element(
        self, element: benes.Element, calibration: ElementCalibration
    ) -> CalibrationTable:
        """A copy with ``element`` recalibrated."""
        channel = BenesNetwork(self.size).channel(element)
        elements = list(self.elements)
        elements[channel] = calibration
        return CalibrationTable(self.size, tuple(elements), self.tolerance_v)

    def setpoints(self, states: Sequence[ElementState | None]) -> tuple[float, ...]:
        """Heater set-points (V, by channel) for element ``states``; None sets the element
        off (``ElementCalibration.off_volts``)."""
        if len(states) != len(self.elements):
            raise ValueError(
                f"states: expected {len(self.elements)} element states, got {len(states)}"
            )
        return tuple(
            cal.off_volts(self.tolerance_v) if s is None else cal.volts(s)
            for cal, s in zip(self.elements, states, strict=True)
        )

    def states(self, volts: Sequence[float]) -> tuple[ElementState | None, ...]:
        """Element states (by channel) of heater read-backs ``volts`` (V; extra spare
        channels after the last element are ignored). ``ValueError`` when too few."""
        if len(volts) < len(self.elements):
            raise ValueError(
                f"volts: expected at least {len(self.elements)} channels, got {len(volts)}"
            )
        return tuple(
            cal.state(v, self.tolerance_v) for cal, v in zip(self.elements, volts, strict=False)
        )

    @classmethod
    def parse(
        cls,
        size: int,
        text: str,
        *,
        v_bar: float = DEFAULT_V_BAR,
        v_cross: float = DEFAULT_V_CROSS,
        tolerance_v: float = DEFAULT_TOLERANCE_V,
    ) -> CalibrationTable:
        """The table from the inline config form: ``v_bar``/``v_cross`` for every element,
        overridden by entries ``<stage>.<row>:<v_bar>:<v_cross>`` separated by commas,
        semicolons or whitespace (e.g. ``"0.1:1.52:2.61, 2.3:1.48:2.55"``). Raises
        ``ValueError`` naming the offending ``calibration`` entry."""
        table = cls.uniform(size, v_bar, v_cross, tolerance_v)
        net = BenesNetwork(size)
        elements = list(table.elements)
        for entry in re.split(r"[,;\s]+", text.strip()):
            if not entry:
                continue
            m = re.fullmatch(r"(\d+)\.(\d+):([^:]+):([^:]+)", entry)
            if m is None:
                raise ValueError(
                    f"calibration: entry {entry!r} is not <stage>.<row>:<v_bar>:<v_cross>"
                )
            element = benes.Element(int(m.group(1)), int(m.group(2)))
            try:
                channel = net.channel(element)
                cal = ElementCalibration(float(m.group(3)), float(m.group(4)))
            except ValueError as e:
                raise ValueError(f"calibration: entry {entry!r}: {e}") from None
            elements[channel] = cal
        return cls(size, tuple(elements), tolerance_v)

    @classmethod
    def from_json(cls, size: int, data: object) -> CalibrationTable:
        """The table from a JSON document ``{"v_bar": V, "v_cross": V, "tolerance_v": V,
        "elements": [{"stage": s, "row": r, "v_bar": V, "v_cross": V}, ...]}`` (every key
        optional). Raises ``ValueError`` naming the offending field."""
        if not isinstance(data, Mapping):
            raise ValueError("calibration_file: top level must be an object")
        unknown = set(data) - {"v_bar", "v_cross", "tolerance_v", "elements"}
        if unknown:
            raise ValueError(f"calibration_file: unknown keys {sorted(unknown)}")

        def num(obj: Mapping[str, object], key: str, default: float, where: str) -> float:
            v = obj.get(key, default)
            if isinstance(v, bool) or not isinstance(v, int | float):
                raise ValueError(f"{where}.{key}: must be a number, got {v!r}")
            return float(v)

        table = cls.uniform(
            size,
            num(data, "v_bar", DEFAULT_V_BAR, "calibration_file"),
            num(data, "v_cross", DEFAULT_V_CROSS, "calibration_file"),
            num(data, "tolerance_v", DEFAULT_TOLERANCE_V, "calibration_file"),
        )
        entries = data.get("elements", [])
        if not isinstance(entries, list):
            raise ValueError("calibration_file.elements: must be a list")
        net = BenesNetwork(size)
        elements = list(table.elements)
        for n, entry in enumerate(entries):
            where = f"calibration_file.elements[{n}]"
            if not isinstance(entry, Mapping):
                raise ValueError(f"{where}: must be an object")
            stage, row = entry.get("stage"), entry.get("row")
            if not isinstance(stage, int) or not isinstance(row, int):
                raise ValueError(f"{where}: stage and row must be integers")
            try:
                channel = net.channel(benes.Element(stage, row))
                cal = ElementCalibration(
                    num(entry, "v_bar", DEFAULT_V_BAR, where),
                    num(entry, "v_cross", DEFAULT_V_CROSS, where),
                )
            except ValueError as e:
                raise ValueError(f"{where}: {e}") from None
            elements[channel] = cal
        return cls(size, tuple(elements), table.tolerance_v)


def load_calibration_file(size: int, path: Path) -> CalibrationTable:
    """The table of a ``size``-port mesh in the JSON file ``path`` (the switch option
    ``calibration_file``; format in ``CalibrationTable.from_json``). Raises ``ValueError``
    naming the file or the offending field, ``OSError`` when the file cannot be read."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"calibration_file: {path}: {e}") from None
    return CalibrationTable.from_json(size, data)
