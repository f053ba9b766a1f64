"""The controller's /metrics on a real scrape (HTTP, Prometheus text format) against a controller
on real etcd: a job's series while it is registered and none after it unregisters, device
reachability following a switch that stops and starts answering, and the daemon-wide series
(build, leader transitions, etcd request latency, reconfiguration delays)."""

from __future__ import annotations

import asyncio
import time
import urllib.request
from collections.abc import AsyncIterator, Callable

import pytest
import pytest_asyncio
from prometheus_client.parser import text_string_to_metric_families

from lightrail.agents.client import ControllerClient
from lightrail.agents.errors import PhaseError
from lightrail.controller.app import RunningController
from lightrail.controller.domain.errors import ErrorCode
from lightrail.controller.domain.model import Collective, PhaseKey, ProcessGroup, RankPlacement
from lightrail.emulator.ocs import EmulatedFabricDevices

PLACE = [RankPlacement(r, f"host{r // 2}", r % 2) for r in range(8)]
RING = PhaseKey(ProcessGroup.of(range(8)), Collective.ALL_REDUCE)
PAIR = PhaseKey(ProcessGroup.of([0, 2]), Collective.SEND_RECV)  # host0 <-> host1 on rail 0

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@pytest_asyncio.fixture
async def client(ctl: RunningController) -> AsyncIterator[ControllerClient]:
    async with ControllerClient(ctl.grpc_target, retry_budget_s=2.0) as c:
        yield c


async def scrape(ctl: RunningController) -> Samples:
    body = await asyncio.to_thread(
        lambda: urllib.request.urlopen(ctl.metrics_url, timeout=5).read().decode())
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(body) for s in fam.samples}


def names_for_job(samples: Samples, job_id: str) -> set[str]:
    return {name for name, labels in samples if ("job_id", job_id) in labels}


async def scrape_until(ctl: RunningController, what: str, check: Callable[[Samples], bool],
                       timeout_s: float = 10.0) -> Samples:
    deadline = time.monotonic() + timeout_s
    while True:
        samples = await scrape(ctl)
        if check(samples):
            return samples
        if time.monotonic() > deadline:
            raise AssertionError(f"no scrape within {timeout_s:g} s showed {what}")
        await asyncio.sleep(0.05)


async def test_a_jobs_series_go_when_it_unregisters(
    ctl: RunningController, client: ControllerClient
) -> None:
    # two jobs of 4 ranks each: a on host0 and host1, b on host2 and host3
    group = ProcessGroup.of(range(4))
    ring = PhaseKey(group, Collective.ALL_REDUCE)
    await client.register_job("series-a", PLACE[:4])
    await client.register_job("series-b", [RankPlacement(r, f"host{2 + r // 2}", r % 2)
                                           for r in range(4)])
    for job in ("series-a", "series-b"):
        await asyncio.gather(*(client.enter(job, r, ring, timeout_s=5.0) for r in range(4)))
    for r in range(4):
        await client.release_phase("series-a", r, ring)
    await asyncio.gather(*(client.enter("series-a", r, PAIR, timeout_s=5.0) for r in (0, 2)))
    with pytest.raises(PhaseError):  # a phase error: one more job-labelled series
        await client.enter("series-a", 7, ring, timeout_s=5.0)
    before = await scrape(ctl)
    assert {"lightrail_phase_admissions_total", "lightrail_phase_admission_seconds_bucket",
            "lightrail_phase_admission_seconds_count", "lightrail_stall_seconds_total",
            "lightrail_provisioning_phases_total", "lightrail_phase_errors_total",
            } <= names_for_job(before, "series-a")
    assert names_for_job(before, "series-b")
    await client.unregister_job("series-a")
    after = await scrape(ctl)
    assert names_for_job(after, "series-a") == set()
    assert names_for_job(after, "series-b") == names_for_job(before, "series-b")
    # a job registered again under the same id starts from nothing
    await client.register_job("series-a", PLACE[:4])
    again = await scrape(ctl)
    assert names_for_job(again, "series-a") == set()


async def test_reachability_follows_a_switch_that_stops_answering(
    ctl: RunningController, client: ControllerClient, devices: EmulatedFabricDevices
) -> None:
    def reachable(samples: Samples, switch: str) -> float:
        return samples[("lightrail_switch_up", (("switch", switch),))]

    samples = await scrape(ctl)
    assert reachable(samples, "ocs-rail0") == reachable(samples, "ocs-rail1") == 1.0
    await client.register_job("job", PLACE)
    devices["ocs-rail0"].set_unreachable(True)
    peer = asyncio.ensure_future(client.enter("job", 2, PAIR, timeout_s=5.0))
    with pytest.raises(PhaseError) as info:
        await client.enter("job", 0, PAIR, timeout_s=5.0)
    with pytest.raises(PhaseError):
        await peer
    assert info.value.code is ErrorCode.DEVICE_FAILURE
    samples = await scrape(ctl)
    assert reachable(samples, "ocs-rail0") == 0.0
    assert reachable(samples, "ocs-rail1") == 1.0
    assert samples[("lightrail_device_errors_total",
                    (("error", "DeviceUnreachable"), ("switch", "ocs-rail0")))] >= 1
    devices["ocs-rail0"].set_unreachable(False)
    # the controller reads the switch back with backoff until it answers
    await scrape_until(ctl, "ocs-rail0 reachable again",
                       lambda s: reachable(s, "ocs-rail0") == 1.0)


async def test_the_daemon_wide_series(ctl: RunningController) -> None:
    samples = await scrape(ctl)
    [build] = [labels for name, labels in samples if name == "lightrail_build_info"]
    assert {k for k, _ in build} == {"version", "python", "grpc"}
    assert samples[("lightrail_leader_transitions_total", (("to", "leader"),))] >= 1
    # the campaign's transaction and the inventory's put went through the timed store
    assert samples[("lightrail_etcd_request_seconds_count", (("method", "txn"),))] >= 1
    assert samples[("lightrail_etcd_request_seconds_count", (("method", "put"),))] >= 1
    assert samples[("lightrail_reconfiguration_delay_seconds",
                    (("switch", "ocs-rail0"),))] == pytest.approx(0.002)
