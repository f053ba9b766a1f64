"""The gRPC floor under ``bench/hot_path.py``: the same load against a server that does nothing
but the phase barrier, so the difference to the real controller is the controller's own cost.

Run: ``.venv/bin/python bench/grpc_floor.py [--n 8 64 256] [--repeat 3] [--workload
ring-pair]`` (needs ``make loadgen``). Prints per N the p50 / p99 admission latency, the
boundaries/s and the server's CPU per boundary, medians [min-max] of the interleaved runs, as
``hot_path.py`` counts them (``hot_path.summarize_lean``).

The server (``--serve PORT``, started here as its own process, pinned to the first core; this
process and the C++ generator to the second, as ``hot_path.py`` pins them) is a
``grpc.aio`` server under uvloop with the controller's garbage-collector settings and its
stream pattern (a reader task and a writer per ``PhaseStream``), answering the batched wire
(DESIGN.md "Phase protocol"): ``DefinePhase`` binds a phase id on its stream; an
``EnterMany`` counts its ranks towards the phase instance (job, phase key, iteration); when
every rank of the phase's group has entered, each stream that sent some of them gets one
``AdmitMany`` for its ranks; ``ReleaseMany`` is accepted and ignored. No coordinator, no
planner, no switch, no metrics, no etcd: a lower bound for any Python gRPC controller on this
machine, not a controller (it checks nothing and admits without circuits).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import socket
import statistics
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

from lightrail.controller.cli import grpc_environment

# Before grpc is imported: the controller daemon's gRPC environment, so that the floor server
# serves as the controller does.
os.environ.update(grpc_environment(os.environ))

import grpc
import uvloop
from cxx_load import BUILD_HINT, CxxLoad, loadgen_built
from hot_path import CellResult, counts_for, summarize_lean
from lean_load import MIXED_MIN_N, WORKLOADS, LoadError, Workload
from support import Child, at_least, description, positive_s, proc_cpu_s

from lightrail.controller.cli.daemons import DAEMON_GC_THRESHOLDS
from lightrail.v1 import agent_pb2

# --- the barrier server ----------------------------------------------------------------------


@dataclass(slots=True)
class _Held:
    """One stream's ranks in a phase instance: where to answer, under which of its phase ids,
    and each rank's request id."""

    outbox: _Outbox
    phase_id: int
    ranks: list[int] = field(default_factory=list)
    request_ids: list[int] = field(default_factory=list)


@dataclass(slots=True)
class _Instance:
    """The ranks entered so far of one phase instance, by stream."""

    size: int
    entered: int = 0
    by_stream: dict[int, _Held] = field(default_factory=dict)


class _Outbox:
    """The replies waiting for one stream's writer."""

    __slots__ = ("batch", "event")

    def __init__(self) -> None:
        self.batch = agent_pb2.PhaseReplyBatch()
        self.event = asyncio.Event()


