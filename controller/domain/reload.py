"""The outcome of a configuration reload (SIGHUP, or OperatorService.Reload): what the
daemon, its metrics and event, and ``lightrail reload`` report (README "Reload")."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ReloadOutcome:
    """``applied``: the file was valid and its settings are now in force (``changed``: the
    dotted config paths that changed, empty when none did); otherwise ``error`` says why the
    running configuration was kept (the field and its value, or the settings that need a
    restart). ``path``: the config file read (``<defaults>`` when started without one)."""

    applied: bool
    path: str
    changed: tuple[str, ...] = ()
    error: str | None = None
