"""bench/support.py: a child's CPU time to the nanosecond, exited threads included
(``proc_cpu_s``); the hypervisor's steal time (``cpu_steal_s``) and the cores' busy time
(``cpu_busy_s``); the command lines' value checks;
the ``--help`` description."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import support  # noqa: E402

_SPIN_IN_A_THREAD = """
import sys, threading, time
def spin():
    end = time.process_time() + 0.25
    while time.process_time() < end:
        pass
t = threading.Thread(target=spin)
t.start()
t.join()  # the thread has exited: its CPU time must still count
print("spun", flush=True)
sys.stdin.read()
"""


def test_proc_cpu_s_counts_an_exited_thread_and_agrees_with_proc_stat() -> None:
    child = subprocess.Popen([sys.executable, "-c", _SPIN_IN_A_THREAD],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline() == "spun\n"
        precise = support.proc_cpu_s(child.pid)
        fields = Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[1].split()
        ticks = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        assert precise >= 0.25  # the exited thread's 0.25 s of CPU is in
        assert abs(precise - ticks) < 0.05  # the same figure; ticks are 10 ms coarse
        assert precise != round(precise, 2)  # not in clock ticks
    finally:
        child.communicate("", timeout=30)
    assert support.proc_cpu_s(child.pid) == 0.0  # reaped: gone
    assert support.proc_cpu_s(None) == 0.0


def test_proc_cpu_s_of_this_process_rises_with_its_work() -> None:
    before = support.proc_cpu_s(os.getpid())
    end = time.process_time() + 0.05
    while time.process_time() < end:
        pass
    assert support.proc_cpu_s(os.getpid()) - before >= 0.05


@pytest.mark.parametrize(("check", "text", "says"), [
    (support.at_least(4), "3", "must be an integer >= 4, got 3"),
    (support.at_least(1), "x", "must be an integer >= 1, got 'x'"),
    (support.at_least(1), "1.5", "must be an integer >= 1, got '1.5'"),
    (support.positive_s, "0", "must be a number > 0, got 0"),
    (support.positive_s, "-0.5", "must be a number > 0, got -0.5"),
    (support.positive_s, "nan", "must be a number > 0, got nan"),
    (support.positive_s, "inf", "must be a number > 0, got inf"),
    (support.positive_s, "soon", "must be a number > 0, got 'soon'"),
    (support.nonnegative_ms, "-1", "must be a number >= 0, got -1"),
    (support.nonnegative_ms, "nan", "must be a number >= 0, got nan"),
])
def test_a_bad_value_is_refused_naming_it(
    check: object, text: str, says: str
) -> None:
    assert callable(check)
    with pytest.raises(argparse.ArgumentTypeError, match="^" + says.replace("+", r"\+") + "$"):
        check(text)


def test_good_values_pass() -> None:
    assert support.at_least(4)("4") == 4
    assert support.positive_s("0.25") == 0.25
    assert support.nonnegative_ms("0") == 0.0


def test_the_description_is_the_whole_first_paragraph() -> None:
    doc = """The first ``sentence`` runs
    on to a second line.

    Later paragraphs stay out."""
    assert support.description(doc) == "The first `sentence` runs on to a second line."
    assert support.description(None) is None


_STAT = """cpu  1812040 9 346849 7871235 150647 0 30224 52536 0 0
cpu0 710100 9 142258 4216658 23520 0 13795 24647 0 0
cpu1 1101940 0 204591 3654577 127127 0 16428 27888 0 0
intr 1 2 3
"""


def test_cpu_steal_s_sums_the_steal_column_of_the_cores_asked() -> None:
    tick = os.sysconf("SC_CLK_TCK")
    assert support.cpu_steal_s((0,), _STAT) == pytest.approx(24647 / tick)
    assert support.cpu_steal_s((0, 1), _STAT) == pytest.approx((24647 + 27888) / tick)
    assert support.cpu_steal_s(None, _STAT) == pytest.approx(52536 / tick)


def test_cpu_steal_s_without_a_steal_column_is_none() -> None:
    old_kernel = "cpu  1 2 3 4 5 6 7\ncpu0 1 2 3 4 5 6 7\n"
    assert support.cpu_steal_s((0,), old_kernel) is None
    assert support.cpu_steal_s(None, old_kernel) is None


def test_cpu_steal_s_refuses_a_malformed_line_or_a_missing_cpu_naming_it() -> None:
    with pytest.raises(ValueError,
                       match=r"steal of 'cpu1' is not a number: 'cpu1 1 2 3 4 5 6 7 x'"):
        support.cpu_steal_s((1,), "cpu0 1 2 3 4 5 6 7 8\ncpu1 1 2 3 4 5 6 7 x\n")
    with pytest.raises(ValueError, match=r"no line for cpu7"):
        support.cpu_steal_s((0, 7), _STAT)


def test_cpu_busy_s_sums_user_nice_system_irq_and_softirq_of_the_cores_asked() -> None:
    tick = os.sysconf("SC_CLK_TCK")
    cpu0 = 710100 + 9 + 142258 + 0 + 13795  # not idle (4216658), iowait (23520), steal
    cpu1 = 1101940 + 0 + 204591 + 0 + 16428
    assert support.cpu_busy_s((0,), _STAT) == pytest.approx(cpu0 / tick)
    assert support.cpu_busy_s((0, 1), _STAT) == pytest.approx((cpu0 + cpu1) / tick)
    assert support.cpu_busy_s(None, _STAT) == pytest.approx(
        (1812040 + 9 + 346849 + 0 + 30224) / tick)


def test_cpu_busy_s_refuses_a_malformed_line_naming_it_and_is_none_without_the_columns() -> None:
    with pytest.raises(ValueError,
                       match=r"busy time of 'cpu0' is not a number: 'cpu0 1 x 3 4 5 6 7 8'"):
        support.cpu_busy_s((0,), "cpu0 1 x 3 4 5 6 7 8\n")
    assert support.cpu_busy_s((0,), "cpu0 1 2 3 4\n") is None  # no irq, softirq columns
    with pytest.raises(ValueError, match=r"no line for cpu3"):
        support.cpu_busy_s((3,), _STAT)


def test_cpu_busy_s_counts_a_process_spinning_on_the_core() -> None:
    cpu = sorted(os.sched_getaffinity(0))[0]
    before = support.cpu_busy_s((cpu,))
    subprocess.run(  # check: a spinner that did not run fails here, not in the sum below
        ["taskset", "-c", str(cpu), sys.executable, "-c",
         "import time\nend = time.process_time() + 0.5\nwhile time.process_time() < end: pass"],
        check=True)
    after = support.cpu_busy_s((cpu,))
    assert before is not None and after is not None
    # 0.5 s of CPU on that core, less the ticks sampling can miss (up to 10 % here)
    assert after - before >= 0.4


def test_cpu_steal_s_reads_this_machine() -> None:
    steal = support.cpu_steal_s((0,))
    # this machine is a VM (README): /proc/stat has the column, and a counter never runs back
    assert steal is not None and steal >= 0.0
    later = support.cpu_steal_s((0,))
    assert later is not None and later >= steal