class BarrierService:
    """``PhaseStream`` with the phase barrier only (module docstring); served as
    ``lightrail.v1.AgentService`` by ``handler``."""

    def __init__(self) -> None:
        self._instances: dict[tuple[str, bytes, int], _Instance] = {}
        self._next_stream = 0

    def handler(self) -> grpc.GenericRpcHandler:  # type: ignore[type-arg]
        """The generic handler of ``lightrail.v1.AgentService`` with ``PhaseStream`` only."""
        return grpc.method_handlers_generic_handler("lightrail.v1.AgentService", {
            "PhaseStream": grpc.stream_stream_rpc_method_handler(
                self.phase_stream,
                request_deserializer=agent_pb2.PhaseRequestBatch.FromString,
                response_serializer=agent_pb2.PhaseReplyBatch.SerializeToString),
        })

    async def phase_stream(self, request_iterator: object,
                           context: grpc.aio.ServicerContext) -> None:  # type: ignore[type-arg]
        outbox = _Outbox()
        stream = self._next_stream
        self._next_stream += 1
        reader = asyncio.create_task(self._read(context, outbox, stream))
        reader.add_done_callback(lambda _t: outbox.event.set())
        while True:
            await outbox.event.wait()
            outbox.event.clear()
            if outbox.batch.replies:
                out, outbox.batch = outbox.batch, agent_pb2.PhaseReplyBatch()
                await context.write(out)
            if reader.done():
                return

    async def _read(self, context: grpc.aio.ServicerContext,  # type: ignore[type-arg]
                    outbox: _Outbox, stream: int) -> None:
        phases: dict[int, tuple[bytes, int]] = {}  # phase id -> (key bytes, group size)
        eof = grpc.aio.EOF  # type: ignore[attr-defined]
        while True:
            batch = await context.read()
            if batch is eof:
                return
            assert isinstance(batch, agent_pb2.PhaseRequestBatch)
            for req in batch.requests:
                kind = req.WhichOneof("kind")
                if kind == "enter_many":
                    self._enter(req.enter_many, phases, outbox, stream)
                elif kind == "define_phase":
                    d = req.define_phase
                    phases[d.phase_id] = (d.phase.SerializeToString(), len(d.phase.group_ranks))

    def _enter(self, e: agent_pb2.EnterMany, phases: dict[int, tuple[bytes, int]],
               outbox: _Outbox, stream: int) -> None:
        key_bytes, size = phases[e.phase_id]
        key = (e.job_id, key_bytes, e.iteration)
        inst = self._instances.get(key)
        if inst is None:
            inst = self._instances[key] = _Instance(size)
        held = inst.by_stream.get(stream)
        if held is None:
            held = inst.by_stream[stream] = _Held(outbox, e.phase_id)
        held.ranks.extend(e.ranks)
        held.request_ids.extend([e.request_id] * len(e.ranks))
        inst.entered += len(e.ranks)
        if inst.entered < inst.size:
            return
        del self._instances[key]
        for h in inst.by_stream.values():
            many = h.outbox.batch.replies.add().admitted_many
            many.job_id = e.job_id
            many.phase_id = h.phase_id
            many.iteration = e.iteration
            many.ranks.extend(h.ranks)
            many.request_ids.extend(h.request_ids)
            h.outbox.event.set()


async def serve(port: int) -> None:
    """Serve ``BarrierService`` on 127.0.0.1:``port`` until killed; prints ``ready``."""
    gc.set_threshold(*DAEMON_GC_THRESHOLDS)  # as the controller's process
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((BarrierService().handler(),))
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    gc.freeze()  # as the controller (controller/app.py)
    print("ready", flush=True)
    await server.wait_for_termination()


# --- the load side -----------------------------------------------------------------------------


