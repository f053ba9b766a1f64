"""After-the-fact check of the safety invariant (DESIGN.md) on emulated switches' change logs.

For every hold (a rank admitted into a phase at ``admitted_s`` and released at ``released_s``),
every cross-connect of the phase's plan must have been made (light passing) no later than the
admission, and must not have been broken before the release.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from lightrail.agents.replay.replayer import HoldRecord
from lightrail.controller.core.planner import layout_job, plan_phase
from lightrail.controller.domain.fabric import Fabric
from lightrail.controller.domain.model import RankPlacement
from lightrail.drivers.base import CrossConnect
from lightrail.emulator.ocs import ChangeAction, ChangeRecord

# Emulator and replay both use time.monotonic; allow for float rounding only.
_EPS_S = 1e-6


@dataclass(frozen=True, slots=True)
class Violation:
    """One broken promise, readable in a test failure."""

    rank: int
    phase: str
    switch_id: str
    cross_connect: CrossConnect
    problem: str


def check_holds(
    fabric: Fabric,
    placements: Sequence[RankPlacement] | Sequence[Sequence[RankPlacement]],
    holds: Iterable[HoldRecord],
    change_logs: Mapping[str, Sequence[ChangeRecord]],
    initial: Mapping[str, frozenset[CrossConnect]] | None = None,
    *,
    device_losses: list[Violation] | None = None,
    device_loss_grace_s: float = 0.0,
) -> list[Violation]:
    """Every violation of the invariant; empty when it held. ``placements`` is one placement
    or one per attempt (``HoldRecord.attempt`` indexes it: failovers change the placement).
    ``initial`` is the switches' state before the first logged change (default: empty).

    With ``device_losses`` given, a cross-connect the device lost on its own (an uncommanded
    break: ``ChangeRecord.commanded`` False, e.g. a reboot) is the device's fault, not the
    controller's, while no controller could have known: a hold it broke, or an admission at
    most ``device_loss_grace_s`` after it (the reply was on its way, or the device's alarm not
    yet delivered), goes to ``device_losses`` instead. An admission later than that onto a
    circuit the device lost is still a violation: the controller should have learnt of the
    loss (alarm, read-back) by then."""
    per_attempt: list[Sequence[RankPlacement]] = (
        [placements] if placements and isinstance(placements[0], RankPlacement)  # type: ignore[list-item]
        else list(placements))  # type: ignore[arg-type]
    layouts = [layout_job(fabric, f"check{i}", p) for i, p in enumerate(per_attempt)]
    timeline: dict[tuple[str, CrossConnect], list[tuple[float, ChangeAction, bool]]] = {}
    for sid, log in change_logs.items():
        for rec in log:
            timeline.setdefault((sid, rec.cross_connect), []).append(
                (rec.at_s, rec.action, rec.commanded))
    for events in timeline.values():
        events.sort(key=lambda e: e[0])
    out: list[Violation] = []
    for h in holds:
        layout = layouts[min(h.attempt, len(layouts) - 1)]
        for target in plan_phase(layout, h.phase).targets:
            for xc in target.cross_connects:
                events = timeline.get((target.switch_id, xc), [])
                times = [t for t, _, _ in events]
                i = bisect.bisect_right(times, h.admitted_s + _EPS_S)
                present = (events[i - 1][1] is ChangeAction.MAKE) if i else (
                    initial is not None and xc in initial.get(target.switch_id, frozenset()))
                if not present:
                    v = Violation(h.rank, str(h.phase), target.switch_id, xc,
                                  f"not made at admission {h.admitted_s:.6f}")
                    lost_at, _, commanded = events[i - 1] if i else (0.0, None, True)
                    if (device_losses is not None and not commanded
                            and h.admitted_s - lost_at <= device_loss_grace_s):
                        device_losses.append(v)
                    else:
                        out.append(v)
                    continue
                for t, action, commanded in events[i:]:
                    if t >= h.released_s - _EPS_S:
                        break
                    if action is ChangeAction.BREAK:
                        v = Violation(h.rank, str(h.phase), target.switch_id, xc,
                                      f"broken at {t:.6f} while held "
                                      f"[{h.admitted_s:.6f}, {h.released_s:.6f}]")
                        (device_losses if device_losses is not None and not commanded
                         else out).append(v)
                        break
    return out
