"""The per-rank view of ``PhaseCoordinator`` for tests written against per-rank decisions.

The coordinator answers a phase instance with one ``Admitted`` per batch of ranks admitted
together; tests that reason rank by rank read its ``Admit`` views instead (``per_rank``). Every
method that returns decisions returns them expanded; everything else is the coordinator's.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from lightrail.controller.core.coordinator import PhaseCoordinator
from lightrail.controller.core.decisions import Admit, Decision, per_rank
from lightrail.controller.domain.errors import ErrorCode
from lightrail.controller.domain.model import PhaseKey

PerRankDecision = Decision | Admit


class PerRankCoordinator:
    """Wraps ``coordinator``; see the module docstring."""

    def __init__(self, coordinator: PhaseCoordinator) -> None:
        self.inner = coordinator

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def enter(self, job_id: str, rank: int, phase: PhaseKey, request_id: int, now: float,
              timeout_s: float | None = None, iteration: int = 0, nbytes: int = 0,
              compute_gap_s: float = 0.0) -> list[PerRankDecision]:
        return per_rank(self.inner.enter(job_id, rank, phase, request_id, now, timeout_s,
                                         iteration, nbytes, compute_gap_s))

    def enter_many(self, job_id: str, ranks: Sequence[int], phase: PhaseKey, request_id: int,
                   now: float, timeout_s: float | None = None,
                   iteration: int = 0) -> list[PerRankDecision]:
        return per_rank(self.inner.enter_many(job_id, ranks, phase, request_id, now,
                                              timeout_s, iteration))

    def release(self, job_id: str, rank: int, phase: PhaseKey, now: float,
                iteration: int | None = None) -> list[PerRankDecision]:
        return per_rank(self.inner.release(job_id, rank, phase, now, iteration))

    def reconfigured(self, op_id: int, now: float, error: str | None = None,
                     device_s: float = 0.0, failed_switches: Iterable[str] = (),
                     code: ErrorCode = ErrorCode.DEVICE_FAILURE) -> list[PerRankDecision]:
        return per_rank(self.inner.reconfigured(op_id, now, error, device_s, failed_switches,
                                                code))

    def cancel(self, job_id: str, rank: int, request_id: int,
               now: float) -> list[PerRankDecision]:
        return per_rank(self.inner.cancel(job_id, rank, request_id, now))

    def expire(self, now: float) -> list[PerRankDecision]:
        return per_rank(self.inner.expire(now))

    def schedule(self, now: float) -> list[PerRankDecision]:
        return per_rank(self.inner.schedule(now))

    def synced(self, job_id: str, ranks: Iterable[int], now: float) -> list[PerRankDecision]:
        return per_rank(self.inner.synced(job_id, ranks, now))

    def unregister_job(self, job_id: str) -> list[PerRankDecision]:
        return per_rank(self.inner.unregister_job(job_id))

    def replace_rank(self, job_id: str, rank: int, host: str, gpu: int,
                     now: float) -> list[PerRankDecision]:
        return per_rank(self.inner.replace_rank(job_id, rank, host, gpu, now))
