"""The options model of the RESTCONF driver: ``switches[<id>].options`` of a ``model: restconf``
switch (meaning of each option in ``lightrail.drivers.restconf.driver``), and the Basic-auth
credentials they resolve to."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar, Literal

from pydantic import Field, SecretStr, field_validator

from lightrail.drivers.base import SwitchSpec
from lightrail.drivers.options import DriverConfigError, DriverOptions

DEFAULT_PORT = 8008
"""TCP port of the Polatis RESTCONF server."""
DEFAULT_ROOT = "/api"
"""RESTCONF root resource on Polatis switches."""
DEFAULT_TIMEOUT_S = 10.0
"""Deadline of one HTTP exchange, in seconds."""
DEFAULT_ALARM_POLL_INTERVAL_S = 1.0
"""Interval between two reads of ``system-alarms`` by ``events()``, in seconds."""
DEFAULT_LOS_THRESHOLD_DBM = -30.0
"""Below this optical power (dBm) an enabled port is reported oper DOWN (loss of signal)."""


@dataclass(frozen=True, slots=True)
class RestconfCredentials:
    """HTTP Basic credentials; the password never appears in ``repr``."""

    username: str
    password: str = field(repr=False)


class RestconfOptions(DriverOptions):
    """Where and how to reach one switch, from ``switches[<id>].options`` (see the module
    docstring); unknown keys are rejected (``DriverOptions``). Exactly one of
    ``username``/``username_env`` and one of ``password``/``password_env`` is given; the
    ``*_env`` variables are read when the driver is built (``make_driver``)."""

    credentials: ClassVar[tuple[str, ...]] = ("username", "password")

    host: str = Field(min_length=1)
    port: int = Field(default=DEFAULT_PORT, ge=1, le=65535)
    scheme: Literal["http", "https"] = "http"
    root: str = Field(default=DEFAULT_ROOT, min_length=1)
    username: str | None = Field(default=None, min_length=1)
    username_env: str | None = Field(default=None, min_length=1)
    password: SecretStr | None = Field(default=None, min_length=1)
    password_env: str | None = Field(default=None, min_length=1)
    timeout_s: float = Field(default=DEFAULT_TIMEOUT_S, gt=0)
    alarm_poll_interval_s: float = Field(default=DEFAULT_ALARM_POLL_INTERVAL_S, gt=0)
    los_threshold_dbm: float = DEFAULT_LOS_THRESHOLD_DBM
    verify: bool = True

    @field_validator("root")
    @classmethod
    def _root_is_absolute(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError("must start with '/'")
        return value

    @property
    def base_url(self) -> str:
        """``scheme://host:port/root`` without a trailing slash."""
        return f"{self.scheme}://{self.host}:{self.port}{self.root.rstrip('/')}"


def resolve_credentials(
    spec: SwitchSpec, options: RestconfOptions, environ: Mapping[str, str] | None = None
) -> RestconfCredentials:
    """The Basic-auth credentials ``options`` give, ``*_env`` variables read now from
    ``environ`` (default ``os.environ``). Raises ``DriverConfigError`` naming the option when a
    variable is unset or empty, or the username contains ``:`` (RFC 7617); the message never
    contains a credential."""
    values: dict[str, str] = {}
    for name in RestconfOptions.credentials:
        value = options.credential(name, environ)
        if value is None:
            variable = options.credential_variable(name)
            raise DriverConfigError(
                spec.switch_id, spec.model,
                f"environment variable {variable!r} is not set or empty", option=f"{name}_env",
            )
        values[name] = value
    if ":" in values["username"]:
        option = "username" if options.credential_variable("username") is None else "username_env"
        raise DriverConfigError(
            spec.switch_id, spec.model, "the username must not contain ':' (RFC 7617 Basic auth)",
            option=option,
        )
    return RestconfCredentials(values["username"], values["password"])
