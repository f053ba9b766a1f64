"""The options model of the TL1 driver: ``switches[<id>].options`` of a ``model: tl1`` switch
(meaning of each option in ``lightrail.drivers.tl1.driver``)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field, SecretStr, field_validator

from lightrail.drivers.options import DriverOptions


class Tl1Options(DriverOptions):
    """Driver settings from ``switches[<id>].options`` (see the module docstring); unknown keys
    are rejected (``DriverOptions``). Exactly one of ``username``/``username_env`` and one of
    ``password``/``password_env`` is given; the ``*_env`` variables are read at each login."""

    credentials: ClassVar[tuple[str, ...]] = ("username", "password")

    host: str = Field(min_length=1)
    port: int = Field(gt=0, lt=65536)
    username: str | None = Field(default=None, min_length=1)
    username_env: str | None = Field(default=None, min_length=1)
    password: SecretStr | None = Field(default=None, min_length=1)
    password_env: str | None = Field(default=None, min_length=1)
    timeout_s: float = Field(default=5.0, gt=0)
    connect_timeout_s: float = Field(default=3.0, gt=0)
    reconnect_interval_s: float = Field(default=1.0, gt=0)
    tid: str = ""
    verify: bool = True
    los_threshold_dbm: float = -30.0

    @field_validator("port", mode="before")
    @classmethod
    def _port_digits(cls, value: object) -> object:
        """A port may also be given as a string of digits (``"3082"``)."""
        return int(value) if isinstance(value, str) and value.isdecimal() else value
