"""Maintenance mode in the pure core: a switch in maintenance is changed by no decision; phases
that need a change there are refused SWITCH_MAINTENANCE, phases whose circuits are in place are
still admitted, and taking the switch out lets the phase switch."""

from __future__ import annotations

import pytest

from lightrail.controller.core.coordinator import PhaseCoordinator
from lightrail.controller.core.decisions import Admitted, Reconfigure, Reject, Rewire
from lightrail.controller.domain.errors import ErrorCode, FailoverError
from lightrail.controller.domain.fabric import rail_fabric
from lightrail.controller.domain.model import Collective, PhaseKey, ProcessGroup, RankPlacement

WORLD = tuple(range(8))
RING = PhaseKey(ProcessGroup.of(WORLD), Collective.ALL_REDUCE, 0)
PP = PhaseKey(ProcessGroup.of([0, 2]), Collective.SEND_RECV, 0)  # host0 <-> host1, rail 0


@pytest.fixture
def coord() -> PhaseCoordinator:
    c = PhaseCoordinator(rail_fabric("t", 4, 2, delay_s=0.01), default_timeout_s=5.0)
    c.register_job("job", "tenant", [RankPlacement(r, f"host{r // 2}", r % 2)
                                     for r in range(8)])
    return c


def _switched(c: PhaseCoordinator, phase: PhaseKey, ranks: tuple[int, ...], now: float) -> None:
    """Enter ``phase`` with ``ranks``, confirm its reconfiguration, release it again."""
    out = c.enter_many("job", ranks, phase, 1, now)
    (rec,) = [d for d in out if isinstance(d, Reconfigure)]
    assert any(isinstance(d, Admitted) for d in c.reconfigured(rec.op_id, now + 0.1))
    c.release_many("job", ranks, phase, now + 0.2)


def test_a_phase_needing_a_switch_in_maintenance_is_refused_naming_it(
    coord: PhaseCoordinator,
) -> None:
    assert coord.set_maintenance("ocs-rail0", "fibre cleaning", 0.0) == []
    assert coord.maintenance() == {"ocs-rail0": "fibre cleaning"}
    out = coord.enter_many("job", WORLD, RING, 7, 1.0)
    assert not [d for d in out if isinstance(d, Reconfigure | Admitted)]
    rejects = [d for d in out if isinstance(d, Reject)]
    assert sorted(d.rank for d in rejects) == list(WORLD)
    assert {d.code for d in rejects} == {ErrorCode.SWITCH_MAINTENANCE}
    assert "'ocs-rail0'" in rejects[0].message and "fibre cleaning" in rejects[0].message
    assert coord.confirmed("ocs-rail0") == frozenset()  # nothing was switched


def test_circuits_already_in_place_are_admitted_on_a_switch_in_maintenance(
    coord: PhaseCoordinator,
) -> None:
    _switched(coord, RING, WORLD, 0.0)
    before = coord.confirmed("ocs-rail0")
    coord.set_maintenance("ocs-rail0", "inspection", 1.0)
    again = PhaseKey(RING.group, RING.collective, seq=1)
    out = coord.enter_many("job", WORLD, again, 2, 2.0)
    assert len(out) == 1 and isinstance(out[0], Admitted) and out[0].noop
    assert coord.confirmed("ocs-rail0") == before


def test_only_the_switch_in_maintenance_blocks(coord: PhaseCoordinator) -> None:
    """The PP pair of rail 0 changes only ocs-rail0: maintenance on ocs-rail1 does not stop
    it; on ocs-rail0 it does."""
    _switched(coord, RING, WORLD, 0.0)
    coord.set_maintenance("ocs-rail1", "other rail", 1.0)
    out = coord.enter_many("job", (0, 2), PP, 3, 2.0)
    (rec,) = [d for d in out if isinstance(d, Reconfigure)]
    assert {t.switch_id for t in rec.targets} == {"ocs-rail0"}
    coord.reconfigured(rec.op_id, 2.1)
    coord.release_many("job", (0, 2), PP, 2.2)
    coord.set_maintenance("ocs-rail0", "now this one", 3.0)
    ring2 = PhaseKey(RING.group, RING.collective, seq=2)  # needs the ring back on ocs-rail0
    out = coord.enter_many("job", WORLD, ring2, 4, 4.0)
    assert {d.code for d in out if isinstance(d, Reject)} == {ErrorCode.SWITCH_MAINTENANCE}


