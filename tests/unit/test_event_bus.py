"""EventBus: per-job subscriptions, the all-events subscription and overflow."""

from __future__ import annotations

import asyncio

import pytest

from lightrail.controller.domain.events import (
    FabricEvent,
    FabricEventKind,
    JobEvent,
    JobEventKind,
)
from lightrail.controller.runtime.events import EventBus, SubscriberOverflow


async def _take(it: object, n: int) -> list[object]:
    out: list[object] = []
    async for item in it:  # type: ignore[attr-defined]
        out.append(item)
        if len(out) == n:
            break
    return out


def test_subscribe_all_gets_job_and_fabric_events_in_order() -> None:
    async def main() -> None:
        bus = EventBus()
        assert not bus.wants("j1")
        everything = bus.subscribe_all()
        task = asyncio.ensure_future(_take(everything, 3))
        await asyncio.sleep(0)
        assert bus.wants("j1")
        e1 = JobEvent("j1", JobEventKind.RECONFIGURED, "r")
        e2 = FabricEvent(FabricEventKind.DEVICE_ALARM, "LOS", switch_id="ocs-0")
        e3 = JobEvent("j2", JobEventKind.PHASE_ERROR, "e")
        bus.publish(e1)
        bus.publish_fabric(e2)
        bus.publish(e3)
        assert await asyncio.wait_for(task, 5) == [e1, e2, e3]
        await everything.aclose()
        assert not bus.wants("j1")

    asyncio.run(main())


def test_job_subscriber_sees_no_fabric_events() -> None:
    async def main() -> None:
        bus = EventBus()
        sub = bus.subscribe("j1")
        task = asyncio.ensure_future(_take(sub, 1))
        await asyncio.sleep(0)
        bus.publish_fabric(FabricEvent(FabricEventKind.LEADERSHIP, "leading"))
        e = JobEvent("j1", JobEventKind.REGISTERED, "hi")
        bus.publish(e)
        assert await asyncio.wait_for(task, 5) == [e]

    asyncio.run(main())


def test_slow_all_subscriber_is_dropped_with_overflow() -> None:
    async def main() -> None:
        bus = EventBus(max_backlog=2)
        everything = bus.subscribe_all()
        first = asyncio.ensure_future(everything.__anext__())
        await asyncio.sleep(0)
        for i in range(4):
            bus.publish_fabric(FabricEvent(FabricEventKind.CONFIG_RELOAD, f"r{i}"))
        got = await asyncio.wait_for(first, 5)
        assert isinstance(got, FabricEvent) and got.message == "r0"
        with pytest.raises(SubscriberOverflow):
            while True:
                await asyncio.wait_for(everything.__anext__(), 5)
        assert not bus.wants("any")

    asyncio.run(main())


def test_a_history_only_subscriber_does_not_ask_for_per_phase_events() -> None:
    async def main() -> None:
        bus = EventBus()
        history = bus.subscribe_all(demand=False)
        task = asyncio.ensure_future(_take(history, 1))
        await asyncio.sleep(0)
        assert not bus.wants("j1") and bus.listens("j1")  # phase errors still reach it
        bus.hold_demand()  # e.g. the MQTT bridge subscribed to the journal
        assert bus.wants("j1")
        bus.release_demand()
        assert not bus.wants("j1")
        e = FabricEvent(FabricEventKind.SWITCH_STATE, "ocs-0 unreachable", switch_id="ocs-0")
        bus.publish_fabric(e)
        assert await asyncio.wait_for(task, 5) == [e]
        await history.aclose()
        assert not bus.listens("j1")

    asyncio.run(main())
