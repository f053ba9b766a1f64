"""bench/wake_floor.py, the pipe round-trip floor printed under bench/hot_path.py's table, and
bench/support.py, the helpers the benchmark scripts share (pinned children, the percentile)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

from support import Child, percentile, pinned_argv  # noqa: E402
from wake_floor import measure  # noqa: E402


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]  # 1..100
    assert percentile(values, 0.5) == 50.0
    assert percentile(values, 0.99) == 99.0
    assert percentile(values, 1.0) == 100.0
    assert percentile([7.0], 0.99) == 7.0
    assert percentile([3.0, 1.0, 2.0], 0.0) == 1.0
    assert percentile([], 0.5) == 0.0


def test_bad_rounds_and_cpus_are_refused_naming_the_option() -> None:
    cpu = min(os.sched_getaffinity(0))
    with pytest.raises(ValueError, match=r"--rounds: must be >= 1, got 0"):
        measure((cpu, cpu), 0)
    missing = max(os.sched_getaffinity(0)) + 1
    with pytest.raises(ValueError, match=rf"--cpus: CPU {missing} is not usable here"):
        measure((cpu, missing), 10)


def test_the_script_measures_both_figures_and_reaps_its_child() -> None:
    # in its own process, as bench/hot_path.py runs it (it forks)
    out = subprocess.run([sys.executable, str(BENCH / "wake_floor.py"), "--rounds", "50",
                          "--json"], capture_output=True, text=True, timeout=60, check=True)
    doc = json.loads(out.stdout)
    cores = sorted(os.sched_getaffinity(0))
    assert doc["across"]["cpus"] == [cores[0], cores[1] if len(cores) > 1 else cores[0]]
    assert doc["one_core"]["cpus"] == [cores[0], cores[0]]
    for fig in (doc["across"], doc["one_core"]):
        assert fig["rounds"] == 50
        assert 0 < fig["median_us"] <= fig["p99_us"]


def test_the_script_refuses_a_bad_option_with_usage() -> None:
    out = subprocess.run([sys.executable, str(BENCH / "wake_floor.py"), "--rounds", "0"],
                         check=False, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "--rounds: must be >= 1, got 0" in out.stderr


def test_pinned_argv_runs_the_command_on_that_core_only() -> None:
    cmd = [sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"]
    assert pinned_argv(cmd, None) == cmd
    cpu = max(os.sched_getaffinity(0))
    out = subprocess.run(pinned_argv(cmd, cpu), capture_output=True, text=True, timeout=60,
                         check=True)
    assert out.stdout.strip() == f"[{cpu}]"


async def test_child_reports_its_exit_status_to_asyncio() -> None:
    child = Child([sys.executable, "-c", "raise SystemExit(3)"])
    assert await asyncio.wait_for(child.wait(), 30) == 3
    assert child.returncode == 3
    assert await child.wait() == 3  # already reaped: at once


async def test_child_can_be_signalled_and_is_pinned() -> None:
    cpu = max(os.sched_getaffinity(0))
    child = Child([sys.executable, "-c", "import time; time.sleep(60)"], cpu)
    assert child.returncode is None
    child.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(child.wait(), 30) == -signal.SIGTERM
    pinned = Child([sys.executable, "-c", "import os; "
                    "raise SystemExit(sorted(os.sched_getaffinity(0)) != [int(os.environ['C'])])"],
                   cpu, env={**os.environ, "C": str(cpu)})
    assert await asyncio.wait_for(pinned.wait(), 30) == 0


async def test_a_child_started_with_pipes_is_read_from_the_loop() -> None:
    child = await Child.start(
        [sys.executable, "-c", "import sys; print('one'); print('two'); "
         "print('oops', file=sys.stderr); raise SystemExit(4)"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert child.stdout is not None and child.stderr is not None
    assert await asyncio.wait_for(child.stdout.readline(), 30) == b"one\n"
    rest, err, rc = await asyncio.wait_for(
        asyncio.gather(child.stdout.read(), child.stderr.read(), child.wait()), 30)
    assert (rest, err, rc) == (b"two\n", b"oops\n", 4)
    plain = Child([sys.executable, "-c", "pass"], stdout=subprocess.DEVNULL)
    assert plain.stdout is None and plain.stderr is None
    assert await asyncio.wait_for(plain.wait(), 30) == 0