@dataclass(slots=True)
class FloorRun:
    """One run against the barrier server."""

    n: int
    result: CellResult
    server_us_per_boundary: float = 0.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def run_once(n: int, workload: str, repeat: int, cpus: tuple[int, int] | None,
                   max_measured_s: float, cell_timeout_s: float) -> FloorRun:
    """Start a barrier server, run ``hot_path.py``'s batch32 cell of ``workload`` on ``n``
    ranks against it with the C++ generator, stop the server. Raises ``LoadError``."""
    port = _free_port()
    proc = await Child.start([sys.executable, __file__, "--serve", str(port)],
                             None if cpus is None else cpus[0], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    try:
        line = await asyncio.wait_for(proc.stdout.readline(), 30)
        if line.strip() != b"ready":
            raise LoadError(f"barrier server did not start (printed {line!r})")
        counts = counts_for(n, quick=False)
        per_stream = min(32, n)
        load = CxxLoad(f"127.0.0.1:{port}", f"floor-n{n}-r{repeat}", Workload.build(workload, n),
                       per_stream, counts.warmup, counts.measured, max_measured_s)
        marks: list[float] = []
        load.on_measured = lambda: marks.append(proc_cpu_s(proc.pid))
        await load.run(cell_timeout_s)
        end = proc_cpu_s(proc.pid)
        result = CellResult("batch32", n, 0.0, per_stream, repeat, workload, "cxx")
        summarize_lean(load, result)
        run = FloorRun(n, result)
        bs = load.measured()
        if marks and bs:
            run.server_us_per_boundary = (end - marks[0]) / len(bs) * 1e6
        return run
    finally:
        proc.kill()
        await proc.wait()


def _cell(values: Sequence[float], fmt: str) -> str:
    return (f"{format(statistics.median(values), fmt)} "
            f"[{format(min(values), fmt)}-{format(max(values), fmt)}]")


async def amain(ns: Sequence[int], repeat: int, workload: str, pin: bool,
                max_measured_s: float, cell_timeout_s: float) -> int:
    cores = sorted(os.sched_getaffinity(0))
    cpus = (cores[0], cores[1]) if pin and len(cores) >= 2 else None
    if cpus is not None:
        os.sched_setaffinity(0, {cpus[1]})  # the generator, started from here, inherits it
    runs: dict[int, list[FloorRun]] = {n: [] for n in ns}
    for rep in range(repeat):
        for n in ns:
            run = await run_once(n, workload, rep, cpus, max_measured_s, cell_timeout_s)
            runs[n].append(run)
            r = run.result
            print(f"run {rep + 1}/{repeat} N={n}: p50 {r.p50_ms:.3f} ms, p99 {r.p99_ms:.3f} "
                  f"ms, {r.boundaries_per_s:.0f} boundaries/s, server "
                  f"{run.server_us_per_boundary:.0f} us/boundary", file=sys.stderr, flush=True)
    print(f"gRPC floor ({workload}, batch32, C++ generator; barrier-only grpc.aio server, "
          f"medians [min-max] of {repeat} runs):")
    for n in ns:
        rs = [x.result for x in runs[n]]
        print(f"  N={n}: p50 {_cell([r.p50_ms for r in rs], '.3f')} ms, p99 "
              f"{_cell([r.p99_ms for r in rs], '.3f')} ms, "
              f"{_cell([r.boundaries_per_s for r in rs], '.0f')} boundaries/s, server CPU "
              f"{_cell([x.server_us_per_boundary for x in runs[n]], '.0f')} us/boundary")
    where = (f"server on core {cpus[0]}, generator on core {cpus[1]}" if cpus else "not pinned")
    print(f"cpu: {where}. Compare with bench/hot_path.py's cells of the same N: the difference "
          "is the controller's own work (coordinator, planner, reconciler, emulated switch, "
          "metrics) and its checks.")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point (``--serve PORT``: the server process)."""
    p = argparse.ArgumentParser(description=description(__doc__))
    p.add_argument("--n", type=at_least(4), nargs="+", default=[8, 64, 256], metavar="N",
                   help="world sizes (default 8 64 256; N >= 4)")
    p.add_argument("--repeat", type=at_least(1), default=3,
                   help="interleaved runs per N (default 3)")
    p.add_argument("--workload", choices=WORKLOADS, default="ring-pair",
                   help=f"the phases of a boundary, as bench/hot_path.py's (default ring-pair; "
                        f"mixed needs N >= {MIXED_MIN_N})")
    p.add_argument("--no-pin", action="store_true", help="do not pin server and generator")
    p.add_argument("--max-measured-s", type=positive_s, default=6.0,
                   help="stop a run after this long past warm-up (default 6)")
    p.add_argument("--cell-timeout-s", type=positive_s, default=90.0,
                   help="give up on a run after this long (a stall; default 90)")
    p.add_argument("--serve", type=int, metavar="PORT", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.serve is not None:
        uvloop.run(serve(a.serve))
        return 0
    small = [n for n in a.n if n < MIXED_MIN_N]
    if a.workload == "mixed" and small:
        p.error(f"--workload mixed: needs every N >= {MIXED_MIN_N}, got --n "
                f"{' '.join(map(str, small))}")
    if not loadgen_built():
        p.error(f"the C++ generator is not built: {BUILD_HINT}")
    try:
        return uvloop.run(amain(a.n, a.repeat, a.workload, not a.no_pin, a.max_measured_s,
                                a.cell_timeout_s))
    except LoadError as exc:
        print(f"grpc_floor: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
