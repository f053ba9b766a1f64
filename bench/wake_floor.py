"""The machine's floor under ``bench/hot_path.py``'s latencies: how long one process takes to
wake another and hear back, across the two cores the benchmark pins the controller and the
generator to, and on one core for contrast.

Run: ``.venv/bin/python bench/wake_floor.py [--cpus 0 1] [--rounds 3000] [--json]``.
``bench/hot_path.py`` runs it once before its cells and prints the figures under its table.

Method: two processes pinned to ``--cpus`` A and B (two processes on A for the one-core
figure) bounce one byte over a pair of pipes ``--rounds`` times, blocking in ``read`` between
bounces, as the controller and the generator block in ``epoll_wait`` between messages. Each
round trip is timed on its own (``time.perf_counter_ns``, CLOCK_MONOTONIC); the report is the
median and the 99th percentile (nearest rank) in µs, after 200 unmeasured warm-up rounds.

Why it matters: every phase of ``hot_path.py``'s ring-pair workload costs at least one such
round trip (the generator's enter wakes the controller's core; its admission wakes the
generator's), on top of the controller's own work. On a virtual machine a wake of an idle
virtual CPU goes through the hypervisor (an inter-processor interrupt leaves the guest), so the
cross-core figure can be tens of µs where bare metal gives a few µs, and it swings with the
host's load. Python's own cost per bounce (a read and a write call, ~1-2 µs) is inside the
figures, so they are an upper bound of the kernel's and hypervisor's share.

Raises ``ValueError`` for fewer than 1 round or a CPU this process may not use (it names the
option and the value).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from support import description, percentile

WARMUP_ROUNDS = 200


@dataclass(frozen=True, slots=True)
class WakeFloor:
    """Round-trip wake times between two pinned processes, µs."""

    cpus: tuple[int, int]
    rounds: int
    median_us: float
    p99_us: float


def measure(cpus: tuple[int, int], rounds: int) -> WakeFloor:
    """Bounce one byte ``rounds`` times between a child pinned to ``cpus[1]`` and this process
    pinned to ``cpus[0]`` (restored afterwards). Forks: call it from a process without threads
    (``python bench/wake_floor.py`` does). Raises ``ValueError`` (rounds < 1, a CPU outside
    this process's affinity)."""
    if rounds < 1:
        raise ValueError(f"--rounds: must be >= 1, got {rounds}")
    allowed = os.sched_getaffinity(0)
    for cpu in cpus:
        if cpu not in allowed:
            raise ValueError(f"--cpus: CPU {cpu} is not usable here (allowed: "
                             f"{sorted(allowed)})")
    ping_r, ping_w = os.pipe()
    pong_r, pong_w = os.pipe()
    child = os.fork()
    if child == 0:  # the echo side
        try:
            os.sched_setaffinity(0, {cpus[1]})
            os.close(ping_w)
            os.close(pong_r)
            while os.read(ping_r, 1):
                os.write(pong_w, b"x")
        finally:
            os._exit(0)
    os.close(ping_r)
    os.close(pong_w)
    saved = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpus[0]})
    samples: list[float] = []
    try:
        for i in range(WARMUP_ROUNDS + rounds):
            t0 = time.perf_counter_ns()
            os.write(ping_w, b"x")
            if os.read(pong_r, 1) != b"x":
                raise RuntimeError("wake_floor: the echo process went away")
            if i >= WARMUP_ROUNDS:
                samples.append((time.perf_counter_ns() - t0) / 1e3)
    finally:
        os.close(ping_w)  # the child reads EOF and exits
        os.close(pong_r)
        os.waitpid(child, 0)
        os.sched_setaffinity(0, saved)
    return WakeFloor(cpus, rounds, percentile(samples, 0.5), percentile(samples, 0.99))


def main(argv: Sequence[str] | None = None) -> int:
    """Measure across ``--cpus`` A B and on A alone; print a line each (or ``--json``)."""
    p = argparse.ArgumentParser(description=description(__doc__))
    cores = sorted(os.sched_getaffinity(0))
    p.add_argument("--cpus", type=int, nargs=2, metavar=("A", "B"),
                   default=(cores[0], cores[1] if len(cores) > 1 else cores[0]),
                   help="the two cores (default: the first two this process may use)")
    p.add_argument("--rounds", type=int, default=3000,
                   help="measured round trips per figure (default 3000)")
    p.add_argument("--json", action="store_true", help="print JSON")
    a = p.parse_args(argv)
    try:
        across = measure((a.cpus[0], a.cpus[1]), a.rounds)
        one = measure((a.cpus[0], a.cpus[0]), a.rounds)
    except ValueError as exc:
        p.error(str(exc))
    if a.json:
        print(json.dumps({"across": asdict(across), "one_core": asdict(one)}))
    else:
        for name, f in (("across cores", across), ("on one core", one)):
            print(f"wake round trip {name} {f.cpus[0]}<->{f.cpus[1]}: median "
                  f"{f.median_us:.1f} us, p99 {f.p99_us:.1f} us ({f.rounds} rounds)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
