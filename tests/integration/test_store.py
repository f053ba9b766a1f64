"""EtcdStore, LeaderElection and CoalescingWriter against a real etcd (tests/conftest.py).

Deterministic: every wait is on an event, a watch batch or a task, bounded by a timeout; where a
test must show that something does NOT happen for a while (a lease outliving its TTL, a follower
not taking over), it waits for the event with a timeout and expects the timeout.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import AsyncGenerator
from pathlib import Path

import grpc
import pytest

from lightrail.controller.domain.timing import Backoff
from lightrail.controller.store.client import EtcdClient, translated
from lightrail.controller.store.election import LeaderElection
from lightrail.controller.store.errors import (
    CorruptValue,
    FlushFailed,
    StoreRequestFailed,
    StoreUnavailable,
    UnsupportedSchema,
)
from lightrail.controller.store.etcd import EtcdStore
from lightrail.controller.store.etcd_server import (
    EmbeddedEtcd,
    EtcdNotInstalledError,
    EtcdStartError,
)
from lightrail.controller.store.types import (
    EventKind,
    Snapshot,
    WatchBatch,
    WatchEvent,
    WatchEvents,
)
from lightrail.controller.store.writer import CoalescingWriter
from lightrail.etcdapi import rpc_pb2
from tests.integration.conftest import StoreFactory

TTL_S = 2  # etcd's minimum lease TTL with default timing
WAIT_S = 5.0  # bound on any wait for something that must happen


async def next_batch(watch: AsyncGenerator[WatchBatch, None]) -> WatchBatch:
    return await asyncio.wait_for(anext(watch), WAIT_S)


async def next_events(watch: AsyncGenerator[WatchBatch, None], count: int) -> list[WatchEvent]:
    """The next ``count`` events (fails on a snapshot or after WAIT_S per batch)."""
    events: list[WatchEvent] = []
    while len(events) < count:
        batch = await next_batch(watch)
        assert isinstance(batch, WatchEvents), batch
        events.extend(batch.events)
    assert len(events) == count, events
    return events


async def raw_put(etcd: EmbeddedEtcd, full_key: str, value: bytes) -> None:
    """Write bytes bypassing the store (what a buggy or foreign writer would leave)."""
    client = EtcdClient([etcd.endpoint], timeout_s=WAIT_S)
    try:
        await client.put("raw put", rpc_pb2.PutRequest(key=full_key.encode(), value=value))
    finally:
        await client.close()


def test_grpc_client_side_internal_error_counts_as_unavailable() -> None:
    # grpcio's asyncio client reports a write on a stream whose connection just dropped (etcd
    # stopping) as INTERNAL "Internal error from Core" (grpc/grpc#36066): retryable, whereas an
    # INTERNAL status sent by etcd is not.
    def status(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
        metadata = grpc.aio.Metadata()
        return grpc.aio.AioRpcError(code, metadata, metadata, details, details)

    transport = status(grpc.StatusCode.INTERNAL, "Internal error from Core")
    refused = status(grpc.StatusCode.INTERNAL, "etcdserver: corrupt cluster")
    with pytest.raises(StoreUnavailable), translated("watch"):
        raise transport
    with pytest.raises(StoreRequestFailed), translated("watch"):
        raise refused
    with pytest.raises(StoreUnavailable), translated("put"):
        raise status(grpc.StatusCode.UNAVAILABLE, "connection refused")


def test_missing_binary_names_binary_and_debian_package() -> None:
    with pytest.raises(EtcdNotInstalledError) as info:
        EmbeddedEtcd(binary="etcd-not-installed-here")
    assert "etcd-not-installed-here" in str(info.value)
    assert "etcd-server" in str(info.value)


async def test_a_failed_start_deletes_the_data_dir(tmp_path: Path) -> None:
    # ``async with`` never reaches ``__aexit__`` when entering fails: the start must clean up
    fake = tmp_path / "etcd"
    fake.write_text("#!/bin/sh\necho 'fake etcd: refusing to start' >&2\nexit 3\n")
    fake.chmod(0o755)
    server = EmbeddedEtcd(binary=str(fake), start_timeout_s=10.0)
    with pytest.raises(EtcdStartError, match="exited with code 3") as info:
        async with server:
            pytest.fail("a fake etcd that exits cannot be entered")
    assert "fake etcd: refusing to start" in str(info.value)  # the log tail is in the error
    log = Path(str(info.value).split("log ", 1)[1].split(":\n", 1)[0])
    assert log.name == "etcd.log" and log.parent.name.startswith("lightrail-etcd-")
    assert not log.parent.exists()
    assert not server.running


async def test_a_cancelled_start_deletes_the_data_dir(tmp_path: Path) -> None:
    # as a Ctrl-C while etcd comes up: a fake that never answers, the entering task cancelled
    fake = tmp_path / "etcd"
    fake.write_text("#!/bin/sh\nexec sleep 60\n")
    fake.chmod(0o755)
    server = EmbeddedEtcd(binary=str(fake), start_timeout_s=30.0, stop_timeout_s=5.0)

    async def enter() -> None:
        async with server:
            pytest.fail("a fake etcd that never answers cannot be entered")

    task = asyncio.create_task(enter())
    deadline = time.monotonic() + 10.0
    while server.pid is None:  # the child runs: the data dir exists
        assert time.monotonic() < deadline, "the fake etcd never started"
        await asyncio.sleep(0.01)
    workdir = server.log_path.parent
    assert workdir.exists()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 10.0)
    assert not workdir.exists()
    assert not server.running


@pytest.mark.etcd
async def test_put_get_prefix_round_trip(store: EtcdStore) -> None:
    rev_a = await store.put_json("jobs/job-1", {"ranks": 8, "phases": ["dp", "pp"]})
    await store.put_json("jobs/job-2", {"ranks": 16, "phases": []})
    await store.put_json("plans/job-1", [1, 2, 3])

    assert await store.get_json("jobs/job-1") == {"ranks": 8, "phases": ["dp", "pp"]}
    assert await store.get_json("jobs/missing") is None
    kv = await store.get("jobs/job-1")
    assert kv is not None
    assert (kv.key, kv.mod_revision, kv.create_revision, kv.version) == (
        "jobs/job-1",
        rev_a,
        rev_a,
        1,
    )

    snapshot = await store.get_prefix_json("jobs/")
    assert dict(snapshot.items) == {
        "jobs/job-1": {"ranks": 8, "phases": ["dp", "pp"]},
        "jobs/job-2": {"ranks": 16, "phases": []},
    }
    assert snapshot.revision == await store.current_revision()

    assert await store.delete("jobs/job-2") is True
    assert await store.delete("jobs/job-2") is False
    assert await store.delete_prefix("jobs/") == 1
    assert dict((await store.get_prefix_json("")).items) == {"plans/job-1": [1, 2, 3]}


@pytest.mark.etcd
async def test_corrupt_value_names_the_key_and_nothing_else_is_lost(
    store: EtcdStore, etcd: EmbeddedEtcd
) -> None:
    await store.put_json("jobs/a", {"ok": 1})
    await store.put_json("jobs/c", {"ok": 3})
    await raw_put(etcd, store.full_key("jobs/b-not-json"), b"\xff not json")
    await raw_put(etcd, store.full_key("jobs/b-bare"), json.dumps({"ok": 2}).encode())
    await raw_put(
        etcd, store.full_key("jobs/b-future"), json.dumps({"schema": 2, "data": {}}).encode()
    )

    with pytest.raises(CorruptValue) as info:
        await store.get_json("jobs/b-not-json")
    assert info.value.key == "jobs/b-not-json"
    assert "jobs/b-not-json" in str(info.value)
    with pytest.raises(CorruptValue) as info:
        await store.get_json("jobs/b-bare")
    assert info.value.key == "jobs/b-bare"
    with pytest.raises(UnsupportedSchema) as schema_info:
        await store.get_json("jobs/b-future")
    assert (schema_info.value.key, schema_info.value.schema) == ("jobs/b-future", 2)
    with pytest.raises(CorruptValue) as info:
        await store.get_prefix_json("jobs/")
    assert info.value.key.startswith("jobs/b-")

    # Nothing was lost: the good keys read back; once the bad ones are removed the prefix reads.
    assert await store.get_json("jobs/a") == {"ok": 1}
    assert await store.get_json("jobs/c") == {"ok": 3}
    assert await store.delete_prefix("jobs/b-") == 3
    assert dict((await store.get_prefix_json("jobs/")).items) == {
        "jobs/a": {"ok": 1},
        "jobs/c": {"ok": 3},
    }


@pytest.mark.etcd
async def test_put_if_absent_and_compare_and_swap(store: EtcdStore) -> None:
    assert await store.put_if_absent("alloc/port-1", {"job": "a"}) is True
    assert await store.put_if_absent("alloc/port-1", {"job": "b"}) is False
    kv = await store.get("alloc/port-1")
    assert kv is not None
    assert kv.value == {"job": "a"}

    assert await store.compare_and_swap(
        "alloc/port-1", {"job": "c"}, expected_mod_revision=kv.mod_revision
    )
    # The revision moved on: a second writer holding the old revision loses.
    assert not await store.compare_and_swap(
        "alloc/port-1", {"job": "d"}, expected_mod_revision=kv.mod_revision
    )
    assert await store.get_json("alloc/port-1") == {"job": "c"}
    assert not await store.compare_and_swap(
        "alloc/absent", 1, expected_mod_revision=kv.mod_revision
    )

    newer = await store.get("alloc/port-1")
    assert newer is not None
    assert not await store.compare_and_delete("alloc/port-1", expected_mod_revision=kv.mod_revision)
    assert await store.compare_and_delete("alloc/port-1", expected_mod_revision=newer.mod_revision)
    assert await store.get("alloc/port-1") is None


@pytest.mark.etcd
@pytest.mark.parametrize("renewals_per_ttl", [6, 3])  # a leader's lease, a host's presence
async def test_lease_keepalive_keeps_key_past_its_ttl_and_revoke_deletes_it(
    store: EtcdStore, renewals_per_ttl: int
) -> None:
    lease = await store.grant_lease(TTL_S, renewals_per_ttl=renewals_per_ttl)
    assert lease.ttl_s == TTL_S
    await store.put_json("agents/host-1", {"alive": True}, lease=lease)

    # Past 1.5 TTLs the lease must not be lost and its key must still be there.
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(lease.lost.wait(), TTL_S * 1.5)
    assert not lease.renewal_late.is_set()
    kv = await store.get("agents/host-1")
    assert kv is not None
    assert kv.lease_id == lease.id

    await store.revoke(lease)
    assert lease.lost.is_set()
    assert await store.get("agents/host-1") is None
    await store.revoke(lease)  # idempotent: etcd no longer knows the lease


@pytest.mark.etcd
async def test_lease_is_never_late_through_repeated_etcd_stalls_under_a_third_of_its_ttl(
    store: EtcdStore, etcd: EmbeddedEtcd
) -> None:
    """etcd frozen (SIGSTOP) for 0.7 s of a 3 s TTL, again and again, the pauses drifting
    across the keep-alive cycle (a member whose fsync stalls): a keep-alive sent into a pause
    is answered after it, in time, so the lease is never late, let alone lost."""
    ttl_s, stall_s, between_s = 3, 0.7, 0.45
    lease = await store.grant_lease(ttl_s)
    late = asyncio.ensure_future(lease.renewal_late.wait())
    pid = etcd.pid
    assert pid is not None
    try:
        for _ in range(8):
            os.kill(pid, signal.SIGSTOP)
            try:
                await asyncio.sleep(stall_s)
            finally:
                os.kill(pid, signal.SIGCONT)
            await asyncio.sleep(between_s)
        assert not late.done(), "the lease went late during an etcd stall of 0.7 s"
        assert not lease.lost.is_set()
    finally:
        os.kill(pid, signal.SIGCONT)
        late.cancel()
    await store.revoke(lease)


@pytest.mark.etcd
async def test_lease_lost_is_set_when_etcd_goes_away(store: EtcdStore, etcd: EmbeddedEtcd) -> None:
    lease = await store.grant_lease(TTL_S)
    await etcd.stop()
    await asyncio.wait_for(lease.renewal_late.wait(), TTL_S / 2 + 0.5)
    await asyncio.wait_for(lease.lost.wait(), TTL_S / 2 + 0.5)


@pytest.mark.etcd
async def test_watch_sees_puts_and_deletes_in_order(store: EtcdStore) -> None:
    start = await store.current_revision() + 1
    watch = store.watch_prefix("jobs/", start)
    try:
        r1 = await store.put_json("jobs/a", 1)
        r2 = await store.put_json("jobs/b", 2)
        await store.put_json("other/x", 0)  # outside the prefix
        r3 = await store.delete("jobs/a") and await store.current_revision()
        r4 = await store.put_json("jobs/b", 3)
        events = await next_events(watch, 4)
    finally:
        await watch.aclose()
    assert events == [
        WatchEvent(EventKind.PUT, "jobs/a", 1, r1),
        WatchEvent(EventKind.PUT, "jobs/b", 2, r2),
        WatchEvent(EventKind.DELETE, "jobs/a", None, r3),
        WatchEvent(EventKind.PUT, "jobs/b", 3, r4),
    ]


@pytest.mark.etcd
async def test_watch_resumes_after_etcd_restart_without_losing_events(
    store: EtcdStore, etcd: EmbeddedEtcd
) -> None:
    start = await store.current_revision() + 1
    watch = store.watch_prefix("jobs/", start)
    try:
        r1 = await store.put_json("jobs/a", 1)
        assert await next_events(watch, 1) == [WatchEvent(EventKind.PUT, "jobs/a", 1, r1)]

        await etcd.restart()
        # Written while the watch is still reconnecting: it must resume at r1 + 1.
        r2 = await store.put_json("jobs/b", 2)
        await store.delete("jobs/a")
        r3 = await store.current_revision()
        r4 = await store.put_json("jobs/c", 3)
        events = await next_events(watch, 3)
    finally:
        await watch.aclose()
    assert events == [
        WatchEvent(EventKind.PUT, "jobs/b", 2, r2),
        WatchEvent(EventKind.DELETE, "jobs/a", None, r3),
        WatchEvent(EventKind.PUT, "jobs/c", 3, r4),
    ]


@pytest.mark.etcd
async def test_watch_from_compacted_revision_yields_snapshot_then_continues(
    store: EtcdStore,
) -> None:
    r_a = await store.put_json("jobs/a", 1)
    await store.put_json("jobs/b", 2)
    await store.delete("jobs/a")
    r_c = await store.put_json("jobs/c", 3)
    await store.compact(r_c)
    with pytest.raises(StoreRequestFailed):
        await store.compact(r_a)  # already compacted

    watch = store.watch_prefix("jobs/", r_a)
    try:
        snapshot = await next_batch(watch)
        assert isinstance(snapshot, Snapshot)
        assert dict(snapshot.items) == {"jobs/b": 2, "jobs/c": 3}
        assert snapshot.revision >= r_c

        r_d = await store.put_json("jobs/d", 4)
        assert await next_events(watch, 1) == [WatchEvent(EventKind.PUT, "jobs/d", 4, r_d)]
        assert r_d > snapshot.revision
    finally:
        await watch.aclose()


@pytest.mark.etcd
async def test_election_follower_waits_while_leader_holds_lease_then_takes_over(
    store_factory: StoreFactory,
) -> None:
    store_1, store_2 = await store_factory(), await store_factory()
    first = LeaderElection(store_1, "replica-1", ttl_s=TTL_S)
    second = LeaderElection(store_2, "replica-2", ttl_s=TTL_S)
    await asyncio.wait_for(first.campaign(), WAIT_S)
    assert first.is_leader.is_set()
    assert await second.current_leader() == "replica-1"

    campaign = asyncio.create_task(second.campaign(), name="second-campaign")
    try:
        # 1.5 TTLs: longer than the lease would live without keep-alives.
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(second.is_leader.wait(), TTL_S * 1.5)
        assert first.is_leader.is_set()
        assert not first.fenced.is_set()

        assert first.lease is not None
        await store_1.revoke(first.lease)
        await asyncio.wait_for(campaign, WAIT_S)
        assert second.is_leader.is_set()
        assert await first.current_leader() == "replica-2"
        await asyncio.wait_for(first.fenced.wait(), WAIT_S)
        assert not first.is_leader.is_set()
    finally:
        campaign.cancel()
        await first.resign()
        await second.resign()
    assert await store_1.get("leader") is None


@pytest.mark.etcd
async def test_election_same_replica_takes_over_its_own_stale_key(
    store_factory: StoreFactory,
) -> None:
    crashed_store = await store_factory()
    crashed = LeaderElection(crashed_store, "replica-1", ttl_s=TTL_S)
    await asyncio.wait_for(crashed.campaign(), WAIT_S)
    assert crashed.lease is not None
    stale_lease_id = crashed.lease.id
    await crashed_store.close()  # a crash: keep-alives stop, the lease is not revoked

    store = await store_factory()
    restarted = LeaderElection(store, "replica-1", ttl_s=TTL_S)
    try:
        # Well under the stale lease's TTL: it did not wait for the lease to expire.
        await asyncio.wait_for(restarted.campaign(), TTL_S / 2)
        kv = await store.get("leader")
        assert kv is not None
        assert restarted.lease is not None
        assert kv.lease_id == restarted.lease.id != stale_lease_id
        # The stale lease expiring later must not take the key (or the leadership) with it.
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(restarted.fenced.wait(), TTL_S * 1.5)
        assert await restarted.current_leader() == "replica-1"
    finally:
        await crashed.resign()
        await restarted.resign()


@pytest.mark.etcd
async def test_leader_fences_itself_within_half_ttl_when_etcd_stops(
    store: EtcdStore, etcd: EmbeddedEtcd
) -> None:
    election = LeaderElection(store, "replica-1", ttl_s=TTL_S)
    await asyncio.wait_for(election.campaign(), WAIT_S)
    assert election.is_leader.is_set()
    try:
        stopped_at = time.monotonic()
        await etcd.stop()
        # The last keep-alive etcd acknowledged was sent before stopped_at, so etcd cannot
        # expire the lease before stopped_at + TTL_S * 5 / 6 (keep-alives every TTL / 6).
        await asyncio.wait_for(election.fenced.wait(), TTL_S / 2 + 0.5)
        fenced_after_s = time.monotonic() - stopped_at
        assert not election.is_leader.is_set()
        assert fenced_after_s < TTL_S / 2 + 0.25 < TTL_S * 5 / 6
        assert election.fence_reason is not None
        assert "half its TTL" in election.fence_reason
    finally:
        await election.resign()


@pytest.mark.etcd
async def test_coalescing_writer_coalesces_repeated_writes_and_flushes(store: EtcdStore) -> None:
    async with CoalescingWriter(store) as writer:
        before = await store.current_revision()
        for i in range(100):
            writer.put("phases/job-1", {"iteration": i})
            writer.put("phases/job-2", {"iteration": i})
        assert writer.pending == 2
        await writer.flush(timeout_s=WAIT_S)
        after = await store.current_revision()
        assert after - before == 1  # 200 puts, 2 keys, one transaction
        assert await store.get_json("phases/job-1") == {"iteration": 99}
        assert await store.get_json("phases/job-2") == {"iteration": 99}

        writer.put("phases/job-1", {"iteration": 100})
        writer.delete("phases/job-2")
        writer.put("phases/job-3", {"iteration": 0})
    # Leaving the block flushes.
    assert await store.current_revision() == after + 1
    snapshot = await store.get_prefix_json("phases/")
    assert dict(snapshot.items) == {
        "phases/job-1": {"iteration": 100},
        "phases/job-3": {"iteration": 0},
    }


@pytest.mark.etcd
async def test_coalescing_writer_fails_loud_after_bounded_retries(
    etcd: EmbeddedEtcd, store_prefix: str
) -> None:
    async with EtcdStore.connect(etcd.endpoint, prefix=store_prefix, timeout_s=0.3) as store:
        writer = CoalescingWriter(
            store, backoff=Backoff(initial_s=0.01, max_s=0.05), max_attempts=3
        )
        task = asyncio.create_task(writer.run(), name="writer")
        try:
            await etcd.stop()
            writer.put("phases/job-1", {"iteration": 1})
            with pytest.raises(FlushFailed):
                await writer.flush(timeout_s=WAIT_S)
            with pytest.raises(FlushFailed):
                await asyncio.wait_for(task, WAIT_S)
            with pytest.raises(FlushFailed):
                writer.put("phases/job-1", {"iteration": 2})
        finally:
            task.cancel()
