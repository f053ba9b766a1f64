"""What the job side sees when the controller refuses or cannot answer an EnterPhase."""

from __future__ import annotations

from dataclasses import dataclass

from lightrail.controller.domain.errors import ErrorCode


@dataclass(frozen=True, slots=True)
class Admission:
    """A rank was admitted into a phase. ``noop``: no reconfiguration was needed; ``steps``:
    sub-phases of this phase (all-to-all permutations, else 1); ``device_s``: seconds the
    switches took to confirm the reconfiguration that admitted it (0 for a no-op)."""

    noop: bool
    steps: int
    device_s: float


class PhaseError(Exception):
    """EnterPhase or ReleasePhase failed; ``code`` says why. Never a silent "go ahead"."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(f"{code.value}: {message}")
        self.code = code
        self.detail = message


class PhaseTimeout(PhaseError):
    """Circuits were not confirmed within the timeout."""


class PlacementChanged(PhaseError):
    """The job's placement changed (failover): restart from the last checkpoint."""


class SwitchInMaintenance(PhaseError):
    """The phase needs a reconfiguration of a switch an operator put in maintenance; the
    message names the switch and the reason. Circuits already in place are still admitted."""


class ControllerUnavailable(PhaseError):
    """The controller could not be reached within the retry budget."""


def error_for(code: ErrorCode, message: str) -> PhaseError:
    """The most specific ``PhaseError`` subclass for ``code``."""
    if code is ErrorCode.DEADLINE_EXCEEDED:
        return PhaseTimeout(code, message)
    if code is ErrorCode.PLACEMENT_CHANGED:
        return PlacementChanged(code, message)
    if code is ErrorCode.NOT_LEADER:
        return ControllerUnavailable(code, message)
    if code is ErrorCode.SWITCH_MAINTENANCE:
        return SwitchInMaintenance(code, message)
    return PhaseError(code, message)
