"""The lean load side of ``bench/hot_path.py``: ring / pair boundaries over the batched wire.

One gRPC PhaseStream (own channel, as a host agent has) per ``per_stream`` consecutive ranks;
each stream's ranks are plain integer lists. One driver coroutine writes every request (no
per-rank tasks, no ``wait_for`` tasks) and one reader coroutine per stream records what comes
back: the controller, not the generator, is what is measured.

Per boundary b (same phases and latency definition as the per-rank generator of hot_path.py):

1. Every stream: ``EnterMany(ring, b, its ranks)``; the ring is admitted when every rank is.
2. When the ring's last rank is admitted (the collective's barrier), every stream writes, in
   one batch, ``ReleaseMany(ring, b)``, stream 0 also ``EnterMany(pair, b, {0, P})``, and the
   ranks outside the pair ``EnterMany(ring, b + 1)`` at once (no artificial pipeline
   dependency: the coordinator holds ring b + 1 back while ranks 0 and P are on step b).
3. When the pair is admitted, stream 0 writes ``ReleaseMany(pair, b)`` and
   ``EnterMany(ring, b + 1, {0, P})`` in one batch.

Latency of a phase instance: each rank's admission (arrival of its ``AdmitMany``) minus the
last ``EnterMany`` send of the instance, floored at 0.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import grpc

from lightrail.controller.api.codec import phase_key_to_pb
from lightrail.controller.domain.model import Collective, PhaseKey, ProcessGroup
from lightrail.v1 import agent_pb2, agent_pb2_grpc

RING_ID = 1
PAIR_ID = 2


class LoadError(RuntimeError):
    """The controller refused a request, a stream failed, or the cell did not finish."""


@dataclass(slots=True)
class PhaseInstance:
    """One phase of one boundary: when its ranks were sent and admitted (perf_counter s).
    Admissions arrive per stream batch: ``admit_s[i]`` for ``admit_n[i]`` ranks."""

    expected: int
    last_send_s: float = 0.0
    first_send_s: float = math.inf
    admit_s: list[float] = field(default_factory=list)
    admit_n: list[int] = field(default_factory=list)
    admitted: int = 0
    switched: bool = False
    device_s: float = 0.0
    released_s: float = 0.0
    done: asyncio.Event = field(default_factory=asyncio.Event)

    def sent(self, at_s: float) -> None:
        self.last_send_s = max(self.last_send_s, at_s)
        self.first_send_s = min(self.first_send_s, at_s)

    def admit(self, at_s: float, n: int, noop: bool, device_s: float) -> None:
        self.admit_s.append(at_s)
        self.admit_n.append(n)
        self.admitted += n
        if not noop:
            self.switched = True
            self.device_s = max(self.device_s, device_s)
        if self.admitted >= self.expected:
            self.done.set()

    def latencies_ms(self) -> list[float]:
        """One latency per rank, ms."""
        out: list[float] = []
        for at_s, n in zip(self.admit_s, self.admit_n, strict=True):
            out.extend([max(0.0, at_s - self.last_send_s) * 1e3] * n)
        return out


def pair_peer(n: int) -> int:
    """The PP pair's second rank: 8 (host 8 on rail 0), or N/2 when N < 16."""
    return 8 if n >= 16 else n // 2


