"""OperatorService answers from the coordinator and the failover manager (called directly,
without a server: the gRPC round trip is covered by the integration tests)."""

from __future__ import annotations

from lightrail.controller.api.operator_service import OperatorServicer
from lightrail.controller.core.coordinator import PhaseCoordinator
from lightrail.controller.domain.fabric import rail_fabric
from lightrail.controller.runtime.events import EventBus
from lightrail.controller.runtime.failover import FailoverManager
from lightrail.controller.runtime.phase_service import PhaseService
from lightrail.controller.store.jobs import JobRecord
from lightrail.drivers.base import CrossConnect
from lightrail.v1 import operator_pb2


class Outcome:
    device_s = 0.0


class NoDevices:
    """A reconciler no test here reaches (nothing is switched)."""

    async def reconcile(
        self, switch_id: str, ports: frozenset[int], target: frozenset[CrossConnect],
        *, inline: bool = False,
    ) -> Outcome:
        raise AssertionError("no reconfiguration expected")

    async def read_back(self, switch_id: str) -> frozenset[CrossConnect]:
        return frozenset()

    def invalidate(self, switch_id: str) -> None:
        """Nothing cached here."""


class NoJobs:
    async def save(self, record: JobRecord) -> None:
        raise AssertionError("no job expected")

    async def delete(self, job_id: str) -> None:
        raise AssertionError("no job expected")

    async def load_all(self) -> list[JobRecord]:
        return []


async def test_list_gpus_gives_a_heartbeat_age_only_for_hosts_that_sent_one() -> None:
    fabric = rail_fabric("t", 2, 1, delay_s=0.0)
    service = PhaseService(PhaseCoordinator(fabric), NoDevices(), EventBus())
    now = [100.0]
    failover = FailoverManager(service, NoJobs(), EventBus(), clock=lambda: now[0])
    failover.heartbeat("host1")
    now[0] = 102.5
    servicer = OperatorServicer(fabric, service, "r1", lambda: True, failover)
    resp = await servicer.ListGpus(operator_pb2.ListGpusRequest(), None)  # type: ignore[arg-type]
    by_host = {g.host: g for g in resp.gpus}
    assert by_host["host1"].HasField("heartbeat_age_s")
    assert by_host["host1"].heartbeat_age_s == 2.5
    assert not by_host["host0"].HasField("heartbeat_age_s")  # never heard of: absent, not -1
