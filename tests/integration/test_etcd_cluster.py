"""The store and the controller against a real 3-member etcd cluster over TLS with client
certificates (``tests/etcd_cluster.py``): every endpoint used, failover when the member a client
talks to is killed, clear errors for a client the cluster refuses.

Deterministic: every wait is on a watch batch or a call, bounded by a timeout; the one thing
shown NOT to happen (a kept-alive lease expiring across a failover) is checked after its TTL has
passed since the first failover.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator

import pytest
import pytest_asyncio

from lightrail.agents.client import ControllerClient
from lightrail.controller.cli.embedded import embedded_config, running_controller
from lightrail.controller.config import EtcdSection, EtcdTlsSection, FabricSection
from lightrail.controller.domain.model import Collective, PhaseKey, ProcessGroup, RankPlacement
from lightrail.controller.store.client import TlsFiles
from lightrail.controller.store.errors import StoreUnavailable
from lightrail.controller.store.etcd import EtcdStore
from lightrail.controller.store.types import EventKind, WatchBatch, WatchEvent, WatchEvents
from lightrail.emulator.ocs import EmulatedFabricDevices
from tests.conftest import _etcd_binary_or_skip
from tests.etcd_cluster import EtcdCluster, make_ca

pytestmark = pytest.mark.etcd

WAIT_S = 10.0  # bound on any wait for something that must happen
TTL_S = 2
# A lease kept alive across member failovers: etcd needs an election (timeout 500 ms here) and,
# on a loaded 2-core CI runner, seconds of slow fsyncs before the new leader answers a
# keep-alive; one CI run lost a 2 s lease that way. The controller's default TTL is 10 s.
FAILOVER_TTL_S = 6


@pytest_asyncio.fixture
async def cluster() -> AsyncIterator[EtcdCluster]:
    """Three etcd members on loopback, clients over TLS with a client certificate."""
    _etcd_binary_or_skip()
    async with EtcdCluster(members=3, tls=True) as c:
        yield c


def tls_store(cluster: EtcdCluster, *, timeout_s: float = 5.0) -> EtcdStore:
    return EtcdStore.connect(
        cluster.endpoints, tls=cluster.client_tls, prefix="/lightrail-test/v1", timeout_s=timeout_s
    )


async def next_events(watch: AsyncGenerator[WatchBatch, None], count: int) -> list[WatchEvent]:
    events: list[WatchEvent] = []
    while len(events) < count:
        batch = await asyncio.wait_for(anext(watch), WAIT_S)
        assert isinstance(batch, WatchEvents), batch
        events.extend(batch.events)
    assert len(events) == count, events
    return events


async def test_store_over_tls_on_three_members(cluster: EtcdCluster) -> None:
    async with tls_store(cluster) as store:
        watch = store.watch_prefix("jobs/", await store.current_revision() + 1)
        rev = await store.put_json("jobs/a", {"ranks": 8})
        assert await store.put_if_absent("jobs/b", 1) is True
        assert await store.put_if_absent("jobs/b", 2) is False
        assert await store.compare_and_swap("jobs/b", 3, expected_mod_revision=rev) is False
        kv = await store.get("jobs/b")
        assert kv is not None and kv.value == 1
        assert await store.compare_and_swap("jobs/b", 3, expected_mod_revision=kv.mod_revision)
        lease = await store.grant_lease(TTL_S)
        await store.put_json("jobs/c", "leased", lease=lease)
        await store.revoke(lease)  # etcd deletes the key before answering
        events = await next_events(watch, 5)
        assert [(e.kind, e.key, e.value) for e in events] == [
            (EventKind.PUT, "jobs/a", {"ranks": 8}),
            (EventKind.PUT, "jobs/b", 1),
            (EventKind.PUT, "jobs/b", 3),
            (EventKind.PUT, "jobs/c", "leased"),
            (EventKind.DELETE, "jobs/c", None),
        ]
        assert dict((await store.get_prefix_json("jobs/")).items) == {
            "jobs/a": {"ranks": 8}, "jobs/b": 3}
        await watch.aclose()
    # Every member serves the same data (each endpoint alone, over TLS).
    for endpoint in cluster.endpoints:
        async with EtcdStore.connect(
            endpoint, tls=cluster.client_tls, prefix="/lightrail-test/v1"
        ) as one:
            assert await one.get_json("jobs/b") == 3


async def test_store_keeps_working_when_its_member_is_killed(cluster: EtcdCluster) -> None:
    async with tls_store(cluster) as store:
        watch = store.watch_prefix("k/", await store.current_revision() + 1)
        lease = await store.grant_lease(FAILOVER_TTL_S)
        await store.put_json("k/leased", 0, lease=lease)
        await store.put_json("k/1", 1)
        assert [e.key for e in await next_events(watch, 2)] == ["k/leased", "k/1"]

        first = cluster.index_of(store.current_endpoint)
        first_killed_at = asyncio.get_running_loop().time()
        await cluster.kill(first)
        # Calls go to another member: a put (resent there), a read, a transaction.
        await store.put_json("k/2", 2)
        assert store.current_endpoint != cluster.endpoints[first]
        assert await store.get_json("k/1") == 1
        assert await store.put_if_absent("k/3", 3) is True
        # The watch resumes on another member from the revision after its last event.
        events = await next_events(watch, 2)
        assert [(e.key, e.value) for e in events] == [("k/2", 2), ("k/3", 3)]

        # The member comes back; the one the store now uses is killed: still working.
        await cluster.restart(first)
        second = cluster.index_of(store.current_endpoint)
        await cluster.kill(second)
        await store.put_json("k/4", 4)
        assert [e.key for e in await next_events(watch, 1)] == ["k/4"]

        # The lease was kept alive across both failovers: its TTL has passed since the first.
        loop = asyncio.get_running_loop()
        await asyncio.sleep(max(0.0, first_killed_at + FAILOVER_TTL_S + 0.5 - loop.time()))
        assert not lease.lost.is_set()
        assert await store.get_json("k/leased") == 0
        await watch.aclose()


async def test_a_client_the_cluster_refuses_gets_an_error_naming_the_endpoints(
    cluster: EtcdCluster,
) -> None:
    assert cluster.ca is not None and cluster.client is not None
    other_ca = make_ca(cluster.dir, "other-ca")
    cases = {
        "no client certificate": (
            TlsFiles(ca_file=cluster.ca.cert), "no client certificate"),
        "wrong CA": (
            TlsFiles(ca_file=other_ca.cert, cert_file=cluster.client.cert,
                     key_file=cluster.client.key),
            "not signed by etcd.tls.ca_file"),
        "plaintext": (None, "does it require TLS"),
    }
    for case, (tls, hint) in cases.items():
        with pytest.raises(StoreUnavailable) as info:
            async with EtcdStore.connect(cluster.endpoints, tls=tls, timeout_s=0.5):
                pass
        message = str(info.value)
        assert all(endpoint in message for endpoint in cluster.endpoints), (case, message)
        assert hint in message, (case, message)
        assert "\n" not in message, (case, message)


async def test_controller_leads_and_serves_on_the_tls_cluster(cluster: EtcdCluster) -> None:
    assert cluster.ca is not None and cluster.client is not None
    base = embedded_config(
        cluster.endpoints[0],
        FabricSection.model_validate({"builtin": "demo-4x2", "reconfiguration_delay_ms": 2}),
        admission_timeout_s=5.0,
    )
    etcd = EtcdSection(
        endpoints=cluster.endpoints,
        tls=EtcdTlsSection(ca_file=str(cluster.ca.cert), cert_file=str(cluster.client.cert),
                           key_file=str(cluster.client.key)),
        lease_ttl_s=5.0,
    )
    cfg = base.model_copy(update={"etcd": etcd})
    devices = EmulatedFabricDevices()
    place = [RankPlacement(r, f"host{r // 2}", r % 2) for r in range(8)]
    ring = PhaseKey(ProcessGroup.of(range(8)), Collective.ALL_REDUCE)
    async with running_controller(cfg, devices=devices) as rc, \
            ControllerClient(rc.grpc_target, retry_budget_s=5.0) as client:
        assert await client.register_job("job", place) == 8
        await asyncio.gather(*(client.enter("job", r, ring, timeout_s=5.0) for r in range(8)))
        assert len(devices["ocs-rail0"].cross_connects) == 4
        async with EtcdStore.connect(cluster.endpoints, tls=cluster.client_tls) as store:
            leader = await store.get_json("leader")
            assert isinstance(leader, dict) and leader["replica_id"] == "embedded"
            assert "jobs/job" in (await store.get_prefix_json("jobs/")).items
        # The member the controller talks to first dies: it keeps its lease and serves on,
        # storing through the other members.
        await cluster.kill(0)
        for r in range(8):
            await client.release_phase("job", r, ring)
        await client.unregister_job("job")
        assert await client.register_job("job2", place) == 8
        async with EtcdStore.connect(cluster.endpoints[1:], tls=cluster.client_tls) as store:
            assert set((await store.get_prefix_json("jobs/")).items) == {"jobs/job2"}
            leader = await store.get_json("leader")
            assert isinstance(leader, dict) and leader["replica_id"] == "embedded"
