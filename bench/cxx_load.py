"""The compiled load side of ``bench/hot_path.py``: ``bench/loadgen/loadgen.cc``, run from here.

``CxxLoad`` is a ``lean_load.LeanLoad`` whose ``run`` hands the work to the C++ binary
(``make loadgen`` builds it into ``bench/loadgen/build/loadgen``): the same wire, the same
streams, the same requests in the same order, the same timing points and stop rule, without
the Python client's own cost per message (~110 µs of CPU per write + read and two asyncio task
hops per phase instance), which inflates the measured latency at small N.

Python stays the single source of the workload rule: the spec file written here holds the
streams' ranks (``LeanLoad.streams``), each phase's serialized ``lightrail.v1.PhaseKey``
(``codec.phase_key_to_pb``), the enters of boundary 0 and ``LeanLoad._moves()`` per phase id;
the binary only executes it. Its results (one record per phase instance, the same fields as
``lean_load.PhaseInstance``) are parsed back into ``self.instances``, so ``measured()``,
``measured_instances()`` and ``window_s()`` are LeanLoad's own.

Both file formats are documented in ``loadgen.cc`` (``read_spec``, ``print_results``).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from lean_load import LeanLoad, LoadError, PhaseInstance, Workload
from support import Child

from lightrail.controller.api.codec import phase_key_to_pb


def loadgen_environment() -> dict[str, str]:
    """This process's environment without ``GRPC_EXPERIMENTS``: the binary links Debian's
    gRPC C++ (1.51), whose experiments are not grpcio's, and would only log the ones of the
    controller's setting (``lightrail.controller.cli.GRPC_ENVIRONMENT``, set in this process
    too) as unknown. The generator runs on its library's defaults, as the C++ reference did."""
    return {k: v for k, v in os.environ.items() if k != "GRPC_EXPERIMENTS"}


LOADGEN = Path(__file__).resolve().parent / "loadgen" / "build" / "loadgen"
"""Where ``make loadgen`` puts the binary."""

BUILD_HINT = ("make loadgen (needs: apt-get install -y libgrpc++-dev protobuf-compiler-grpc "
              "libprotobuf-dev protobuf-compiler pkg-config)")

SPEC_HEADER = "lightrail-loadgen-spec 1"

_GRACE_S = 10.0
"""How long past its own cell timeout the binary may take before it is killed."""


def loadgen_built(binary: Path = LOADGEN) -> bool:
    """Whether the binary is there and executable."""
    return binary.is_file() and bool(binary.stat().st_mode & 0o111)


@dataclass(frozen=True, slots=True)
class LoadgenCpu:
    """The binary's own CPU time (all its threads, s) when the measured window started (None:
    it never did) and at its end."""

    at_measured_s: float | None
    end_s: float


@dataclass(frozen=True, slots=True)
class LoadgenResults:
    """What the binary printed after its run: the final ``stop_at``, ``max_entered``, its CPU
    and every phase instance (``instances[b][phase_id]``, b = 0 .. the initial stop_at)."""

    stop_at: int
    max_entered: int
    cpu: LoadgenCpu
    instances: list[list[PhaseInstance]]


def _ranks(ranks: list[int]) -> str:
    return " ".join(map(str, [len(ranks), *ranks]))


def parse_results(lines: list[str], phases: int, boundaries: int) -> LoadgenResults:
    """Parse the binary's results (``loadgen.cc`` ``print_results``): ``boundaries`` rows of
    ``phases`` instances. Raises ``LoadError`` on anything else (a truncated or foreign
    output)."""
    stop_at: int | None = None
    max_entered: int | None = None
    cpu: LoadgenCpu | None = None
    rows: list[list[PhaseInstance | None]] = [[None] * phases for _ in range(boundaries)]
    ended = False
    for no, line in enumerate(lines, 1):
        f = line.split()
        try:
            if not f:
                continue
            if f[0] == "stop_at":
                stop_at = int(f[1])
            elif f[0] == "max_entered":
                max_entered = int(f[1])
            elif f[0] == "cpu":
                cpu = LoadgenCpu(None if f[1] == "-" else float(f[1]), float(f[2]))
            elif f[0] == "inst":
                b, pid, expected = int(f[1]), int(f[2]), int(f[3])
                inst = PhaseInstance(expected, last_send_s=float(f[5]),
                                     first_send_s=float(f[4]), released_s=float(f[6]),
                                     switched=f[7] == "1", device_s=float(f[8]))
                count = int(f[9])
                if len(f) != 10 + 2 * count:
                    raise ValueError(f"{count} admissions announced, {len(f) - 10} fields")
                inst.admit_s = [float(x) for x in f[10::2]]
                inst.admit_n = [int(x) for x in f[11::2]]
                inst.admitted = sum(inst.admit_n)
                rows[b][pid] = inst
            elif f[0] == "end":
                ended = True
                break
            else:
                raise ValueError(f"unknown record {f[0]!r}")
        except (ValueError, IndexError) as exc:
            raise LoadError(f"loadgen output line {no}: {exc}: {line[:200]!r}") from None
    missing = [(b, p) for b, row in enumerate(rows) for p, i in enumerate(row) if i is None]
    if not ended or stop_at is None or max_entered is None or cpu is None or missing:
        raise LoadError(f"loadgen output incomplete (end record: {ended}, stop_at "
                        f"{stop_at}, max_entered {max_entered}, cpu {cpu}, instances missing: "
                        f"{missing[:4]})")
    instances = [[i for i in row if i is not None] for row in rows]
    return LoadgenResults(stop_at, max_entered, cpu, instances)


