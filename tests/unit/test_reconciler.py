"""The reconciler against emulated switches: minimal diff, no-op without a device command,
per-switch order, switches in parallel, retries, error propagation, read-back verification and
metrics. Time is a manual clock shared by the devices and the reconciler."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager

import pytest

from lightrail.controller.runtime.metrics import REGISTRY
from lightrail.controller.runtime.reconciler import (
    NOOP,
    Reconciler,
    ReconcilerStopped,
    ReconfigurationRecord,
    RetryPolicy,
    UnknownSwitch,
)
from lightrail.drivers.base import (
    CrossConnect,
    DeviceUnreachable,
    Driver,
    HardwareFault,
    InvalidPort,
    SwitchCapabilities,
    SwitchKind,
    VerificationMismatch,
)
from lightrail.emulator.driver import EmulatedDriver
from lightrail.emulator.ocs import (
    ChangeAction,
    ChangeRecord,
    DenialKind,
    EmulatedFabricDevices,
    EmulatedOcs,
)
from tests.manual_time import ManualTime

DELAY_S = 0.025
NXN40 = SwitchCapabilities(
    kind=SwitchKind.NXN, port_count=40, atomic_bulk=True, settle_time_s=DELAY_S
)
DUPLEX8 = SwitchCapabilities(
    kind=SwitchKind.DUPLEX, port_count=8, atomic_bulk=True, settle_time_s=DELAY_S
)
RETRY = RetryPolicy(max_attempts=3, backoff_s=0.05, backoff_max_s=1.0)
_ids = itertools.count()


def xc(ingress: int, egress: int) -> CrossConnect:
    return CrossConnect(ingress, egress)


def unique(name: str) -> str:
    """Switch ids unique across tests: metrics live in one process-wide registry."""
    return f"{name}-{next(_ids)}"


class World:
    """Emulated devices, open drivers and a reconciler on one manual clock."""

    def __init__(
        self,
        t: ManualTime,
        switches: Mapping[str, SwitchCapabilities],
        initial: Mapping[str, frozenset[CrossConnect]] | None = None,
    ) -> None:
        self.t = t
        self.devices = EmulatedFabricDevices(clock=t.clock, sleep=t.sleep)
        for sid, caps in switches.items():
            self.devices.add(
                EmulatedOcs(
                    sid, caps, cross_connects=(initial or {}).get(sid, frozenset()),
                    clock=t.clock, sleep=t.sleep,
                )
            )
        self.records: list[ReconfigurationRecord] = []

    def ocs(self, switch_id: str) -> EmulatedOcs:
        return self.devices[switch_id]

    async def reconciler(self) -> Reconciler:
        drivers: dict[str, Driver] = {}
        for sid in self.devices:
            driver = EmulatedDriver(sid, self.devices)
            await driver.open()
            drivers[sid] = driver
        return Reconciler(
            drivers, retry=RETRY, clock=self.t.clock, sleep=self.t.backoff,
            on_reconfigured=self.records.append,
        )


@asynccontextmanager
async def running(reconciler: Reconciler) -> AsyncIterator[Reconciler]:
    async with asyncio.TaskGroup() as tg:
        reconciler.start(tg)
        try:
            yield reconciler
        finally:
            await reconciler.stop(timeout_s=2.0)


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


# --- minimal diff and no-op ----------------------------------------------------------------------


async def test_minimal_diff_nxn_touches_only_what_changes() -> None:
    sid = unique("ocs")
    t = ManualTime(start_s=100.0)
    w = World(t, {sid: NXN40}, {sid: frozenset({xc(1, 41), xc(3, 43), xc(5, 45)})})
    ports = frozenset({1, 2, 3, 41, 42, 43})  # one job's ports; 5->45 belongs to another
    target = frozenset({xc(1, 42), xc(2, 41), xc(3, 43)})
    async with running(await w.reconciler()) as rec:
        outcome = await rec.reconcile(sid, ports, target)
        assert outcome.removed == {xc(1, 41)}
        assert outcome.added == {xc(1, 42), xc(2, 41)}
        assert not outcome.noop
        assert outcome.device_s == pytest.approx(DELAY_S)
        ocs = w.ocs(sid)
        assert ocs.change_log == [
            ChangeRecord(100.0, sid, ChangeAction.BREAK, xc(1, 41)),
            ChangeRecord(100.0 + DELAY_S, sid, ChangeAction.MAKE, xc(1, 42)),
            ChangeRecord(100.0 + DELAY_S, sid, ChangeAction.MAKE, xc(2, 41)),
        ]
        assert ocs.cross_connects == {xc(1, 42), xc(2, 41), xc(3, 43), xc(5, 45)}
        assert rec.confirmed(sid) == ocs.cross_connects
        # the second run finds everything in place: no device command at all
        commands = ocs.command_count
        again = await rec.reconcile(sid, ports, target)
        assert again is NOOP
        assert ocs.command_count == commands
        assert len(ocs.change_log) == 3


async def test_minimal_diff_duplex() -> None:
    sid = unique("ocs")
    w = World(ManualTime(), {sid: DUPLEX8}, {sid: frozenset({xc(1, 2), xc(3, 4), xc(7, 8)})})
    async with running(await w.reconciler()) as rec:
        outcome = await rec.reconcile(
            sid, frozenset(range(1, 7)), frozenset({xc(1, 2), xc(3, 5), xc(4, 6)})
        )
        assert outcome.removed == {xc(3, 4)}
        assert outcome.added == {xc(3, 5), xc(4, 6)}
        assert w.ocs(sid).cross_connects == {xc(1, 2), xc(3, 5), xc(4, 6), xc(7, 8)}
        assert [(r.action, r.cross_connect) for r in w.ocs(sid).change_log] == [
            (ChangeAction.BREAK, xc(3, 4)),
            (ChangeAction.MAKE, xc(3, 5)),
            (ChangeAction.MAKE, xc(4, 6)),
        ]


async def test_target_outside_ports_is_rejected_before_the_device() -> None:
    sid = unique("ocs")
    w = World(ManualTime(), {sid: NXN40})
    async with running(await w.reconciler()) as rec:
        await rec.read_back(sid)
        commands = w.ocs(sid).command_count
        with pytest.raises(InvalidPort):
            await rec.reconcile(sid, frozenset({1}), frozenset({xc(1, 41)}))
        with pytest.raises(InvalidPort):
            await rec.reconcile(sid, frozenset({99}), frozenset())
        with pytest.raises(UnknownSwitch):
            await rec.reconcile("nope", frozenset(), frozenset())
        assert w.ocs(sid).command_count == commands


# --- ordering and parallelism --------------------------------------------------------------------


async def test_requests_on_one_switch_run_in_submission_order() -> None:
    sid = unique("ocs")
    w = World(ManualTime(), {sid: NXN40})
    ports = frozenset({1, 41, 42})
    async with running(await w.reconciler()) as rec:
        await rec.read_back(sid)
        first = asyncio.create_task(rec.reconcile(sid, ports, frozenset({xc(1, 41)})))
        second = asyncio.create_task(rec.reconcile(sid, ports, frozenset()))
        third = asyncio.create_task(rec.reconcile(sid, ports, frozenset({xc(1, 42)})))
        a, b, c = await asyncio.wait_for(asyncio.gather(first, second, third), timeout=2.0)
    assert a.added == {xc(1, 41)}
    # not answered as a no-op from the view while the first request was still queued
    assert not b.noop and b.removed == {xc(1, 41)}
    assert c.added == {xc(1, 42)}
    assert [(r.action, r.cross_connect) for r in w.ocs(sid).change_log] == [
        (ChangeAction.MAKE, xc(1, 41)),
        (ChangeAction.BREAK, xc(1, 41)),
        (ChangeAction.MAKE, xc(1, 42)),
    ]


async def test_two_switches_reconfigure_in_parallel() -> None:
    sa, sb = unique("ocs"), unique("ocs")
    t = ManualTime(start_s=0.0, auto=False)
    w = World(t, {sa: NXN40, sb: NXN40})
    async with running(await w.reconciler()) as rec:
        await rec.read_back_all()
        ta = asyncio.create_task(rec.reconcile(sa, frozenset({1, 41}), frozenset({xc(1, 41)})))
        tb = asyncio.create_task(rec.reconcile(sb, frozenset({2, 42}), frozenset({xc(2, 42)})))
        await t.wait_sleepers(2)  # both switches settle at the same time
        await t.advance(DELAY_S)
        oa, ob = await asyncio.wait_for(asyncio.gather(ta, tb), timeout=2.0)
    assert oa.device_s == pytest.approx(DELAY_S)
    assert ob.device_s == pytest.approx(DELAY_S)
    assert w.ocs(sa).cross_connects == {xc(1, 41)}
    assert w.ocs(sb).cross_connects == {xc(2, 42)}


# --- faults --------------------------------------------------------------------------------------


async def test_transient_fault_is_retried_then_succeeds() -> None:
    sid = unique("ocs")
    t = ManualTime()
    w = World(t, {sid: NXN40})
    async with running(await w.reconciler()) as rec:
        await rec.read_back(sid)
        errors = sample("lightrail_device_errors_total", switch=sid, error="DeviceUnreachable")
        w.ocs(sid).drop_next_calls(1)
        outcome = await rec.reconcile(sid, frozenset({1, 41}), frozenset({xc(1, 41)}))
    assert outcome.added == {xc(1, 41)}
    assert t.backoffs == [0.05]
    assert w.ocs(sid).cross_connects == {xc(1, 41)}
    after = sample("lightrail_device_errors_total", switch=sid, error="DeviceUnreachable")
    assert after == errors + 1


async def test_partial_apply_is_retried_with_the_remainder() -> None:
    sid = unique("ocs")
    t = ManualTime()
    w = World(t, {sid: NXN40}, {sid: frozenset({xc(1, 41)})})
    ports = frozenset({1, 2, 3, 41, 42, 43})
    target = frozenset({xc(1, 42), xc(2, 43), xc(3, 41)})
    async with running(await w.reconciler()) as rec:
        await rec.read_back(sid)
        w.ocs(sid).fail_make(2)
        outcome = await rec.reconcile(sid, ports, target)
    assert outcome.removed == {xc(1, 41)}
    assert outcome.added == target
    assert t.backoffs == [0.05]
    assert [(r.action, r.cross_connect) for r in w.ocs(sid).change_log] == [
        (ChangeAction.BREAK, xc(1, 41)),
        (ChangeAction.MAKE, xc(1, 42)),  # first attempt: make #2 failed, #3 not attempted
        (ChangeAction.MAKE, xc(2, 43)),  # the retry makes only the remainder
        (ChangeAction.MAKE, xc(3, 41)),
    ]
    assert sample("lightrail_cross_connect_changes_total", switch=sid, change="make") == 3
    assert sample("lightrail_cross_connect_changes_total", switch=sid, change="break") == 1
    assert sample("lightrail_device_errors_total", switch=sid, error="PartialApply") == 1


async def test_one_reconcile_is_one_apply_and_one_read_back() -> None:
    sid = unique("ocs")
    w = World(ManualTime(), {sid: NXN40}, {sid: frozenset({xc(1, 41), xc(2, 42), xc(9, 49)})})
    ports = frozenset({1, 2, 41, 42})
    async with running(await w.reconciler()) as rec:
        await rec.read_back(sid)
        commands = w.ocs(sid).command_count
        outcome = await rec.reconcile(sid, ports, frozenset({xc(1, 42), xc(2, 41)}))
        assert outcome.removed == {xc(1, 41), xc(2, 42)}
        assert w.ocs(sid).command_count == commands + 2  # one bulk apply, one read-back
        assert rec.confirmed(sid) == {xc(1, 42), xc(2, 41), xc(9, 49)}
        assert not rec.needs_read_back(sid)


async def test_cross_connect_made_behind_the_controllers_back_is_read_back_and_broken() -> None:
    sid = unique("ocs")
    t = ManualTime()
    w = World(t, {sid: NXN40})
    async with running(await w.reconciler()) as rec:
        await rec.read_back(sid)
        await w.ocs(sid).apply_bulk((), [xc(2, 41)])  # not through the reconciler: its view
        # still shows port 41 free, so the make is refused; the retry reads the switch first
        outcome = await rec.reconcile(sid, frozenset({1, 2, 41}), frozenset({xc(1, 41)}))
        assert outcome.removed == {xc(2, 41)} and outcome.added == {xc(1, 41)}
        assert t.backoffs == [0.05]
        assert w.ocs(sid).cross_connects == {xc(1, 41)}
        assert rec.confirmed(sid) == {xc(1, 41)}


async def test_invalidated_view_is_read_back_before_the_diff() -> None:
    sid = unique("ocs")
    w = World(ManualTime(), {sid: NXN40})
    ports, target = frozenset({1, 41}), frozenset({xc(1, 41)})
    async with running(await w.reconciler()) as rec:
        await rec.reconcile(sid, ports, target)
        await w.ocs(sid).reboot(keep_cross_connects=False)  # the device lost 1->41
        rec.invalidate(sid)  # what an alarm does (PhaseService.watch_alarms)
        commands = w.ocs(sid).command_count
        outcome = await rec.reconcile(sid, ports, target)
        assert not outcome.noop and outcome.added == target  # made again, not a no-op
        assert w.ocs(sid).command_count == commands + 3  # read-back, apply, read-back
        assert w.ocs(sid).cross_connects == target


async def test_non_retryable_error_propagates_without_retry() -> None:
    sid = unique("ocs")
    t = ManualTime()
    w = World(t, {sid: NXN40}, {sid: frozenset({xc(1, 41)})})
    async with running(await w.reconciler()) as rec:
        await rec.read_back(sid)
        w.ocs(sid).deny_port(42, DenialKind.HARDWARE_FAULT, "port in fault")
        with pytest.raises(HardwareFault, match="port in fault"):
            await rec.reconcile(sid, frozenset({1, 41, 42}), frozenset({xc(1, 42)}))
        assert t.backoffs == []
        assert w.ocs(sid).cross_connects == {xc(1, 41)}
        assert sample("lightrail_device_errors_total", switch=sid, error="HardwareFault") == 1
        assert rec.needs_read_back(sid)
        # the worker survives the error and serves the next request
        w.ocs(sid).allow_port(42)
        outcome = await rec.reconcile(sid, frozenset({1, 41, 42}), frozenset({xc(1, 42)}))
        assert outcome.added == {xc(1, 42)}


async def test_read_back_that_differs_fails_with_verification_mismatch() -> None:
    sid = unique("ocs")
    t = ManualTime()
    w = World(t, {sid: NXN40})
    async with running(await w.reconciler()) as rec:
        await rec.read_back(sid)
        w.ocs(sid).drop_makes_silently(42)  # the device acknowledges 2->42 but never makes it
        with pytest.raises(VerificationMismatch) as info:
            await rec.reconcile(
                sid, frozenset({1, 2, 41, 42}), frozenset({xc(1, 41), xc(2, 42)})
            )
    assert info.value.missing == (xc(2, 42),)
    assert info.value.unexpected == ()
    assert t.backoffs == [0.05, 0.1]  # three attempts, exponential backoff
    assert (
        sample("lightrail_device_errors_total", switch=sid, error="VerificationMismatch") == 3
    )
    assert w.records == []  # never confirmed


async def test_unreachable_switch_exhausts_retries() -> None:
    sid = unique("ocs")
    t = ManualTime()
    w = World(t, {sid: NXN40})
    async with running(await w.reconciler()) as rec:
        await rec.read_back(sid)
        w.ocs(sid).set_unreachable(True)
        with pytest.raises(DeviceUnreachable):
            await rec.reconcile(sid, frozenset({1, 41}), frozenset({xc(1, 41)}))
    assert len(t.backoffs) == RETRY.max_attempts - 1


# --- metrics, records, lifecycle -----------------------------------------------------------------


async def test_metrics_and_record_of_a_reconfiguration() -> None:
    sid = unique("ocs")
    t = ManualTime(start_s=10.0)
    w = World(t, {sid: NXN40}, {sid: frozenset({xc(1, 41), xc(7, 47)})})
    async with running(await w.reconciler()) as rec:
        await rec.read_back(sid)
        assert sample("lightrail_cross_connects", switch=sid) == 2
        await rec.reconcile(sid, frozenset({1, 2, 41, 42}), frozenset({xc(1, 42), xc(2, 41)}))
        await rec.reconcile(sid, frozenset({1, 2, 41, 42}), frozenset({xc(1, 42), xc(2, 41)}))
    assert sample("lightrail_reconfigurations_total", switch=sid) == 1
    assert sample("lightrail_cross_connect_changes_total", switch=sid, change="make") == 2
    assert sample("lightrail_cross_connect_changes_total", switch=sid, change="break") == 1
    assert sample("lightrail_device_apply_seconds_count", switch=sid) == 1
    assert sample("lightrail_device_apply_seconds_sum", switch=sid) == pytest.approx(DELAY_S)
    assert sample("lightrail_cross_connects", switch=sid) == 3
    assert w.records == [
        ReconfigurationRecord(
            switch=sid,
            removed=frozenset({xc(1, 41)}),
            added=frozenset({xc(1, 42), xc(2, 41)}),
            started_s=10.0,
            confirmed_s=pytest.approx(10.0 + DELAY_S),  # type: ignore[arg-type]
        )
    ]


async def test_read_back_all_and_restart_reconnects_to_the_same_devices() -> None:
    sa, sb = unique("ocs"), unique("ocs")
    w = World(ManualTime(), {sa: NXN40, sb: DUPLEX8}, {sb: frozenset({xc(1, 2)})})
    ports, target = frozenset({1, 41}), frozenset({xc(1, 41)})
    first = await w.reconciler()
    assert await first.read_back_all() == {sa: frozenset(), sb: {xc(1, 2)}}  # before start
    async with running(first) as rec:
        await rec.reconcile(sa, ports, target)
    with pytest.raises(ReconcilerStopped):
        await first.reconcile(sa, ports, target)
    # a restarted controller: new drivers and reconciler, same devices
    async with running(await w.reconciler()) as rec:
        state = await rec.read_back_all()
        assert state == {sa: target, sb: {xc(1, 2)}}
        commands = w.ocs(sa).command_count
        assert await rec.reconcile(sa, ports, target) is NOOP
        assert w.ocs(sa).command_count == commands


async def test_read_back_all_reports_every_failed_switch() -> None:
    sa, sb = unique("ocs"), unique("ocs")
    w = World(ManualTime(), {sa: NXN40, sb: NXN40})
    async with running(await w.reconciler()) as rec:
        w.ocs(sa).set_unreachable(True)
        with pytest.raises(ExceptionGroup) as info:
            await rec.read_back_all()
        assert [type(e) for e in info.value.exceptions] == [DeviceUnreachable]
        assert not rec.needs_read_back(sb)
        assert rec.needs_read_back(sa)


async def test_stop_finishes_queued_requests_and_rejects_new_ones() -> None:
    sid = unique("ocs")
    t = ManualTime(start_s=0.0, auto=False)
    w = World(t, {sid: NXN40})
    rec = await w.reconciler()
    async with asyncio.TaskGroup() as tg:
        rec.start(tg)
        await rec.read_back(sid)
        task = asyncio.create_task(rec.reconcile(sid, frozenset({1, 41}), frozenset({xc(1, 41)})))
        await t.wait_sleepers(1)  # the request is in flight (settling)
        stopping = asyncio.create_task(rec.stop(timeout_s=2.0))
        await t.advance(DELAY_S)
        outcome = await asyncio.wait_for(task, timeout=2.0)
        await asyncio.wait_for(stopping, timeout=2.0)
        with pytest.raises(ReconcilerStopped):
            await rec.reconcile(sid, frozenset({2, 42}), frozenset({xc(2, 42)}))
    assert outcome.added == {xc(1, 41)}
    assert w.ocs(sid).cross_connects == {xc(1, 41)}


async def test_caller_timeout_leaves_the_worker_consistent() -> None:
    sid = unique("ocs")
    t = ManualTime(start_s=0.0, auto=False)
    w = World(t, {sid: NXN40})
    async with running(await w.reconciler()) as rec:
        await rec.read_back(sid)
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.05):
                await rec.reconcile(sid, frozenset({1, 41}), frozenset({xc(1, 41)}))
        # the device command already issued completes; the next request sees its result
        await t.wait_sleepers(1)
        nxt = asyncio.create_task(rec.reconcile(sid, frozenset({1, 41}), frozenset({xc(1, 41)})))
        await t.advance(DELAY_S)
        outcome = await asyncio.wait_for(nxt, timeout=2.0)
    assert outcome.noop
    assert w.ocs(sid).cross_connects == {xc(1, 41)}


async def test_device_without_readback_trusts_the_apply_result() -> None:
    sid = unique("ocs")
    caps = SwitchCapabilities(
        kind=SwitchKind.NXN, port_count=4, atomic_bulk=True, settle_time_s=DELAY_S,
        readback=False,
    )
    w = World(ManualTime(), {sid: caps})
    async with running(await w.reconciler()) as rec:
        await rec.read_back(sid)
        commands = w.ocs(sid).command_count
        outcome = await rec.reconcile(sid, frozenset({1, 5}), frozenset({xc(1, 5)}))
        assert outcome.added == {xc(1, 5)}
        assert w.ocs(sid).command_count == commands + 1  # the apply, no read-back
        assert rec.confirmed(sid) == {xc(1, 5)}


async def test_an_inline_request_never_overtakes_a_queued_one() -> None:
    """Review finding: once the worker had taken a queued request off its queue and waited
    for an inline one to end, a hot-path task that found the worker idle in that moment ran
    inline before it."""
    sid = unique("ocs")
    t = ManualTime(start_s=0.0, auto=False)
    w = World(t, {sid: NXN40})
    async with running(await w.reconciler()) as rec:
        await rec.read_back(sid)
        first = asyncio.create_task(
            rec.reconcile(sid, frozenset({1, 41}), frozenset({xc(1, 41)}), inline=True))
        await t.wait_sleepers(1)  # the inline apply is settling
        queued = asyncio.create_task(rec.read_back(sid))  # submitted second: must run second
        worker = rec._workers[sid]  # the reconciler exposes no "busy": watch it directly

        async def hot_path() -> object:
            # spins on purpose: it must be runnable the very moment ``first`` ends
            while not first.done() and worker.busy:  # noqa: ASYNC110
                await asyncio.sleep(0)
            return await rec.reconcile(sid, frozenset({2, 42}), frozenset({xc(2, 42)}),
                                       inline=True)

        third = asyncio.create_task(hot_path())
        await asyncio.sleep(0)
        await t.advance(DELAY_S)
        assert await asyncio.wait_for(queued, 2.0) == frozenset({xc(1, 41)})  # not xc(2, 42)
        await t.wait_sleepers(1)
        await t.advance(DELAY_S)
        await asyncio.wait_for(asyncio.gather(first, third), 2.0)
    assert w.ocs(sid).cross_connects == {xc(1, 41), xc(2, 42)}
