"""Instructions per phase boundary of the WHOLE controller process, gRPC edge included, under
the real load of ``bench/hot_path.py``: a repeatable figure for comparing two versions of the
hot path on a machine whose wall-clock speed swings by tens of percent.

Run: ``.venv/bin/python bench/controller_instructions.py [--n 8 256] [--boundaries 100 400]``
(needs ``valgrind``, Debian package ``valgrind``, and the C++ generator, ``make loadgen``).

Method: for each N, two ``hot_path.py`` ring-pair cells (batch32, C++ generator, one run, no
time cap) whose controller runs under ``valgrind --tool=callgrind`` (``--controller-wrapper``),
measuring ``--boundaries A B`` boundaries; callgrind's total of instructions executed in user
space by every thread of the controller process (Python, protobuf, gRPC C core, libc; not the
kernel) is read from its output file, and the figure is (total(B) - total(A)) / (B - A): start-up,
warm-up and shutdown cancel out. It does not depend on the machine's speed; thread
interleavings make it vary by about 1 % between runs. It does not count system calls' kernel
work, context switches or cache misses, which ``hot_path.py``'s CPU figures include: a change
that cuts instructions but adds wake-ups can look better here and be slower there.

Each cell takes about a minute (the controller runs ~50x slower under callgrind; the generator
and etcd run natively). Prints one line per N; exits 1 when a cell fails (its log tail on
stderr).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from cxx_load import BUILD_HINT, loadgen_built
from support import description

HOT_PATH = Path(__file__).resolve().with_name("hot_path.py")
_SUMMARY = re.compile(rb"^summary:\s*(\d+)", re.MULTILINE)


class CountError(RuntimeError):
    """A cell did not run, or left no callgrind total."""


def callgrind_total(path: Path) -> int:
    """The ``summary:`` total (instructions, all threads) of a callgrind output file. Raises
    ``CountError`` naming the file when it has none (the process was killed before exit)."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise CountError(f"{path}: cannot read the callgrind output: {exc.strerror}") from exc
    m = _SUMMARY.search(data)
    if m is None:
        raise CountError(f"{path}: no 'summary:' line (callgrind did not finish writing)")
    return int(m.group(1))


def per_boundary(total_a: int, boundaries_a: int, total_b: int, boundaries_b: int) -> float:
    """(total_b - total_a) / (boundaries_b - boundaries_a); raises ``ValueError`` unless
    ``boundaries_b > boundaries_a``."""
    if boundaries_b <= boundaries_a:
        raise ValueError(f"boundaries: need B > A, got A={boundaries_a}, B={boundaries_b}")
    return (total_b - total_a) / (boundaries_b - boundaries_a)


def run_cell(n: int, boundaries: int, workdir: Path, timeout_s: float) -> tuple[int, int]:
    """One hot_path cell of ``boundaries`` measured boundaries with the controller under
    callgrind; returns (measured boundaries, instructions). Raises ``CountError``."""
    out = workdir / f"callgrind.n{n}.b{boundaries}.%p"
    wrapper = f"valgrind --tool=callgrind --callgrind-out-file={out}"
    cmd = [sys.executable, str(HOT_PATH), "--n", str(n), "--workload", "ring-pair",
           "--transport", "batch32", "--generator", "cxx", "--repeat", "1", "--json",
           "--measured", str(boundaries), "--max-measured-s", "1e9",
           "--cell-timeout-s", str(timeout_s), "--controller-timeout-s", "600",
           "--controller-wrapper", wrapper]
    proc = subprocess.run(cmd, capture_output=True, timeout=timeout_s + 900, check=False)
    try:
        doc = json.loads(proc.stdout)
        cell = next(r for r in doc["results"] if r["transport"] == "batch32")
    except (ValueError, KeyError, StopIteration) as exc:
        raise CountError(f"N={n}, {boundaries} boundaries: hot_path.py exited "
                         f"{proc.returncode}: {proc.stderr.decode(errors='replace')[-1500:]}"
                         ) from exc
    if cell.get("error"):
        raise CountError(f"N={n}, {boundaries} boundaries: {cell['error']}")
    files = sorted(workdir.glob(f"callgrind.n{n}.b{boundaries}.*"))
    if len(files) != 1:
        raise CountError(f"N={n}, {boundaries} boundaries: expected one callgrind output, "
                         f"found {[f.name for f in files]}")
    return int(cell["boundaries"]), callgrind_total(files[0])


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point."""
    p = argparse.ArgumentParser(description=description(__doc__))
    p.add_argument("--n", type=int, nargs="+", default=[8, 256], metavar="N",
                   help="world sizes (default 8 256; N >= 4)")
    p.add_argument("--boundaries", type=int, nargs=2, default=[100, 400], metavar=("A", "B"),
                   help="measured boundaries of the two cells (default 100 400; B > A >= 1)")
    p.add_argument("--cell-timeout-s", type=float, default=1200.0,
                   help="give up on a cell after this long (default 1200)")
    a = p.parse_args(argv)
    if any(n < 4 for n in a.n):
        p.error("--n: every N must be >= 4")
    lo, hi = a.boundaries
    if not 1 <= lo < hi:
        p.error(f"--boundaries: need B > A >= 1, got {lo} {hi}")
    if shutil.which("valgrind") is None:
        p.error("valgrind is not installed (Debian: apt-get install valgrind)")
    if not loadgen_built():
        p.error(f"the C++ generator is not built: {BUILD_HINT}")
    status = 0
    print("controller instructions per boundary (callgrind, user space, all threads; "
          f"ring-pair, batch32, C++ generator; ({hi} - {lo} boundaries)):")
    for n in a.n:
        with tempfile.TemporaryDirectory(prefix="lightrail-callgrind-") as tmp:
            try:
                b_lo, i_lo = run_cell(n, lo, Path(tmp), a.cell_timeout_s)
                b_hi, i_hi = run_cell(n, hi, Path(tmp), a.cell_timeout_s)
                ir = per_boundary(i_lo, b_lo, i_hi, b_hi)
            except (CountError, ValueError, subprocess.TimeoutExpired) as exc:
                print(f"controller_instructions: {exc}", file=sys.stderr)
                status = 1
                continue
        print(f"  N={n}: {ir:,.0f} instructions per boundary, {ir / n:,.0f} per rank-boundary "
              f"(totals {i_lo:,} over {b_lo} and {i_hi:,} over {b_hi} boundaries)", flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
