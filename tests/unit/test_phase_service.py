"""The async shell around the coordinator: reply routing and cancellation (with an in-memory
reconciler; the real one is covered by the integration tests)."""

from __future__ import annotations

import asyncio

from lightrail.controller.core.coordinator import PhaseCoordinator
from lightrail.controller.core.decisions import Admit, Reject
from lightrail.controller.domain.errors import ErrorCode
from lightrail.controller.domain.fabric import rail_fabric
from lightrail.controller.domain.model import Collective, PhaseKey, ProcessGroup, RankPlacement
from lightrail.controller.runtime.events import EventBus
from lightrail.controller.runtime.phase_service import PerRankSink, PhaseService
from lightrail.drivers.base import CrossConnect

P = PhaseKey(ProcessGroup.of([0, 2]), Collective.ALL_REDUCE)
Q = PhaseKey(ProcessGroup.of([0, 4]), Collective.ALL_REDUCE)


class Sink(PerRankSink):
    def __init__(self) -> None:
        self.got: list[Admit | Reject] = []
        self.event = asyncio.Event()

    def deliver(self, decision: Admit | Reject) -> None:
        self.got.append(decision)
        self.event.set()


class Outcome:
    device_s = 0.0


class GatedReconciler:
    """Confirms a reconfiguration only when the test opens the gate."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.started = asyncio.Event()

    async def reconcile(
        self, switch_id: str, ports: frozenset[int], target: frozenset[CrossConnect],
        *, inline: bool = False,
    ) -> Outcome:
        self.started.set()
        await self.gate.wait()
        return Outcome()

    async def read_back(self, switch_id: str) -> frozenset[CrossConnect]:
        return frozenset()

    def invalidate(self, switch_id: str) -> None:
        """Nothing cached here."""


def coordinator() -> PhaseCoordinator:
    c = PhaseCoordinator(rail_fabric("t", 4, 2, delay_s=0.0))
    c.register_job("job", "t", [RankPlacement(r, f"host{r // 2}", r % 2) for r in range(8)])
    return c


async def test_refused_duplicate_does_not_steal_the_pending_reply_route() -> None:
    """Review finding: a RANK_BUSY refusal used to pop the route of the rank's pending
    request, so its admission was never delivered."""
    coord, rec = coordinator(), GatedReconciler()
    svc = PhaseService(coord, rec, EventBus())
    first, second, peer = Sink(), Sink(), Sink()
    async with asyncio.TaskGroup() as tg:
        svc.start(tg)
        svc.enter("job", 0, P, 1, 5.0, first)
        svc.enter("job", 2, P, 3, 5.0, peer)
        svc.enter("job", 0, Q, 2, 5.0, second)
        assert [d.code for d in second.got if isinstance(d, Reject)] == [ErrorCode.RANK_BUSY]
        await asyncio.wait_for(rec.started.wait(), 5)
        rec.gate.set()
        await asyncio.wait_for(first.event.wait(), 5)
        assert [(d.rank, d.request_id) for d in first.got if isinstance(d, Admit)] == [(0, 1)]
        await svc.drain(5)


async def test_cancel_withdraws_the_wait() -> None:
    coord, rec = coordinator(), GatedReconciler()
    svc = PhaseService(coord, rec, EventBus())
    sink, peer = Sink(), Sink()
    async with asyncio.TaskGroup() as tg:
        svc.start(tg)
        svc.enter("job", 0, P, 1, 5.0, sink)
        svc.enter("job", 2, P, 2, 5.0, peer)
        await asyncio.wait_for(rec.started.wait(), 5)
        svc.cancel("job", 0, 1)  # the RPC was cancelled while the switch ran
        rec.gate.set()
        await svc.drain(5)
    assert sink.got == []
    assert coord.held_by_job("job") == 1  # only its peer: no ghost, rank 0 may enter again
    retry = Sink()
    svc2 = PhaseService(coord, rec, EventBus())
    async with asyncio.TaskGroup() as tg:
        svc2.start(tg)
        svc2.enter("job", 0, P, 2, 5.0, retry)
        await asyncio.wait_for(retry.event.wait(), 5)
        await svc2.drain(5)
    assert [d.noop for d in retry.got if isinstance(d, Admit)] == [True]


class NoStepsCallback(PhaseCoordinator):
    """A coordinator the shell must not ask for a step count: ``Admit`` carries it."""

    def steps(self, job_id: str, phase: PhaseKey) -> int:
        raise AssertionError("the shell called back into the coordinator for the step count")


async def test_admissions_reach_the_sinks_with_their_step_count_without_a_callback() -> None:
    coord = NoStepsCallback(rail_fabric("t", 4, 2, delay_s=0.0))
    coord.register_job("job", "t", [RankPlacement(r, f"host{r // 2}", r % 2) for r in range(8)])
    rec = GatedReconciler()
    rec.gate.set()
    svc = PhaseService(coord, rec, EventBus())
    a2a = PhaseKey(ProcessGroup.of([0, 2, 4, 6]), Collective.ALL_TO_ALL)  # 4 hosts: 3 shifts
    sinks = {r: Sink() for r in a2a.group.ranks}
    async with asyncio.TaskGroup() as tg:
        svc.start(tg)
        for r, sink in sinks.items():
            svc.enter("job", r, a2a, r, 5.0, sink)
        for sink in sinks.values():
            await asyncio.wait_for(sink.event.wait(), 5)
        await svc.drain(5)
    got = [(d.rank, d.noop, d.steps) for s in sinks.values() for d in s.got
           if isinstance(d, Admit)]
    assert got == [(0, False, 3), (2, False, 3), (4, False, 3), (6, False, 3)]
