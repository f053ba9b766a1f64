"""The host agent's health link: heartbeats and GPU health up one HealthStream, the
controller's acknowledgements down (DESIGN.md "Failover").

Every ``interval_s`` (the controller may change it in its acknowledgement) and at once on every
health change, the reporter sends a full snapshot of the host's GPUs. It reconnects with bounded
backoff after a controller or network blip. GPUs the controller records as failed stay failed
here too (the controller's record wins over a restarted agent's).

Replicas: ``target`` may list several controller addresses (``a:1,b:2``); a standby's redirect
(``lightrail.agents.leader``) is followed at once, at most ``MAX_REDIRECTS`` times in a row,
any other break moves to the next address after the backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence

import grpc
import structlog

from lightrail.agents.channel import ClientTls
from lightrail.agents.host.health import EventSource, GpuHealth, GpuId, HealthSource, HealthState
from lightrail.agents.leader import MAX_REDIRECTS, LeaderTargets, redirect_of
from lightrail.controller.domain.timing import Backoff, BackoffState
from lightrail.v1 import agent_pb2, agent_pb2_grpc

log = structlog.get_logger(__name__)

_STATE_TO_PB = {
    HealthState.HEALTHY: agent_pb2.GPU_HEALTHY,
    HealthState.DEGRADED: agent_pb2.GPU_DEGRADED,
    HealthState.FAILED: agent_pb2.GPU_FAILED,
    HealthState.UNKNOWN: agent_pb2.GPU_UNKNOWN,
}


def report_of(host: str, snapshot: dict[GpuId, GpuHealth]) -> agent_pb2.HealthReport:
    """The HealthReport message for a snapshot."""
    gpus = []
    for gid, h in sorted(snapshot.items()):
        g = agent_pb2.GpuHealth(gpu=gid.index, state=_STATE_TO_PB[h.state], reason=h.reason,
                                controller_record=h.state is HealthState.FAILED
                                and h.source is EventSource.RESTORED)
        if h.xid is not None:
            g.xid = h.xid
            g.has_xid = True
        gpus.append(g)
    return agent_pb2.HealthReport(host=host, sent_unix_s=time.time(), gpus=gpus)


class HealthReporter:
    """Streams ``source``'s health to the controller at ``target`` (``host:port``, or its
    replicas' addresses ``a:1,b:2``; ``ValueError`` if empty), a snapshot every ``interval_s``
    seconds; after a broken stream it reconnects waiting ``backoff_initial_s`` doubling up to
    ``backoff_max_s`` seconds. ``tls``: TLS to the controller
    (``lightrail.agents.channel.ClientTls``; None: plaintext)."""

    def __init__(
        self,
        source: HealthSource,
        target: str | Sequence[str],
        *,
        interval_s: float = 1.0,
        backoff_initial_s: float = 0.05,
        backoff_max_s: float = 2.0,
        tls: ClientTls | None = None,
    ) -> None:
        self.source = source
        self._targets = LeaderTargets(target, tls=tls)
        self.target = str(self._targets)
        self.interval_s = interval_s
        self._backoff = Backoff(initial_s=backoff_initial_s, max_s=backoff_max_s)
        self.acks = 0
        self.acked = asyncio.Event()

    @property
    def connected_to(self) -> str:
        """The address the reporter's stream goes to (or will go to next)."""
        return self._targets.current

    async def run(self) -> None:
        """Report until cancelled."""
        backoff = BackoffState(self._backoff)
        redirects = 0
        while True:
            address = self._targets.current
            acks = self.acks
            try:
                await self._session(address)
                backoff.reset()
            except grpc.aio.AioRpcError as exc:
                if self.acks > acks:  # the stream reached the leader
                    backoff.reset()
                    redirects = 0
                leader = redirect_of(exc)
                if leader and leader != address and redirects < MAX_REDIRECTS:
                    redirects += 1
                    self._targets.current = leader
                    log.info("health_stream_redirected", host=self.source.host,
                             standby=address, leader=leader)
                    continue
                redirects = 0
                log.warning("health_stream_broken", host=self.source.host, controller=address,
                            detail=self._targets.describe(exc))
                order = self._targets.addresses
                self._targets.current = (order[(order.index(address) + 1) % len(order)]
                                         if address in order else order[0])
                await asyncio.sleep(backoff.next_s())

    async def _session(self, address: str) -> None:
        async with self._targets.channel(address) as channel:
            call = agent_pb2_grpc.AgentServiceStub(channel).HealthStream()  # type: ignore[call-arg]
            changed = asyncio.Event()

            async def watch() -> None:
                async for _ in self.source.events():
                    changed.set()

            async def read() -> None:
                while True:
                    ack = await call.read()
                    if ack is grpc.aio.EOF:  # type: ignore[attr-defined]
                        return
                    assert isinstance(ack, agent_pb2.HealthAck)
                    if ack.heartbeat_interval_s > 0:
                        self.interval_s = ack.heartbeat_interval_s
                    self._adopt(list(ack.failed_gpus))
                    self.acks += 1
                    self.acked.set()

            watcher = asyncio.create_task(watch(), name=f"health-watch-{self.source.host}")
            # (cancelling the watcher closes its subscription)
            reader = asyncio.create_task(read(), name=f"health-acks-{self.source.host}")
            try:
                while not reader.done():
                    await self.source.wait_alive()
                    try:
                        await call.write(report_of(self.source.host,
                                                   dict(self.source.snapshot())))
                    except asyncio.InvalidStateError:
                        # the call ended (a standby's redirect, the controller gone): its
                        # status comes from the reader
                        await asyncio.wait({reader}, timeout=1.0)
                        if not reader.done():
                            raise
                        break
                    changed.clear()
                    # asyncio.timeout: 3.11's wait_for drops a cancel that comes as the wait
                    # ends (CPython gh-86296), and this loop would then outlive its stop
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(self.interval_s):
                            await changed.wait()
                reader.result()
            finally:
                watcher.cancel()
                reader.cancel()
                call.cancel()

    def _adopt(self, failed: list[int]) -> None:
        """The controller's record wins: GPUs it records as failed stay failed here, and a
        failure kept only as the controller's record (``EventSource.RESTORED``) goes once the
        controller no longer lists it (an operator's undrain or ``gpus --clear``). Failures
        this host found itself stay until its source says otherwise."""
        snap = self.source.snapshot()
        listed = set(failed)
        gone = [gid for gid, h in snap.items() if h.state is HealthState.FAILED
                and h.source is EventSource.RESTORED and gid.index not in listed]
        if not failed and not gone:
            return
        # only failures are kept records; passing transient findings (a hot GPU) would pin
        # them until the next restore
        keep = {gid: h for gid, h in snap.items()
                if h.state is HealthState.FAILED and gid not in gone}
        for idx in failed:
            gid = GpuId(self.source.host, idx)
            if gid not in keep or keep[gid].state is not HealthState.FAILED:
                keep[gid] = GpuHealth(gid, HealthState.FAILED, "failed (controller's record)",
                                      None, time.time(), EventSource.RESTORED)
        self.source.restore(keep)
