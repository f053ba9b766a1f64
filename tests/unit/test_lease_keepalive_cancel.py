"""A lease's keep-alive task stops when cancelled, also when the cancel comes just as a
keep-alive reply arrives (no etcd here: the store's client is a stand-in).

Python 3.11's ``asyncio.wait_for`` returns the inner result instead of raising when its caller is
cancelled after the inner call finished but before the caller resumed (CPython gh-86296, fixed
in 3.12): a keep-alive loop built on it then runs on after ``revoke`` or ``close`` cancelled it,
so ``revoke`` times out waiting for it (seen as ``resign: revoking the lease timed out`` in
tests/integration/test_store.py). The stand-in below makes that order happen every time: its
keep-alive cancels the keeper, then answers at once.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from lightrail.controller.store.etcd import EtcdStore
from lightrail.etcdapi import rpc_pb2

LEASE_ID = 0x1234


@dataclass
class _Client:
    """The two calls a lease's life makes, answering at once."""

    store: EtcdStore
    keep_alives: int = 0
    cancels_on: int = 1  # the keep-alive (1 = the first) during which the keeper is cancelled
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)

    async def lease_grant(self, op: str, request: rpc_pb2.LeaseGrantRequest
                          ) -> rpc_pb2.LeaseGrantResponse:
        return rpc_pb2.LeaseGrantResponse(ID=LEASE_ID, TTL=request.TTL)

    async def lease_keep_alive_once(self, op: str, lease_id: int, timeout_s: float
                                    ) -> rpc_pb2.LeaseKeepAliveResponse:
        self.keep_alives += 1
        if self.keep_alives == self.cancels_on:
            self.store._keepers[lease_id].cancel()  # the task under test
            self.cancelled.set()
        return rpc_pb2.LeaseKeepAliveResponse(ID=lease_id, TTL=1)

    async def close(self) -> None:
        pass


async def test_a_cancel_that_meets_a_reply_stops_the_keep_alive_task() -> None:
    store = EtcdStore.connect("127.0.0.1:1")
    client = _Client(store)
    store._client = client  # type: ignore[assignment]  # no etcd here
    lease = await store.grant_lease(1, renewals_per_ttl=3)  # a keep-alive every 1/3 s
    keeper = store._keepers[lease.id]
    await asyncio.wait_for(client.cancelled.wait(), 5)
    # It stops at once; with the cancel lost it would sleep until the next keep-alive (1/3 s)
    # and go on renewing.
    done, _ = await asyncio.wait({keeper}, timeout=2)
    assert keeper in done, f"the keep-alive task ran on after its cancel ({client.keep_alives} " \
                           "keep-alives)"
    assert keeper.cancelled()
    assert client.keep_alives == 1
    await store.close()
