"""The options model of the SiPh (MZI mesh) driver: ``switches[<id>].options`` of a
``model: siph`` switch, including the heater calibration they select
(``lightrail.drivers.siph.calibration``)."""

from __future__ import annotations

from pathlib import Path
from typing import Self

from pydantic import Field, model_validator

from lightrail.drivers.options import DriverOptions, option_error
from lightrail.drivers.siph.calibration import (
    DEFAULT_TOLERANCE_V,
    DEFAULT_V_BAR,
    DEFAULT_V_CROSS,
    CalibrationTable,
    load_calibration_file,
)

DEFAULT_TIMEOUT_S = 2.0
"""Deadline of one request/reply exchange (seconds)."""


class SiphOptions(DriverOptions):
    """Driver settings from ``switches[<id>].options``; unknown keys are rejected
    (``DriverOptions``).

    ``port`` (required) and ``host`` (default 127.0.0.1): the DAC's TCP address;
    ``timeout_s``: deadline of one exchange; the calibration: ``calibration_file`` (JSON,
    ``CalibrationTable.from_json``) or ``v_bar``/``v_cross``/``tolerance_v`` defaults with
    inline ``calibration`` overrides (``CalibrationTable.parse``), not both;
    ``reroute_outside_ports`` and ``darken_unused`` (module docstring).
    """

    host: str = Field(default="127.0.0.1", min_length=1)
    port: int = Field(ge=1, le=65535)
    timeout_s: float = Field(default=DEFAULT_TIMEOUT_S, gt=0)
    v_bar: float = Field(default=DEFAULT_V_BAR, ge=0)
    v_cross: float = Field(default=DEFAULT_V_CROSS, ge=0)
    tolerance_v: float = Field(default=DEFAULT_TOLERANCE_V, gt=0)
    calibration: str = ""
    calibration_file: str | None = Field(default=None, min_length=1)
    reroute_outside_ports: bool = True
    darken_unused: bool = True

    @model_validator(mode="after")
    def _file_or_inline_calibration(self) -> Self:
        if self.calibration_file is not None:
            for other in ("calibration", "v_bar", "v_cross", "tolerance_v"):
                if other in self.model_fields_set:
                    raise option_error(other, "give it in calibration_file, not both")
        return self

    def calibration_table(self, size: int) -> CalibrationTable:
        """The calibration of a ``size``-port mesh these options give. Raises ``ValueError``
        naming the field, ``OSError`` when ``calibration_file`` cannot be read."""
        if self.calibration_file is not None:
            return load_calibration_file(size, Path(self.calibration_file))
        return CalibrationTable.parse(
            size, self.calibration, v_bar=self.v_bar, v_cross=self.v_cross,
            tolerance_v=self.tolerance_v,
        )
