"""What the phase coordinator decides, and the advice it takes. Pure values: the coordinator
returns them, the async shell (``lightrail.controller.runtime.phase_service``) carries them out.

A decision carries everything the shell needs to act on it, so the shell never calls back into
the coordinator to complete one (an ``Admit`` says how many all-to-all steps its phase takes).
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
    """Admit ``rank`` into ``phase``. ``noop``: the circuits were already there.
    ``waited_s``: from the rank's enter to this decision, in seconds; ``device_s``: how long the
    switches took to confirm the reconfiguration that admitted it (0 for a no-op).
    ``steps``: how many sub-phases the rank steps through (the all-to-all shift permutations of
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
class Reject:
    """Refuse an EnterPhase with an explicit reason."""

    job_id: str
    rank: int
    request_id: int
    code: ErrorCode
    message: str


@dataclass(frozen=True, slots=True)
class Reconfigure:
    """Make the switches match ``targets``: on each ``SwitchTarget.ports`` exactly
    ``SwitchTarget.cross_connects``. Report back with ``PhaseCoordinator.reconfigured(op_id)``."""

    op_id: int
    job_id: str
    phase: PhaseKey
    targets: tuple[SwitchTarget, ...]
    provisioning: bool = False
    """True when no rank asked yet: the schedule predicts ``phase`` comes next (Opus)."""


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


Decision = Admit | Reject | Reconfigure | Decided | Rewire
