"""The lean load side of ``bench/hot_path.py``: phase boundaries over the batched wire.

One gRPC PhaseStream (own channel, as a host agent has) per ``per_stream`` consecutive ranks;
each stream's ranks are plain integer lists. One driver coroutine writes every request (no
per-rank tasks, no ``wait_for`` tasks) and one reader coroutine per stream records what comes
back: the controller, not the generator, is what is measured.

A *workload* gives each rank its sequence of phases per boundary (``Workload.sequence``). A
phase instance (phase, boundary) completes when every rank of its group is admitted (the
collective's barrier); then each of its ranks releases it and enters its next phase (the next
in its sequence, or the first of the next boundary) at once, release and enter of one stream
in one message. No other dependency: the coordinator holds a phase instance back until every
rank of its group has entered it.

* ``ring-pair``: ``ALL_REDUCE`` over all N ranks, then the PP pair {0, P} (P = 8, or N/2 when
  N < 16); the method of the C++ reference (two phase instances per boundary).
* ``mixed``: a DP ring over all ranks, four PP pairs {i, i + N/2} (i < 4), and an EP
  all-to-all over five ranks {0, s, .., 4s} (s = N // 5) as its four shift matchings (steps
  0..3; ``lightrail.controller.core.planner.all_to_all_steps``) - nine instances per boundary.

Latency of a phase instance: each rank's admission (arrival of its ``AdmitMany``) minus the
last enter send of the instance, floored at 0.
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

WORKLOADS = ("ring-pair", "mixed")
MIXED_MIN_N = 10
"""The smallest N of the ``mixed`` workload: its EP all-to-all takes five hosts N/5 apart."""


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

    def sent(self, at_s: float) -> None:
        self.last_send_s = max(self.last_send_s, at_s)
        self.first_send_s = min(self.first_send_s, at_s)

    def admit(self, at_s: float, n: int, noop: bool, device_s: float) -> bool:
        """Record ``n`` ranks admitted; True when that completes the instance."""
        self.admit_s.append(at_s)
        self.admit_n.append(n)
        self.admitted += n
        if not noop:
            self.switched = True
            self.device_s = max(self.device_s, device_s)
        return self.admitted >= self.expected

    def latencies_ms(self) -> list[float]:
        """One latency per rank, ms."""
        out: list[float] = []
        for at_s, n in zip(self.admit_s, self.admit_n, strict=True):
            out.extend([max(0.0, at_s - self.last_send_s) * 1e3] * n)
        return out


def pair_peer(n: int) -> int:
    """The PP pair's second rank: 8 (host 8 on rail 0), or N/2 when N < 16."""
    return 8 if n >= 16 else n // 2


@dataclass(frozen=True, slots=True)
class Workload:
    """The phases of one boundary (``phases``; the wire's phase id is the index) and each
    rank's sequence through them (``sequence[rank]``: phase indices, in order)."""

    name: str
    phases: tuple[PhaseKey, ...]
    sequence: tuple[tuple[int, ...], ...]

    @staticmethod
    def build(name: str, n: int) -> Workload:
        """``ring-pair`` or ``mixed`` over N ranks. Raises ``ValueError`` for another name or
        an N too small for it (mixed: N >= ``MIXED_MIN_N``)."""
        ring = PhaseKey(ProcessGroup.of(range(n)), Collective.ALL_REDUCE)
        if name == "ring-pair":
            pair = (0, pair_peer(n))
            return Workload(name, (ring, PhaseKey(ProcessGroup.of(pair), Collective.SEND_RECV)),
                            tuple((0, 1) if r in pair else (0,) for r in range(n)))
        if name != "mixed":
            raise ValueError(f"workload: {name!r} is not one of {', '.join(WORKLOADS)}")
        if n < MIXED_MIN_N:
            raise ValueError(f"workload mixed: needs N >= {MIXED_MIN_N} (five EP hosts), "
                             f"not {n}")
        half, s = n // 2, n // 5
        pairs = [PhaseKey(ProcessGroup.of((i, i + half)), Collective.SEND_RECV)
                 for i in range(4)]
        ep = ProcessGroup.of(range(0, 5 * s, s))
        a2a = [PhaseKey(ep, Collective.ALL_TO_ALL, step=k) for k in range(4)]
        phases = (ring, *pairs, *a2a)
        seqs: list[tuple[int, ...]] = []
        for r in range(n):
            seq = [0]
            seq += [1 + i for i in range(4) if r in (i, i + half)]
            if ep.contains(r):
                seq += [5 + k for k in range(4)]
            seqs.append(tuple(seq))
        return Workload(name, phases, tuple(seqs))


