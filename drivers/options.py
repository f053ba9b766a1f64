"""What building a driver takes besides the ``SwitchSpec``, and the one way its options are
parsed (DESIGN.md, "Drivers").

Every driver family has one options model, a subclass of ``DriverOptions`` (pydantic, strict
types, unknown keys rejected), parsed with ``DriverOptions.from_spec``; a bad option becomes a
``DriverConfigError`` naming ``switches[<id>].options.<field>`` and the value given.
Credentials are given inline (``password``) or as the name of an environment variable
(``password_env``), exactly one of the two, and read by ``DriverOptions.credential``. The same
models serve the daemon (``lightrail.drivers.registry.DriverRegistry.create``) and
``lightrail check-config``, which builds every driver without opening it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Self

from pydantic import BaseModel, ConfigDict, SecretStr, ValidationError, model_validator
from pydantic_core import ErrorDetails, PydanticCustomError

from lightrail.drivers.base import CommandGate, Driver, SwitchSpec


class DriverConfigError(ValueError):
    """A switch's ``model`` has no driver, or its options do not fit the driver.

    The message names the switch id and the model, and ``option`` (when the problem is one
    option): ``switches[<id>].options.<option> (model '<model>'): <problem>``, otherwise
    ``switches[<id>].model '<model>': <problem>``. It never contains a credential.
    """

    def __init__(
        self, switch_id: str, model: str, message: str, *, option: str | None = None
    ) -> None:
        where = (
            f"switches[{switch_id}].model {model!r}" if option is None
            else f"switches[{switch_id}].options.{option} (model {model!r})"
        )
        super().__init__(f"{where}: {message}")
        self.switch_id = switch_id
        self.model = model
        self.option = option


@dataclass(frozen=True, slots=True)
class DriverContext:
    """What a driver factory may need besides the switch's ``SwitchSpec``.

    ``environ``: where ``*_env`` credentials are looked up (None: ``os.environ`` at the moment
    the credential is read). ``command_gate``: asked right before every command the driver
    writes to its device, logins and logouts included; when it says False the driver raises
    ``NotLeader`` and sends nothing (the controller passes its leader-lease check, so a
    replica frozen past its lease never reaches a device: ``lightrail.drivers.base.CommandGate``).
    """

    environ: Mapping[str, str] | None = None
    command_gate: CommandGate | None = None


DriverFactory = Callable[[SwitchSpec, DriverContext], Driver]
"""Builds an unopened driver for one switch; raises ``DriverConfigError``."""


def option_error(option: str, message: str) -> PydanticCustomError:
    """The error a ``DriverOptions`` validator raises for a problem of ``option`` that pydantic
    cannot place itself (a rule across several fields): ``from_spec`` names ``option``."""
    return PydanticCustomError("driver_option", "{message}", {"option": option, "message": message})


class DriverOptions(BaseModel):
    """Base of every driver's options model: the fields are the keys of
    ``switches[<id>].options``; strict types (no ``"5"`` for 5, no 1 for true; an integer is a
    valid float), unknown keys rejected, frozen.

    ``credentials`` names the credentials a subclass takes: for each name ``c`` it declares
    fields ``c`` (``str`` or ``SecretStr``, inline) and ``c_env`` (``str``, the name of an
    environment variable), both optional; exactly one of the two must be given.
    """

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    credentials: ClassVar[tuple[str, ...]] = ()

    @model_validator(mode="after")
    def _one_source_per_credential(self) -> Self:
        for name in self.credentials:
            inline, env = getattr(self, name), getattr(self, f"{name}_env")
            if (inline is None) == (env is None):
                raise option_error(name, f"set exactly one of {name} and {name}_env")
        return self

    @classmethod
    def from_spec(cls, spec: SwitchSpec) -> Self:
        """The options of ``spec`` (``spec.options``). Raises ``DriverConfigError`` naming the
        switch, the model, the first bad option and the value given (``(and N more)`` when
        there are several); an inline credential's value is never shown, nor the text given
        for an unknown key (it may be a mistyped credential)."""
        try:
            return cls.model_validate(dict(spec.options))
        except ValidationError as exc:
            errors = exc.errors()
            option, message = cls._describe(errors[0])
            if len(errors) > 1:
                message += f" (and {len(errors) - 1} more)"
            raise DriverConfigError(spec.switch_id, spec.model, message, option=option) from None

    @classmethod
    def _describe(cls, error: ErrorDetails) -> tuple[str | None, str]:
        ctx: dict[str, Any] = dict(error.get("ctx") or {})
        if error["type"] == "driver_option":
            return str(ctx["option"]), str(ctx["message"])
        loc = error["loc"]
        option = str(loc[0]) if loc else None
        value = error.get("input")
        if error["type"] == "extra_forbidden":
            known = ", ".join(sorted(cls.model_fields)) or "none: this model takes no options"
            shown = "a string" if isinstance(value, str) else repr(value)
            return option, f"unknown option (known: {known}), got {shown}"
        if error["type"] == "missing":
            return option, "required"
        if option in cls.credentials:
            return option, f"{error['msg'].lower()} (value not shown)"
        return option, f"{error['msg'].lower()}, got {value!r}"

    def credential(self, name: str, environ: Mapping[str, str] | None = None) -> str | None:
        """The value of credential ``name`` (one of ``credentials``): the inline value, else
        the environment variable ``<name>_env`` names, read now from ``environ`` (default
        ``os.environ``). None when that variable is unset or empty."""
        if name not in self.credentials:
            raise KeyError(f"{type(self).__name__} has no credential {name!r}")
        inline = getattr(self, name)
        if isinstance(inline, SecretStr):
            return inline.get_secret_value()
        if inline is not None:
            return str(inline)
        variable = getattr(self, f"{name}_env")
        found = (os.environ if environ is None else environ).get(variable)
        return found or None

    def credential_variable(self, name: str) -> str | None:
        """The environment variable credential ``name`` is read from (None: given inline)."""
        if name not in self.credentials:
            raise KeyError(f"{type(self).__name__} has no credential {name!r}")
        variable = getattr(self, f"{name}_env")
        return None if variable is None else str(variable)
