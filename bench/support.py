"""What the benchmark scripts share: children started for asyncio code without Python code in
the forked process (``Child``), commands pinned to a core at exec (``pinned_argv``), a child's
CPU time (``proc_cpu_s``), the hypervisor's steal time and the busy time of given cores
(``cpu_steal_s``, ``cpu_busy_s``), the nearest-rank ``percentile`` of their latency figures,
and their command lines' checks (``at_least``, ``positive_s``, ``description``).

Every benchmark child started from a process that runs an event loop goes through ``Child``
(``bench/hot_path.py``'s controller, ``bench/cxx_load.py``'s C++ generator,
``bench/grpc_floor.py``'s barrier server): one way of spawning, not one per script.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import math
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any


def pinned_argv(argv: Sequence[str], cpu: int | None) -> list[str]:
    """``argv`` run on core ``cpu`` (None: as it is) through ``taskset -c`` (util-linux), so
    the benchmarks pin their child processes at exec, with no Python ``preexec_fn`` in the
    forked child (which can hang in CPython's after-fork hooks when the parent has threads:
    seen with uvloop, the child spinning in ``threading._after_fork``). Raises
    ``FileNotFoundError`` when ``taskset`` is not installed."""
    if cpu is None:
        return list(argv)
    taskset = shutil.which("taskset")
    if taskset is None:
        raise FileNotFoundError("taskset (util-linux) is needed to pin the benchmark's "
                                "processes; install util-linux or pass --no-pin")
    return [taskset, "-c", str(cpu), *argv]


class Child:
    """A child process for asyncio code, started with ``subprocess.Popen`` (CPython's C
    fork + exec: no Python code runs in the forked child). ``asyncio.create_subprocess_exec``
    under uvloop runs the interpreter's after-fork hooks in the child; forked from a process
    whose threads are starting or ending (gRPC's poller, executor threads), that child was
    seen spinning in ``threading._after_fork`` and never reaching its exec. The attributes
    ``asyncio.subprocess.Process`` offers that the benchmarks use: ``pid``, ``returncode``,
    ``send_signal``, ``kill``, ``wait`` and, for a child made with ``start``, ``stdout`` and
    ``stderr``."""

    def __init__(self, argv: Sequence[str], cpu: int | None = None, **popen: Any) -> None:
        """Start ``argv`` on core ``cpu`` (``pinned_argv``); ``popen``: ``subprocess.Popen``
        keywords (``stdin``, ``stdout``, ``stderr``, ``env``). A ``subprocess.PIPE`` output is
        read through ``start`` instead. Raises ``OSError``."""
        self._popen: subprocess.Popen[bytes] = subprocess.Popen(pinned_argv(argv, cpu), **popen)
        self.stdout: asyncio.StreamReader | None = None
        self.stderr: asyncio.StreamReader | None = None
        self._transports: list[asyncio.BaseTransport] = []

    @classmethod
    async def start(cls, argv: Sequence[str], cpu: int | None = None, **popen: Any) -> Child:
        """``Child(argv, cpu, **popen)``, with each output given as ``subprocess.PIPE``
        readable as an ``asyncio.StreamReader`` (``stdout``, ``stderr``) in the running loop.
        Raises ``OSError``."""
        child = cls(argv, cpu, **popen)
        loop = asyncio.get_running_loop()
        for name in ("stdout", "stderr"):
            pipe = getattr(child._popen, name)
            if pipe is None:
                continue
            reader = asyncio.StreamReader()
            transport, _ = await loop.connect_read_pipe(
                functools.partial(asyncio.StreamReaderProtocol, reader), pipe)
            child._transports.append(transport)
            setattr(child, name, reader)
        return child

    @property
    def pid(self) -> int:
        return self._popen.pid

    @property
    def returncode(self) -> int | None:
        return self._popen.poll()

    def send_signal(self, sig: int) -> None:
        self._popen.send_signal(sig)

    def kill(self) -> None:
        self._popen.kill()

    async def wait(self) -> int:
        """Until the child exits (its pidfd becomes readable in the running loop: no thread,
        no SIGCHLD handler); its exit status."""
        if self._popen.poll() is None:
            loop = asyncio.get_running_loop()
            fd = os.pidfd_open(self._popen.pid)  # not reaped yet: the pid is still the child
            exited: asyncio.Future[None] = loop.create_future()

            def readable() -> None:
                if not exited.done():
                    exited.set_result(None)

            loop.add_reader(fd, readable)
            try:
                await exited
            finally:
                loop.remove_reader(fd)
                os.close(fd)
        for transport in self._transports:  # the pipes' ends (their readers keep what came)
            transport.close()
        return self._popen.wait()


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..1; 0.0 for no values). ``bench/hot_path.py``'s
    latencies use it too."""
    if not values:
        return 0.0
    s = sorted(values)
    return s[max(0, min(len(s) - 1, math.ceil(q * len(s)) - 1))]


_CPUCLOCK_SCHED = 2
_CLK_TCK = os.sysconf("SC_CLK_TCK")


def proc_cpu_s(pid: int | None) -> float:
    """User + system CPU seconds of process ``pid``, every thread included (those that have
    exited too), to the nanosecond: its process CPU-time clock, the clock id that glibc's
    ``clock_getcpuclockid(3)`` computes (Linux ``MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED)``:
    ``(~pid << 3) | 2``). Falls back to ``/proc/PID/stat``'s utime + stime (in clock ticks,
    1/``SC_CLK_TCK`` s) if the clock cannot be read; 0.0 if ``pid`` is None or gone."""
    if pid is None:
        return 0.0
    try:
        return time.clock_gettime((~pid << 3) | _CPUCLOCK_SCHED)
    except OSError:
        pass
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK


STEAL_FIELD = 8
"""Index of ``steal`` in a ``/proc/stat`` ``cpu`` line split on whitespace (the name is 0:
user nice system idle iowait irq softirq steal; proc(5), kernels since 2.6.11)."""

BUSY_FIELDS = (1, 2, 3, 6, 7)
"""Indexes of ``user``, ``nice``, ``system``, ``irq`` and ``softirq`` in a ``/proc/stat``
``cpu`` line: the time the CPU was not idle, waiting on I/O or stolen (``user`` includes guest
time, proc(5))."""


def _cpu_seconds(cpus: Iterable[int] | None, stat: str | None, columns: Sequence[int],
                 what: str) -> float | None:
    """``columns`` of the ``cpu`` lines of ``/proc/stat`` (``stat``: its text; None: read it)
    summed over ``cpus`` (None: the ``cpu`` line, every CPU), in seconds (``USER_HZ`` =
    ``SC_CLK_TCK`` ticks). None where the file cannot be read or a line lacks a column.
    Raises ``ValueError`` naming ``what`` and the line when a column is not a number, and
    naming the CPU when ``cpus`` holds one the file lacks."""
    if stat is None:
        try:
            stat = Path("/proc/stat").read_text(encoding="ascii")
        except OSError:
            return None
    want = {"cpu"} if cpus is None else {f"cpu{c}" for c in cpus}
    last = max(columns)
    ticks = 0
    for line in stat.splitlines():
        fields = line.split()
        if not fields or fields[0] not in want:
            continue
        want.discard(fields[0])
        if len(fields) <= last:
            return None
        try:
            ticks += sum(int(fields[i]) for i in columns)
        except ValueError:
            raise ValueError(f"/proc/stat: {what} of {fields[0]!r} is not a number: "
                             f"{line!r}") from None
    if want:
        raise ValueError(f"/proc/stat: no line for {', '.join(sorted(want))}")
    return ticks / _CLK_TCK


def cpu_steal_s(cpus: Iterable[int] | None = None, stat: str | None = None) -> float | None:
    """Seconds the hypervisor ran something else while these virtual CPUs wanted to run: the
    ``steal`` column of ``/proc/stat`` (proc(5), in ``USER_HZ`` = ``SC_CLK_TCK`` ticks),
    summed over ``cpus`` (None: the ``cpu`` line, every CPU). ``stat``: the file's text (None:
    read it). Returns None where the file cannot be read or has no steal column (not
    virtualised, or an old kernel). Raises ``ValueError`` naming the line when a ``cpu`` line
    is not numbers, and naming the CPU when ``cpus`` holds one the file lacks."""
    return _cpu_seconds(cpus, stat, (STEAL_FIELD,), "steal")


def cpu_busy_s(cpus: Iterable[int] | None = None, stat: str | None = None) -> float | None:
    """Seconds these CPUs were busy, with any process or interrupt (``BUSY_FIELDS`` of
    ``/proc/stat``), summed over ``cpus`` (None: every CPU): over a benchmark cell, less the
    CPU time of the cell's own processes, what other processes took from its cores. The
    kernel samples these columns at each tick, while ``proc_cpu_s`` is exact: over a cell of a
    few seconds the two differ by up to about 13 % of a core on this VM, either way. Returns
    None where the file cannot be read; raises ``ValueError`` as ``cpu_steal_s``."""
    return _cpu_seconds(cpus, stat, BUSY_FIELDS, "busy time")


def at_least(minimum: int) -> Callable[[str], int]:
    """An argparse ``type``: an integer >= ``minimum``. A bad value fails the command line
    as ``argument --OPTION: must be an integer >= MINIMUM, got VALUE``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"must be an integer >= {minimum}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be an integer >= {minimum}, got {value}")
        return value

    return parse


def positive_s(text: str) -> float:
    """An argparse ``type``: a finite number of seconds > 0 (``nan``, ``inf``, 0 and negative
    values fail as ``argument --OPTION: must be a number > 0, got VALUE``)."""
    return _finite(text, 0.0, strict=True)


def nonnegative_ms(text: str) -> float:
    """An argparse ``type``: a finite number of milliseconds >= 0 (``nan``, ``inf`` and
    negative values fail as ``argument --OPTION: must be a number >= 0, got VALUE``)."""
    return _finite(text, 0.0, strict=False)


def _finite(text: str, bound: float, *, strict: bool) -> float:
    what = f"a number {'>' if strict else '>='} {bound:g}"
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}") from None
    if not math.isfinite(value) or value < bound or (strict and value == bound):
        raise argparse.ArgumentTypeError(f"must be {what}, got {text}")
    return value


def description(doc: str | None) -> str | None:
    """A script's ``--help`` description: the first paragraph of its module docstring, on one
    line, with reST's double backquotes as single ones."""
    if not doc:
        return None
    first = doc.strip().split("\n\n", 1)[0]
    return " ".join(first.split()).replace("``", "`")