def test_waiting_phases_are_refused_when_maintenance_starts_and_admitted_after(
    coord: PhaseCoordinator,
) -> None:
    """A phase waiting (held back by a holder) when maintenance begins is refused then; after
    maintenance off, the same phase switches and is admitted."""
    _switched(coord, RING, WORLD, 0.0)
    coord.enter_many("job", WORLD, RING, 5, 1.0)  # the ring, held by everyone again
    coord.release_many("job", (0, 2), RING, 1.1)
    assert coord.enter_many("job", (0, 2), PP, 6, 1.2) == []  # waits: the ring is held
    out = coord.set_maintenance("ocs-rail0", "repair", 1.3)
    assert sorted(d.rank for d in out if isinstance(d, Reject)
                  and d.code is ErrorCode.SWITCH_MAINTENANCE) == [0, 2]
    coord.release_many("job", (1, 3, 4, 5, 6, 7), RING, 1.4)
    assert coord.set_maintenance("ocs-rail0", None, 2.0) == []
    assert coord.maintenance() == {}
    out = coord.enter_many("job", (0, 2), PP, 7, 2.1)
    (rec,) = [d for d in out if isinstance(d, Reconfigure)]
    admitted = coord.reconfigured(rec.op_id, 2.2)
    assert [d.noop for d in admitted if isinstance(d, Admitted)] == [False]


def test_provisioning_skips_a_switch_in_maintenance() -> None:
    """A declared schedule is provisioned on release, except onto a switch in maintenance."""
    c = PhaseCoordinator(rail_fabric("t", 4, 2, delay_s=0.01), default_timeout_s=5.0)
    c.register_job("job", "tenant", [RankPlacement(r, f"host{r // 2}", r % 2)
                                     for r in range(8)], declared_phases=[RING, PP])
    out = c.enter_many("job", WORLD, RING, 1, 0.0)
    (rec,) = [d for d in out if isinstance(d, Reconfigure)]
    c.reconfigured(rec.op_id, 0.1)
    c.set_maintenance("ocs-rail0", "hold still", 0.2)
    out, _ = c.release_many("job", WORLD, RING, 0.3)
    assert not [d for d in out if isinstance(d, Reconfigure)]


def test_failover_onto_a_switch_in_maintenance_is_refused() -> None:
    """Moving a failed rank's circuits to a spare changes the switch: refused, nothing moved;
    after maintenance off the same failover goes through."""
    c = PhaseCoordinator(rail_fabric("t", 4, 2, delay_s=0.01, spares=1), default_timeout_s=5.0)
    c.register_job("job", "tenant", [RankPlacement(r, f"host{r // 2}", r % 2)
                                     for r in range(8)])
    _switched(c, RING, WORLD, 0.0)
    spare = next(h for h in c.fabric.hosts.values() if h.spare).name
    ring = c.confirmed("ocs-rail0")
    c.set_maintenance("ocs-rail0", "swap", 1.0)
    with pytest.raises(FailoverError, match=r"'ocs-rail0' is in maintenance \(swap\)"):
        c.replace_rank("job", 0, spare, 0, 1.1)
    assert c.confirmed("ocs-rail0") == ring
    assert c.job("job").placements[0] == RankPlacement(0, "host0", 0)
    c.set_maintenance("ocs-rail0", None, 1.2)
    assert any(isinstance(d, Rewire) for d in c.replace_rank("job", 0, spare, 0, 1.3))


def test_unknown_switch_is_refused_naming_it(coord: PhaseCoordinator) -> None:
    with pytest.raises(ValueError, match="switch_id: unknown switch 'nope'"):
        coord.set_maintenance("nope", "x", 0.0)
    assert coord.maintenance() == {}