class LeanLoad:
    """Drives one registered job of ``n`` ranks through ``warmup + measured`` boundaries."""

    def __init__(self, target: str, job_id: str, n: int, per_stream: int, warmup: int,
                 measured: int, max_measured_s: float, timeout_s: float = 30.0) -> None:
        self.target = target
        self.job_id = job_id
        self.n = n
        self.warmup = warmup
        self.stop_at = warmup + measured
        self.max_measured_s = max_measured_s
        self.timeout_s = timeout_s
        self.streams = [list(range(k, min(n, k + per_stream))) for k in range(0, n, per_stream)]
        self.pair = (0, pair_peer(n))
        if any(r not in self.streams[0] for r in self.pair):
            raise ValueError(f"pair {self.pair} must lie on stream 0 (per_stream {per_stream})")
        self.ring_key = PhaseKey(ProcessGroup.of(range(n)), Collective.ALL_REDUCE)
        self.pair_key = PhaseKey(ProcessGroup.of(self.pair), Collective.SEND_RECV)
        self.ring: list[PhaseInstance] = [PhaseInstance(n) for _ in range(self.stop_at + 1)]
        self.pairs: list[PhaseInstance] = [PhaseInstance(2) for _ in range(self.stop_at + 1)]
        self.on_measured: Callable[[], None] | None = None
        """Called once as the first measured boundary starts (CPU sampling)."""
        self._request_id = 0
        self._failure: BaseException | None = None
        self._failed = asyncio.Event()

    # --- requests ------------------------------------------------------------------------

    def _enter(self, phase_id: int, b: int, ranks: Sequence[int]) -> agent_pb2.PhaseRequest:
        self._request_id += 1
        req = agent_pb2.PhaseRequest()
        e = req.enter_many
        e.job_id = self.job_id
        e.phase_id = phase_id
        e.iteration = b
        e.ranks.extend(ranks)
        e.request_id = self._request_id
        e.timeout_s = self.timeout_s
        return req

    def _release(self, phase_id: int, b: int, ranks: Sequence[int]) -> agent_pb2.PhaseRequest:
        req = agent_pb2.PhaseRequest()
        r = req.release_many
        r.job_id = self.job_id
        r.phase_id = phase_id
        r.iteration = b
        r.ranks.extend(ranks)
        return req

    def _defines(self) -> agent_pb2.PhaseRequestBatch:
        batch = agent_pb2.PhaseRequestBatch()
        for phase_id, key in ((RING_ID, self.ring_key), (PAIR_ID, self.pair_key)):
            d = batch.requests.add().define_phase
            d.phase_id = phase_id
            d.phase.CopyFrom(phase_key_to_pb(key))
        return batch

    # --- streams --------------------------------------------------------------------------

    async def _read(self, call: grpc.aio.StreamStreamCall, k: int) -> None:  # type: ignore[type-arg]
        ring, pairs = self.ring, self.pairs
        try:
            async for batch in call:
                at_s = time.perf_counter()
                for rep in batch.replies:
                    kind = rep.WhichOneof("kind")
                    if kind == "admitted_many":
                        m = rep.admitted_many
                        inst = (ring if m.phase_id == RING_ID else pairs)[m.iteration]
                        inst.admit(at_s, len(m.ranks), m.noop, m.device_s)
                    elif kind == "error":
                        err = rep.error
                        raise LoadError(f"stream {k}: rank {err.rank} refused "
                                        f"({agent_pb2.PhaseErrorCode.Name(err.code)}): "
                                        f"{err.message}")
                    else:
                        raise LoadError(f"stream {k}: unexpected per-rank reply {kind}")
        except BaseException as exc:  # handed to the driver, which re-raises it
            if not isinstance(exc, asyncio.CancelledError):
                self._failure = exc
                self._failed.set()
            raise

    async def _wait(self, inst: PhaseInstance) -> None:
        if inst.done.is_set():
            return
        if self._failed.is_set():
            raise LoadError(str(self._failure)) from self._failure
        done = asyncio.ensure_future(inst.done.wait())
        failed = asyncio.ensure_future(self._failed.wait())
        try:
            await asyncio.wait((done, failed), return_when=asyncio.FIRST_COMPLETED)
        finally:
            done.cancel()
            failed.cancel()
        if not inst.done.is_set():
            raise LoadError(str(self._failure)) from self._failure

    async def run(self, cell_timeout_s: float) -> None:
        """Open the streams, run every boundary, close. Raises ``LoadError``."""
        channels = [grpc.aio.insecure_channel(self.target) for _ in self.streams]
        # no request iterator: the calls are written to with ``write`` (grpc.aio)
        calls = [agent_pb2_grpc.AgentServiceStub(ch).PhaseStream()  # type: ignore[call-arg]
                 for ch in channels]
        readers: list[asyncio.Task[None]] = []
        try:
            for call in calls:
                await call.write(self._defines())
            readers = [asyncio.create_task(self._read(c, k), name=f"reader{k}")
                       for k, c in enumerate(calls)]
            async with asyncio.timeout(cell_timeout_s):
                await self._drive(calls)
        except TimeoutError:
            raise LoadError(f"cell did not finish within {cell_timeout_s} s") from None
        finally:
            for call in calls:
                call.cancel()
            for t in readers:
                t.cancel()
            await asyncio.gather(*readers, return_exceptions=True)
            for ch in channels:
                await ch.close(grace=None)

    async def _drive(self, calls: list[grpc.aio.StreamStreamCall]) -> None:  # type: ignore[type-arg]
        streams, pair = self.streams, self.pair
        others = [[r for r in ranks if r not in pair] for ranks in streams]
        first = True
        b = 0
        t_cap: float | None = None
        now = time.perf_counter
        def measuring() -> float:
            if self.on_measured is not None:
                self.on_measured()
            return now() + self.max_measured_s

        if self.warmup == 0:
            t_cap = measuring()
        for k, call in enumerate(calls):
            self.ring[0].sent(now())
            await call.write(agent_pb2.PhaseRequestBatch(
                requests=[self._enter(RING_ID, 0, streams[k])]))
        while b < self.stop_at:
            ring, pair_inst = self.ring[b], self.pairs[b]
            await self._wait(ring)
            if b + 1 == self.warmup and first:  # the next writes start the measured window
                first = False
                t_cap = measuring()
            if t_cap is not None and now() > t_cap:
                self.stop_at = max(min(self.stop_at, b + 1), self.warmup + 5)
            more = b + 1 < self.stop_at
            nxt = self.ring[b + 1]
            for k, call in enumerate(calls):
                reqs = [self._release(RING_ID, b, streams[k])]
                if k == 0:
                    reqs.append(self._enter(PAIR_ID, b, pair))
                if more and others[k]:
                    reqs.append(self._enter(RING_ID, b + 1, others[k]))
                t = now()
                if k == 0:
                    pair_inst.sent(t)
                if more and others[k]:
                    nxt.sent(t)
                await call.write(agent_pb2.PhaseRequestBatch(requests=reqs))
            ring.released_s = now()
            await self._wait(pair_inst)
            reqs = [self._release(PAIR_ID, b, pair)]
            if more:
                reqs.append(self._enter(RING_ID, b + 1, pair))
            t = now()
            if more:
                nxt.sent(t)
            await calls[0].write(agent_pb2.PhaseRequestBatch(requests=reqs))
            pair_inst.released_s = now()
            b += 1
        self.stop_at = b

    # --- results ----------------------------------------------------------------------------

    def measured(self) -> range:
        """The measured boundaries."""
        return range(self.warmup, self.stop_at)

    def window_s(self) -> float:
        """From the first send of the first measured boundary to the last release."""
        bs = self.measured()
        if not bs:
            return 0.0
        end = max(self.ring[bs[-1]].released_s, self.pairs[bs[-1]].released_s)
        return end - self.ring[bs[0]].first_send_s
