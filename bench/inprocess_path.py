"""The controller's own hot path without gRPC: ring / pair boundaries (as ``bench/hot_path.py``)
driven straight into ``PhaseService.enter_many`` / ``release_many`` over the real coordinator,
reconciler and emulated driver, in one process.

Run: ``.venv/bin/python bench/inprocess_path.py [--n 8 64 256 2048] [--boundaries 200]
[--repeat 3]``. Prints CPU µs per boundary and per rank-boundary (median and range of the
repeats). Deterministic enough for ``valgrind --tool=callgrind`` (instructions per boundary
do not depend on the machine's speed): ``valgrind --tool=callgrind --callgrind-out-file=F
.venv/bin/python bench/inprocess_path.py --n 256 --boundaries 50 --repeat 1`` and compare the
totals of two versions. The gRPC edge (decode, encode, the stream tasks) is not included:
``bench/hot_path.py`` measures the whole path.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Sequence

import uvloop
from support import at_least, description

from lightrail.controller.core.coordinator import PhaseCoordinator
from lightrail.controller.core.decisions import Admit, Admitted, AdmittedBatch, Reject
from lightrail.controller.domain.fabric import rail_fabric
from lightrail.controller.domain.model import Collective, PhaseKey, ProcessGroup, RankPlacement
from lightrail.controller.logs import configure_logging
from lightrail.controller.runtime.events import EventBus
from lightrail.controller.runtime.phase_service import PhaseService
from lightrail.controller.runtime.reconciler import Reconciler
from lightrail.drivers.base import Driver
from lightrail.emulator.driver import make_driver
from lightrail.emulator.ocs import EmulatedFabricDevices

PER_STREAM = 32


class CountingSink:
    """Counts admitted ranks per phase instance; sets ``event`` when ``expected`` are in."""

    def __init__(self) -> None:
        self.admitted = 0
        self.expected = 0
        self.event = asyncio.Event()

    def deliver(self, decision: Admit | Reject) -> None:
        if isinstance(decision, Reject):
            raise RuntimeError(f"refused: {decision}")
        self._count(1)

    def deliver_admitted(self, decision: Admitted, entry: AdmittedBatch) -> None:
        self._count(len(entry.ranks))

    def _count(self, n: int) -> None:
        self.admitted += n
        if self.admitted >= self.expected:
            self.event.set()

    def expect(self, n: int) -> None:
        self.admitted = 0
        self.expected = n
        self.event.clear()


async def run(n: int, boundaries: int) -> float:
    """Run ``boundaries`` boundaries of N ranks; returns the CPU seconds they took."""
    fabric = rail_fabric("bench", n, 1, delay_s=0.0)
    devices = EmulatedFabricDevices()
    drivers: dict[str, Driver] = {}
    for sid, sw in fabric.switches.items():
        drivers[sid] = make_driver(sw.spec, devices)
        await drivers[sid].open()
    coordinator = PhaseCoordinator(fabric)
    coordinator.register_job("job", "t", [RankPlacement(r, f"host{r}", 0) for r in range(n)])
    reconciler = Reconciler(drivers)
    service = PhaseService(coordinator, reconciler, EventBus())
    ring = PhaseKey(ProcessGroup.of(range(n)), Collective.ALL_REDUCE)
    pair_ranks = (0, 8 if n >= 16 else n // 2)
    pair = PhaseKey(ProcessGroup.of(pair_ranks), Collective.SEND_RECV)
    streams = [list(range(k, min(n, k + PER_STREAM))) for k in range(0, n, PER_STREAM)]
    others = [[r for r in s if r not in pair_ranks] for s in streams]
    ring_sink, pair_sink = CountingSink(), CountingSink()
    try:
        async with asyncio.TaskGroup() as tg:
            reconciler.start(tg)
            service.start(tg)
            await reconciler.read_back_all()
            cpu0 = time.process_time()
            ring_sink.expect(n)
            for k, s in enumerate(streams):
                service.enter_many("job", s, ring, k, 30.0, ring_sink, 0)
            for b in range(boundaries):
                await asyncio.wait_for(ring_sink.event.wait(), 30)
                pair_sink.expect(2)
                more = b + 1 < boundaries
                nxt = CountingSink()
                nxt.expect(n)
                for k, s in enumerate(streams):
                    service.release_many("job", s, ring, b)
                    if k == 0:
                        service.enter_many("job", pair_ranks, pair, 1000 + b, 30.0, pair_sink,
                                           b)
                    if more and others[k]:
                        service.enter_many("job", others[k], ring, 2000 + b, 30.0, nxt, b + 1)
                await asyncio.wait_for(pair_sink.event.wait(), 30)
                service.release_many("job", pair_ranks, pair, b)
                if more:
                    service.enter_many("job", pair_ranks, ring, 3000 + b, 30.0, nxt, b + 1)
                ring_sink = nxt
            cpu = time.process_time() - cpu0
            await service.drain(5)
            await reconciler.stop()
    finally:
        for d in drivers.values():
            await d.close()
    return cpu


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point."""
    p = argparse.ArgumentParser(description=description(__doc__))
    p.add_argument("--n", type=at_least(4), nargs="+", default=[8, 64, 256, 2048], metavar="N",
                   help="world sizes (default 8 64 256 2048; N >= 4, as bench/hot_path.py)")
    p.add_argument("--boundaries", type=at_least(1), default=200, metavar="B",
                   help="measured boundaries per run (default 200)")
    p.add_argument("--repeat", type=at_least(1), default=3,
                   help="runs per N; the median and range are printed (default 3)")
    a = p.parse_args(argv)
    configure_logging("warning", "console")
    print(f"{'N':>5} {'boundaries':>10} {'us/boundary':>24} {'us/rank-boundary':>24}")
    for n in a.n:
        per_b = [uvloop.run(run(n, a.boundaries)) / a.boundaries * 1e6
                 for _ in range(a.repeat)]
        med = statistics.median(per_b)
        print(f"{n:>5} {a.boundaries:>10} {med:>10.0f} [{min(per_b):.0f}-{max(per_b):.0f}] "
              f"{med / n:>12.2f} [{min(per_b) / n:.2f}-{max(per_b) / n:.2f}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
