"""What the phase coordinator decides, and the advice it takes. Pure values: the coordinator
returns them, the async shell (``lightrail.controller.runtime.phase_service``) carries them out.

A decision carries everything the shell needs to act on it, so the shell never calls back into
the coordinator to complete one (an ``Admitted`` says how many all-to-all steps its phase
takes and where each answer goes).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from lightrail.controller.core.advisor import Advice
from lightrail.controller.core.decision import ReconfigureDecision
from lightrail.controller.core.planner import JobLayout, Plan, SwitchTarget
from lightrail.controller.domain.errors import ErrorCode
from lightrail.controller.domain.model import PhaseKey, RankPlacement
from lightrail.drivers.base import CrossConnect


class Advisor(Protocol):
    """Reconfigure-or-not advice (``lightrail.controller.core.advisor.CostAdvisor``)."""

    def advise(
        self,
        layout: JobLayout,
        phase: PhaseKey,
        plan: Plan,
        confirmed: Mapping[str, Mapping[int, CrossConnect]],
        nbytes: int,
        compute_gap_s: float,
    ) -> Advice | None: ...


@dataclass(frozen=True, slots=True)
class Admit:
    """One rank's view of an admission (``Admitted.per_rank``): ``rank`` enters ``phase``.
    ``noop``: the circuits were already there. ``waited_s``: from the rank's enter to the
    admission, in seconds; ``device_s``: how long the switches took to confirm the
    reconfiguration that admitted it (0 for a no-op). ``steps``: how many sub-phases the rank
    steps through (the all-to-all shift permutations of
    ``lightrail.controller.core.planner.all_to_all_steps``; 1 for every other collective), >= 1.
    """

    job_id: str
    rank: int
    request_id: int
    phase: PhaseKey
    noop: bool
    waited_s: float
    device_s: float = 0.0
    steps: int = field(kw_only=True)


@dataclass(frozen=True, slots=True)
class AdmittedBatch:
    """The ranks of one ``EnterBatch`` admitted together: where the answer goes (``route``,
    the shell's opaque id), the batch's request id, its ranks and when they asked (s)."""

    route: int
    request_id: int
    ranks: tuple[int, ...]
    arrived_s: float


@dataclass(frozen=True, slots=True)
class Admitted:
    """Ranks admitted into one phase instance (``phase`` of training step ``iteration``)
    together, at ``at_s`` (s), batch by batch (``entries``, in arrival order). ``noop``: the
    circuits were already there; ``device_s``: how long the switches took to confirm the
    reconfiguration that admitted them (0 for a no-op); ``steps`` as in ``Admit``. One
    decision per instance and event, whatever the number of ranks: the shell answers each
    route once and records metrics once."""

    job_id: str
    phase: PhaseKey
    iteration: int
    noop: bool
    at_s: float
    device_s: float
    steps: int
    entries: tuple[AdmittedBatch, ...]

    @property
    def rank_count(self) -> int:
        """How many ranks were admitted."""
        return sum(len(e.ranks) for e in self.entries)

    def admits(self, entry: AdmittedBatch) -> list[Admit]:
        """One ``Admit`` per rank of ``entry`` (one of ``entries``)."""
        waited_s = self.at_s - entry.arrived_s
        return [Admit(self.job_id, r, entry.request_id, self.phase, self.noop, waited_s,
                      self.device_s, steps=self.steps) for r in entry.ranks]

    def per_rank(self) -> list[Admit]:
        """One ``Admit`` per rank, in arrival order."""
        return [a for e in self.entries for a in self.admits(e)]


@dataclass(frozen=True, slots=True)
class Reject:
    """Refuse an EnterPhase with an explicit reason. ``route``: the shell's id of where the
    answer goes (the route of the refused request's batch; for a request refused at once,
    the route it came with)."""

    job_id: str
    rank: int
    request_id: int
    code: ErrorCode
    message: str
    route: int = 0


@dataclass(frozen=True, slots=True)
class Reconfigure:
    """Make the switches match ``targets``: on each ``SwitchTarget.ports`` exactly
    ``SwitchTarget.cross_connects`` (only what changes). ``plan`` is the phase's whole plan,
    for the record. Report back with ``PhaseCoordinator.reconfigured(op_id)``."""

    op_id: int
    job_id: str
    phase: PhaseKey
    targets: tuple[SwitchTarget, ...]
    provisioning: bool = False
    """True when no rank asked yet: the schedule predicts ``phase`` comes next (Opus)."""
    plan: Plan = field(kw_only=True)


@dataclass(frozen=True, slots=True)
class Decided:
    """A reconfigure-or-not decision for ``phase`` and the numbers behind it (PCCL). When
    ``provisioning``, it was taken ahead of the phase, on last iteration's hints."""

    job_id: str
    phase: PhaseKey
    decision: ReconfigureDecision
    provisioning: bool


@dataclass(frozen=True, slots=True)
class Rewire:
    """Failover: move a failed endpoint's cross-connects to a spare's ports (``targets`` as in
    ``Reconfigure``). Report back with ``PhaseCoordinator.reconfigured(op_id)``."""

    op_id: int
    job_id: str
    rank: int
    old: RankPlacement
    new: RankPlacement
    targets: tuple[SwitchTarget, ...]


Decision = Admitted | Reject | Reconfigure | Decided | Rewire


def per_rank(decisions: list[Decision]) -> list[Decision | Admit]:
    """``decisions`` with every ``Admitted`` expanded into its per-rank ``Admit`` views (for
    callers that answer rank by rank, and for tests)."""
    out: list[Decision | Admit] = []
    for d in decisions:
        if isinstance(d, Admitted):
            out.extend(d.per_rank())
        else:
            out.append(d)
    return out
