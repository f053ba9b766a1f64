"""Error codes and error types every side shares: the controller's core and shell, the API codec,
the host agent and the job-side library (mirrors ``lightrail.v1.PhaseErrorCode``)."""

from __future__ import annotations

import enum


class ErrorCode(enum.Enum):
    """Why an EnterPhase was refused (mirrors ``lightrail.v1.PhaseErrorCode``)."""

    DEADLINE_EXCEEDED = "deadline_exceeded"
    UNKNOWN_JOB = "unknown_job"
    INVALID_RANK = "invalid_rank"
    INVALID_PHASE = "invalid_phase"
    RANK_BUSY = "rank_busy"
    DEVICE_FAILURE = "device_failure"
    PLACEMENT_CHANGED = "placement_changed"
    NOT_LEADER = "not_leader"
    CANCELLED = "cancelled"
    SWITCH_MAINTENANCE = "switch_maintenance"
    """The phase needs a reconfiguration of a switch an operator put in maintenance
    (``lightrail maintenance on``); the message names the switch and the reason. Final: the
    phase is admitted once the switch leaves maintenance (or when its circuits are there)."""


class FailoverError(ValueError):
    """A rank cannot be moved to the given GPU; the message names the field and value."""


class FailoverBusy(FailoverError):
    """The ports involved are being switched right now: retry once that completes."""


class DuplicateJob(ValueError):
    """A job id is registered already."""


class UnknownJob(KeyError):
    """No job with that id is registered."""

    def __str__(self) -> str:
        return f"unknown job {self.args[0]!r}"


class ReleaseError(ValueError):
    """A ReleasePhase that does not match what the rank holds; ``code`` says why."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
