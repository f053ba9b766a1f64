"""Fault injection on TL1-driven rails served by their own process (``lightrail emulate``),
faults injected through its control API: whatever the devices do (partial apply, a lying
device, a denied port, a slow device), no rank is admitted onto circuits the device did not
confirm."""

from __future__ import annotations

import asyncio
import time

import pytest

from lightrail.agents.client import ControllerClient
from lightrail.agents.errors import PhaseError
from lightrail.agents.replay.replayer import HoldRecord
from lightrail.controller.cli.embedded import embedded_config, running_controller, spawn_emulator
from lightrail.controller.config import build_fabric
from lightrail.controller.domain.errors import ErrorCode
from lightrail.controller.domain.model import Collective, PhaseKey, ProcessGroup, RankPlacement
from lightrail.controller.store.etcd_server import EmbeddedEtcd
from lightrail.drivers.base import CrossConnect
from lightrail.emulator.control import ControlClient
from lightrail.emulator.servers.fabric import rail_section
from tests.invariants import check_holds

PLACE = [RankPlacement(r, f"host{r // 2}", r % 2) for r in range(8)]
RING = PhaseKey(ProcessGroup.of(range(8)), Collective.ALL_REDUCE)
N = 4

# fault -> (control API body, persistent): a one-off partial apply is retried by the
# reconciler; a lying device and a denied port fail every attempt
FAULTS: dict[str, tuple[dict[str, object], bool]] = {
    "partial apply": ({"fault": "partial_apply", "nth": 2}, False),
    "lying device": ({"fault": "silent_makes", "port": 1}, True),
    "denied port": ({"fault": "deny_port", "port": 2}, True),
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
async def test_no_admission_onto_unconfirmed_circuits(etcd: EmbeddedEtcd, fault: str) -> None:
    section = rail_section("demo-4x2", delay_ms=1)
    fabric = build_fabric(section)
    holds: list[HoldRecord] = []
    async with spawn_emulator(section) as emulator, ControlClient(
            emulator.control_url) as control, running_controller(
            embedded_config(etcd.endpoint, emulator.section, admission_timeout_s=20)
    ) as rc, ControllerClient(rc.grpc_target) as client:
        await client.register_job("job", PLACE)
        body, persistent = FAULTS[fault]
        await control.inject("ocs-rail0", body)

        async def enter(rank: int, iteration: int) -> float | PhaseError:
            try:
                await client.enter("job", rank, RING, iteration, timeout_s=20)
            except PhaseError as exc:
                return exc
            return time.monotonic()

        first = await asyncio.gather(*(enter(r, 0) for r in range(8)))
        errors = [x for x in first if isinstance(x, PhaseError)]
        assert bool(errors) == persistent, (fault, errors)
        assert all(e.code is ErrorCode.DEVICE_FAILURE for e in errors)
        for r, x in enumerate(first):  # ranks admitted meanwhile (rail 1 only) release
            if not isinstance(x, PhaseError):
                holds.append(HoldRecord(r, RING, x, time.monotonic()))
                await client.release_phase("job", r, RING, 0)
        await control.clear("ocs-rail0")
        # the job retries: now every rank gets the ring, confirmed by both switches
        second = await asyncio.gather(*(enter(r, 1) for r in range(8)))
        assert not [x for x in second if isinstance(x, PhaseError)]
        for r, x in enumerate(second):
            assert isinstance(x, float)
            holds.append(HoldRecord(r, RING, x, time.monotonic()))
        state = (await control.device("ocs-rail0")).cross_connects
        logs = await control.change_logs()
    assert state == frozenset(CrossConnect(i + 1, N + (i + 1) % 4 + 1) for i in range(4))
    violations = check_holds(fabric, PLACE, holds, logs)
    assert violations == [], violations[:5]


async def test_slow_device_delays_admission_but_never_skips_confirmation(
    etcd: EmbeddedEtcd,
) -> None:
    section = rail_section("demo-4x2", delay_ms=1)
    fabric = build_fabric(section)
    async with spawn_emulator(section) as emulator, ControlClient(
            emulator.control_url) as control, running_controller(
            embedded_config(etcd.endpoint, emulator.section, admission_timeout_s=20)
    ) as rc, ControllerClient(rc.grpc_target) as client:
        await client.register_job("job", PLACE)
        await control.set_slow("ocs-rail1", 0.05)
        admitted = await asyncio.gather(*(client.enter("job", r, RING, timeout_s=20)
                                          for r in range(8)))
        at = time.monotonic()
        logs = await control.change_logs()
    assert any(not a.noop for a in admitted)
    holds = [HoldRecord(r, RING, at, at + 1.0) for r in range(8)]
    assert check_holds(fabric, PLACE, holds, logs) == []
