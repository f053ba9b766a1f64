"""Schedule learning's port bookkeeping (``Provisioner._take_ports``): the predecessors of a new
phase instance, found from the inverse index ``JobRecord.ports_last_of`` (only the ports its
phase was not last on are looked up), are exactly those a scan of every port of its plan finds,
and the index stays the inverse of ``JobRecord.last_on_port``."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from lightrail.controller.core.coordinator import PhaseCoordinator
from lightrail.controller.core.provisioning import Provisioner
from lightrail.controller.domain.fabric import rail_fabric
from lightrail.controller.domain.model import Collective, PhaseKey, ProcessGroup, RankPlacement

PHASES = (
    PhaseKey(ProcessGroup.of(range(8)), Collective.ALL_REDUCE),
    PhaseKey(ProcessGroup.of([0, 4]), Collective.SEND_RECV),
    PhaseKey(ProcessGroup.of([0, 2]), Collective.SEND_RECV),
    PhaseKey(ProcessGroup.of([2, 4]), Collective.SEND_RECV),
    PhaseKey(ProcessGroup.of([2, 6]), Collective.SEND_RECV),
    PhaseKey(ProcessGroup.of([1, 3, 5, 7]), Collective.ALL_REDUCE),  # rail 1 ring
    PhaseKey(ProcessGroup.of([0, 2, 4, 6]), Collective.ALL_TO_ALL, step=1),
    PhaseKey(ProcessGroup.of([0, 2, 4, 6]), Collective.ALL_TO_ALL, step=2),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(range(len(PHASES))), max_size=40))
def test_predecessors_are_those_a_scan_of_every_port_finds(order: list[int]) -> None:
    c = PhaseCoordinator(rail_fabric("t", 4, 2, delay_s=0.0))
    c.register_job("job", "t", [RankPlacement(r, f"host{r // 2}", r % 2) for r in range(8)])
    state = c._s
    job = state.jobs["job"]
    scanned: dict[str, dict[int, PhaseKey]] = {}  # the full scan's own last-phase map
    for i in order:
        phase = PHASES[i]
        plan = state.plan(job, phase)
        expected: dict[PhaseKey, set[tuple[str, int]]] = {}
        for t in plan.targets:
            last = scanned.setdefault(t.switch_id, {})
            for p in t.ports:
                prev = last.get(p)
                if prev is not None and prev != phase:
                    expected.setdefault(prev, set()).add((t.switch_id, p))
                last[p] = phase
        assert Provisioner._take_ports(job, phase, plan) == expected
        assert job.last_on_port == {sid: m for sid, m in scanned.items() if m}
        for sid, of in job.ports_last_of.items():
            assert all(of.values()), "a phase left with no ports is dropped from the index"
            assert {p: ph for ph, ports in of.items() for p in ports} == job.last_on_port[sid]