@dataclass(frozen=True, slots=True)
class _Move:
    """Part of what one phase instance's completion does on one stream: ``ranks`` release it
    (empty for the second and later entries of the stream), and ``next_ranks`` enter phase
    ``next_pid`` (None: nothing), in the next boundary when ``wraps``."""

    stream: int
    ranks: list[int]
    next_pid: int | None
    wraps: bool
    next_ranks: list[int]


class LeanLoad:
    """Drives one registered job of ``n`` ranks through ``warmup + measured`` boundaries of
    ``workload``."""

    def __init__(self, target: str, job_id: str, workload: Workload, per_stream: int,
                 warmup: int, measured: int, max_measured_s: float,
                 timeout_s: float = 30.0) -> None:
        self.target = target
        self.job_id = job_id
        self.workload = workload
        self.n = n = len(workload.sequence)
        self.warmup = warmup
        self.stop_at = warmup + measured
        self.max_measured_s = max_measured_s
        self.timeout_s = timeout_s
        self.streams = [list(range(k, min(n, k + per_stream))) for k in range(0, n, per_stream)]
        self.stream_of = [r // per_stream for r in range(n)]
        sizes = [p.group.size for p in workload.phases]
        self.instances: list[list[PhaseInstance]] = [
            [PhaseInstance(size) for size in sizes] for _ in range(self.stop_at + 1)]
        self.on_measured: Callable[[], None] | None = None
        """Called once as the writes that start the first measured boundary go out."""
        self.max_entered = 0
        """The latest boundary any rank entered."""
        self._request_id = 0
        self._completed: asyncio.Queue[tuple[int, int] | BaseException] = asyncio.Queue()

    # --- requests ------------------------------------------------------------------------

    def _enter(self, batch: agent_pb2.PhaseRequestBatch, phase_id: int, b: int,
               ranks: Sequence[int]) -> None:
        """Append an EnterMany to ``batch`` (built in place: no message copies)."""
        self._request_id += 1
        e = batch.requests.add().enter_many
        e.job_id = self.job_id
        e.phase_id = phase_id
        e.iteration = b
        e.ranks.extend(ranks)
        e.request_id = self._request_id
        e.timeout_s = self.timeout_s

    def _release(self, batch: agent_pb2.PhaseRequestBatch, phase_id: int, b: int,
                 ranks: Sequence[int]) -> None:
        """Append a ReleaseMany to ``batch``."""
        r = batch.requests.add().release_many
        r.job_id = self.job_id
        r.phase_id = phase_id
        r.iteration = b
        r.ranks.extend(ranks)

    def _defines(self) -> agent_pb2.PhaseRequestBatch:
        batch = agent_pb2.PhaseRequestBatch()
        for phase_id, key in enumerate(self.workload.phases):
            d = batch.requests.add().define_phase
            d.phase_id = phase_id
            d.phase.CopyFrom(phase_key_to_pb(key))
        return batch

    # --- streams --------------------------------------------------------------------------

    async def _read(self, call: grpc.aio.StreamStreamCall, k: int) -> None:  # type: ignore[type-arg]
        instances, done = self.instances, self._completed
        eof = grpc.aio.EOF  # type: ignore[attr-defined]  # exported, not in the stubs
        try:
            while True:  # read() is cheaper per message than the async iterator
                batch = await call.read()
                if batch is eof:
                    return
                assert isinstance(batch, agent_pb2.PhaseReplyBatch)
                at_s = time.perf_counter()
                for rep in batch.replies:
                    kind = rep.WhichOneof("kind")
                    if kind == "admitted_many":
                        m = rep.admitted_many
                        if instances[m.iteration][m.phase_id].admit(
                                at_s, len(m.ranks), m.noop, m.device_s):
                            done.put_nowait((m.iteration, m.phase_id))
                    elif kind == "error":
                        err = rep.error
                        raise LoadError(f"stream {k}: rank {err.rank} refused "
                                        f"({agent_pb2.PhaseErrorCode.Name(err.code)}): "
                                        f"{err.message}")
                    else:
                        raise LoadError(f"stream {k}: unexpected per-rank reply {kind}")
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # handed to the driver, which raises it
            done.put_nowait(exc)
            raise

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
        seqs = self.workload.sequence
        moves = self._moves()
        now = time.perf_counter
        t_cap: float | None = None
        if self.warmup == 0:
            t_cap = self._measuring()
        # every rank enters the first phase of its sequence in boundary 0
        enters: dict[tuple[int, int, int], list[int]] = {}
        for r, seq in enumerate(seqs):
            enters.setdefault((self.stream_of[r], 0, seq[0]), []).append(r)
        await self._write(calls, {}, enters)
        open_ranks = self.n  # ranks not yet past the last boundary
        while open_ranks:
            item = await self._completed.get()
            if isinstance(item, BaseException):
                raise LoadError(str(item)) from item
            b, pid = item
            inst = self.instances[b][pid]
            if t_cap is not None and now() > t_cap:  # stop after the latest boundary entered
                self.stop_at = min(self.stop_at, max(self.max_entered + 1, self.warmup + 5))
            releases: dict[tuple[int, int, int], list[int]] = {}
            enters = {}
            more = b + 1 < self.stop_at
            for move in moves[pid]:  # precomputed: O(streams), not O(ranks), per instance
                if move.ranks:
                    releases[(move.stream, b, pid)] = move.ranks
                if move.next_pid is None:
                    continue
                if move.wraps:
                    if not more:
                        open_ranks -= len(move.next_ranks)
                        continue
                    enters[(move.stream, b + 1, move.next_pid)] = move.next_ranks
                else:
                    enters[(move.stream, b, move.next_pid)] = move.next_ranks
            if t_cap is None and any(nb == self.warmup for _, nb, _ in enters):
                t_cap = self._measuring()
            await self._write(calls, releases, enters)
            inst.released_s = now()

    def _moves(self) -> list[list[_Move]]:
        """Per phase id, what its completion does on each stream: which ranks release it and
        which of them enter which phase next (static for a workload)."""
        seqs = self.workload.sequence
        out: list[list[_Move]] = []
        for pid, phase in enumerate(self.workload.phases):
            by: dict[tuple[int, int, bool], list[int]] = {}
            released: dict[int, list[int]] = {}
            for r in phase.group.ranks:
                k = self.stream_of[r]
                released.setdefault(k, []).append(r)
                seq = seqs[r]
                i = seq.index(pid)
                nxt, wraps = (seq[i + 1], False) if i + 1 < len(seq) else (seq[0], True)
                by.setdefault((k, nxt, wraps), []).append(r)
            moves: list[_Move] = []
            for k, ranks in released.items():
                targets = [(nxt, wraps, rs) for (kk, nxt, wraps), rs in by.items() if kk == k]
                moves.append(_Move(k, ranks, None, False, []))
                moves.extend(_Move(k, [], nxt, wraps, rs) for nxt, wraps, rs in targets)
            # one release per stream: the first move of the stream carries it
            out.append([m for m in moves if m.ranks or m.next_pid is not None])
        return out

    def _measuring(self) -> float:
        if self.on_measured is not None:
            self.on_measured()
        return time.perf_counter() + self.max_measured_s

    async def _write(self, calls: list[grpc.aio.StreamStreamCall],  # type: ignore[type-arg]
                     releases: dict[tuple[int, int, int], list[int]],
                     enters: dict[tuple[int, int, int], list[int]]) -> None:
        """Per stream one message: its releases, then its enters (stream, boundary, phase
        -> ranks)."""
        per_stream: dict[int, agent_pb2.PhaseRequestBatch] = {}
        for (k, b, pid), ranks in releases.items():
            batch = per_stream.get(k)
            if batch is None:
                batch = per_stream[k] = agent_pb2.PhaseRequestBatch()
            self._release(batch, pid, b, ranks)
        for (k, b, pid), ranks in enters.items():
            batch = per_stream.get(k)
            if batch is None:
                batch = per_stream[k] = agent_pb2.PhaseRequestBatch()
            self._enter(batch, pid, b, ranks)
            self.max_entered = max(self.max_entered, b)
        t = time.perf_counter()
        for b, pid in {(b, pid) for (_, b, pid) in enters}:
            self.instances[b][pid].sent(t)
        writes = [calls[k].write(batch) for k, batch in per_stream.items()]
        if len(writes) == 1:
            await writes[0]
        else:  # the streams' writes overlap instead of waiting for each other
            await asyncio.gather(*writes)

    # --- results ----------------------------------------------------------------------------

    def measured(self) -> range:
        """The measured boundaries."""
        return range(self.warmup, self.stop_at)

    def measured_instances(self) -> list[PhaseInstance]:
        """Every phase instance of the measured boundaries."""
        return [inst for b in self.measured() for inst in self.instances[b]]

    def window_s(self) -> float:
        """From the first send of the first measured boundary to the last release."""
        insts = self.measured_instances()
        if not insts:
            return 0.0
        return max(i.released_s for i in insts) - min(i.first_send_s for i in insts)
