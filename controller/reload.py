"""Configuration reload of a running replica: SIGHUP (``systemctl reload``) and the
OperatorService ``Reload`` call (``lightrail reload``), answered by the replica itself.

A reload reads the config file again and validates it with the one schema
(``lightrail.controller.config``). Then, all or nothing:

- invalid (unreadable, bad YAML, unknown key, wrong value): the running configuration is kept;
  the error names the field and the value;
- valid, but a setting changed that a running replica cannot change (anything outside
  ``RELOADABLE``: the fabric, listen and metrics addresses, TLS, etcd, ``replica_id``,
  ...): the running configuration is kept; the error names each such field and says a restart
  is needed;
- otherwise every changed setting is applied at once: ``logging.level`` and
  ``logging.format`` (the process's log configuration), ``controller.admission_timeout_s``
  (the default EnterPhase timeout of the phases entered from now on, on the leader and on a
  standby once it leads) and ``controller.operators`` (who may make mutating operator calls,
  from the next call on).

Every reload counts in ``lightrail_config_reload_failures_total`` (by reason) or sets
``lightrail_config_last_reload_successful`` to 1 and the success timestamp; each is logged,
published as a ``CONFIG_RELOAD`` fabric event while this replica leads, and told to systemd
(``RELOADING=1`` ... ``READY=1`` with a ``STATUS=`` line). The reload rule of DESIGN.md
("a bad reload keeps the last good config"), after faucet's and Prometheus's.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from pathlib import Path

import structlog

from lightrail.controller.api.auth import OperatorAuth, OperatorIdentity
from lightrail.controller.config import Config, ConfigError, OperatorConfig, load_config
from lightrail.controller.core.coordinator import PhaseCoordinator
from lightrail.controller.domain.events import FabricEvent, FabricEventKind
from lightrail.controller.domain.reload import ReloadOutcome
from lightrail.controller.logs import configure_logging
from lightrail.controller.runtime import metrics
from lightrail.controller.runtime.events import EventBus
from lightrail.controller.runtime.sdnotify import SystemdNotifier

log = structlog.get_logger(__name__)

RELOADABLE = ("logging.level", "logging.format", "controller.admission_timeout_s",
              "controller.operators")
"""The dotted config paths a reload applies; a change anywhere else needs a restart."""

_SECRET_WORDS = ("password", "token", "secret")


def operator_identities(operators: list[OperatorConfig]) -> list[OperatorIdentity]:
    """The ``OperatorAuth`` identities of ``controller.operators``."""
    return [OperatorIdentity(o.name, o.token_sha256, o.subject) for o in operators]


def _flatten(value: object, prefix: str, out: dict[str, object]) -> None:
    """``out[path] = leaf`` for every leaf of ``value`` (mappings are walked; lists and
    scalars are leaves)."""
    if isinstance(value, Mapping):
        for key, item in value.items():
            _flatten(item, f"{prefix}.{key}" if prefix else str(key), out)
    else:
        out[prefix] = value


def changed_paths(old: Config, new: Config) -> list[str]:
    """The dotted paths (``controller.listen``, ``fabric.switches``: a list is one leaf) whose
    values differ between ``old`` and ``new``, sorted."""
    a: dict[str, object] = {}
    b: dict[str, object] = {}
    _flatten(old.model_dump(mode="json"), "", a)
    _flatten(new.model_dump(mode="json"), "", b)
    return sorted(p for p in a.keys() | b.keys() if a.get(p) != b.get(p))


def _shown(path: str, value: object) -> str:
    """``value`` for an error message: scalars as repr, never a credential's value or a list
    (a switch's options may hold a password)."""
    if any(w in path.lower() for w in _SECRET_WORDS) or isinstance(value, list | dict):
        return "(value not shown)"
    return repr(value)


def _restart_error(old: Config, new: Config, paths: list[str]) -> str:
    a: dict[str, object] = {}
    b: dict[str, object] = {}
    _flatten(old.model_dump(mode="json"), "", a)
    _flatten(new.model_dump(mode="json"), "", b)
    fields = "; ".join(f"{p}: {_shown(p, a.get(p))} -> {_shown(p, b.get(p))}" for p in paths)
    return (f"needs a restart: {fields} (a reload applies only {', '.join(RELOADABLE)}); the "
            "running configuration is kept")


class ConfigReloader:
    """Reloads ``path`` (None: the defaults, as ``lightrail controller`` without
    ``--config``) into a running replica whose configuration came from ``loaded`` (as the
    file said, before any command-line override). ``auth`` is the replica's operator check
    (``attach_auth``); ``lead`` attaches the leader's coordinator and event bus (a
    replica leads once: it exits when it stops).
    Reloads run one at a time. Counts the start as a successful load
    (``lightrail_config_last_reload_successful`` 1, the timestamp now)."""

    def __init__(self, path: Path | None, loaded: Config,
                 notifier: SystemdNotifier | None = None) -> None:
        self.path = path
        self.current = loaded
        self._notifier = notifier if notifier is not None else SystemdNotifier(None)
        self._auth: OperatorAuth | None = None
        self._coordinator: PhaseCoordinator | None = None
        self._events: EventBus | None = None
        self._lock = asyncio.Lock()
        metrics.CONFIG_LAST_RELOAD_SUCCESSFUL.set(1)
        metrics.CONFIG_LAST_RELOAD_SUCCESS_TIME.set(time.time())

    @property
    def source(self) -> str:
        """The config file's path as given, ``<defaults>`` without one."""
        return "<defaults>" if self.path is None else str(self.path)

    def attach_auth(self, auth: OperatorAuth) -> None:
        """The operator check a reload of ``controller.operators`` replaces; it takes the
        current operators at once (a reload may have come before the gRPC server started)."""
        self._auth = auth
        auth.replace(operator_identities(self.current.controller.operators))

    def lead(self, coordinator: PhaseCoordinator, events: EventBus) -> None:
        """This replica leads: apply the current admission timeout to ``coordinator`` (a
        reload while standing by changed it) and publish reload events on ``events``."""
        self._coordinator = coordinator
        self._events = events
        coordinator.default_timeout_s = self.current.controller.admission_timeout_s

    async def reload(self, trigger: str) -> ReloadOutcome:
        """Read, validate and apply the config file (module doc); ``trigger`` (``SIGHUP``,
        ``rpc``) is logged and in the event. Never raises for a bad file: the outcome says why
        it was refused."""
        async with self._lock:
            self._notifier.reloading(f"reloading {self.source} ({trigger})")
            try:
                new = await asyncio.to_thread(load_config, self.path)  # off the loop
            except ConfigError as exc:
                outcome = ReloadOutcome(False, self.source, error=str(exc))
            else:
                outcome = self._apply(new)
            self._report(outcome, trigger)
            return outcome

    def _apply(self, new: Config) -> ReloadOutcome:
        """Apply ``new`` when every changed setting is in ``RELOADABLE``, all at once (on the
        event loop: no call sees half of it); else refuse, changing nothing."""
        old = self.current
        changed = changed_paths(old, new)
        restart = [p for p in changed if p not in RELOADABLE]
        if restart:
            return ReloadOutcome(False, self.source, tuple(changed),
                                 error=f"{self.source}: {_restart_error(old, new, restart)}")
        if self._auth is not None and "controller.operators" in changed:
            self._auth.replace(operator_identities(new.controller.operators))
        if self._coordinator is not None:
            self._coordinator.default_timeout_s = new.controller.admission_timeout_s
        if "logging.level" in changed or "logging.format" in changed:
            configure_logging(new.logging.level, new.logging.format)
        self.current = new
        return ReloadOutcome(True, self.source, tuple(changed))

    def _report(self, outcome: ReloadOutcome, trigger: str) -> None:
        """Metrics, log line, fabric event (while leading) and systemd status of
        ``outcome``."""
        if outcome.applied:
            metrics.CONFIG_LAST_RELOAD_SUCCESSFUL.set(1)
            metrics.CONFIG_LAST_RELOAD_SUCCESS_TIME.set(time.time())
            log.info("config_reloaded", path=outcome.path, trigger=trigger,
                     changed=list(outcome.changed))
            message = (f"config {outcome.path} reloaded: "
                       f"{', '.join(outcome.changed) or 'nothing changed'}")
            status = f"config reloaded ({trigger})"
        else:
            reason = "invalid" if not outcome.changed else "needs_restart"
            metrics.CONFIG_RELOAD_FAILURES.labels(reason=reason).inc()
            metrics.CONFIG_LAST_RELOAD_SUCCESSFUL.set(0)
            log.error("config_reload_refused", path=outcome.path, trigger=trigger,
                      reason=reason, error=outcome.error)
            message = f"config {outcome.path} not reloaded, running one kept: {outcome.error}"
            status = f"config reload refused ({reason}), running configuration kept"
        if self._events is not None:
            self._events.publish_fabric(FabricEvent(
                FabricEventKind.CONFIG_RELOAD, message,
                fields={"applied": str(outcome.applied).lower(), "path": outcome.path,
                        "trigger": trigger, "changed": ",".join(outcome.changed),
                        "error": outcome.error or ""}))
        self._notifier.ready(status)

    async def follow(self, requested: asyncio.Event) -> None:
        """Reload each time ``requested`` is set (the SIGHUP handler sets it), until
        cancelled; signals that come during a reload make one more reload."""
        while True:
            await requested.wait()
            requested.clear()
            await self.reload("SIGHUP")


__all__ = ["RELOADABLE", "ConfigReloader", "changed_paths", "operator_identities"]