class CxxLoad(LeanLoad):
    """``LeanLoad`` run by the C++ binary (``loadgen``): same constructor (plus ``binary``),
    same results. ``cpu``: the binary's CPU time after ``run``."""

    def __init__(self, target: str, job_id: str, workload: Workload, per_stream: int,
                 warmup: int, measured: int, max_measured_s: float,
                 timeout_s: float = 30.0, *, binary: Path = LOADGEN) -> None:
        if any(c.isspace() for c in target + job_id) or not target or not job_id:
            raise ValueError(f"target {target!r} / job id {job_id!r}: empty or with spaces")
        super().__init__(target, job_id, workload, per_stream, warmup, measured,
                         max_measured_s, timeout_s)
        self.binary = binary
        self.cpu: LoadgenCpu | None = None

    def spec(self, cell_timeout_s: float) -> str:
        """The spec file's text (format: ``loadgen.cc`` ``read_spec``)."""
        lines = [SPEC_HEADER, f"target {self.target}", f"job_id {self.job_id}",
                 f"timeout_s {self.timeout_s!r}", f"cell_timeout_s {cell_timeout_s!r}",
                 f"max_measured_s {self.max_measured_s!r}", f"warmup {self.warmup}",
                 f"stop_at {self.stop_at}"]
        for pid, key in enumerate(self.workload.phases):
            raw = phase_key_to_pb(key).SerializeToString()
            lines.append(f"phase {pid} {key.group.size} {raw.hex() or '-'}")
        lines += [f"stream {k} {_ranks(ranks)}" for k, ranks in enumerate(self.streams)]
        # LeanLoad._drive: every rank enters the first phase of its sequence in boundary 0
        first: dict[tuple[int, int], list[int]] = {}
        for r, seq in enumerate(self.workload.sequence):
            first.setdefault((self.stream_of[r], seq[0]), []).append(r)
        lines += [f"first {k} {pid} {_ranks(ranks)}" for (k, pid), ranks in first.items()]
        for pid, moves in enumerate(self._moves()):
            lines += [f"move {pid} {m.stream} {'-' if m.next_pid is None else m.next_pid} "
                      f"{int(m.wraps)} {_ranks(m.ranks)} {_ranks(m.next_ranks)}"
                      for m in moves]
        lines.append("end")
        return "\n".join(lines) + "\n"

    async def run(self, cell_timeout_s: float) -> None:
        """Run the binary over every boundary (``on_measured`` is called when it prints
        ``measuring``), then load its results. Raises ``LoadError`` (with the binary's
        stderr) when it fails, prints something else, or runs ``_GRACE_S`` past
        ``cell_timeout_s``."""
        if not loadgen_built(self.binary):
            raise LoadError(f"{self.binary} is not built: {BUILD_HINT}")
        with tempfile.TemporaryDirectory(prefix="lightrail-loadgen-") as tmp:
            spec_path = Path(tmp) / "spec.txt"
            spec_path.write_text(self.spec(cell_timeout_s), encoding="utf-8")
            proc = await Child.start([str(self.binary), str(spec_path)],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, env=loadgen_environment())
            assert proc.stdout is not None and proc.stderr is not None
            stderr = asyncio.create_task(proc.stderr.read())
            lines: list[str] = []
            try:
                async with asyncio.timeout(cell_timeout_s + _GRACE_S):
                    while raw := await proc.stdout.readline():
                        line = raw.decode(errors="replace").rstrip("\n")
                        if line == "measuring" and not lines:
                            if self.on_measured is not None:
                                self.on_measured()
                        else:
                            lines.append(line)
                    rc = await proc.wait()
                    err = (await stderr).decode(errors="replace").strip()
            except TimeoutError:
                raise LoadError(f"loadgen did not finish within {cell_timeout_s + _GRACE_S} s"
                                ) from None
            finally:
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()
                stderr.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await stderr
        if rc != 0:
            raise LoadError(f"loadgen exited with {rc}: {err or '(no message)'}")
        res = parse_results(lines, len(self.workload.phases), len(self.instances))
        sizes = [p.group.size for p in self.workload.phases]
        if any([i.expected for i in row] != sizes for row in res.instances):
            raise LoadError("loadgen output: phase sizes differ from the workload's")
        self.instances = res.instances
        self.stop_at = res.stop_at
        self.max_entered = res.max_entered
        self.cpu = res.cpu
        if not all(math.isfinite(i.first_send_s) for i in self.measured_instances()):
            raise LoadError("loadgen output: a measured phase instance was never entered")
