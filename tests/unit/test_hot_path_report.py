"""bench/hot_path.py's report: the hypervisor's steal per cell (``steal%``) and the CPU other
processes took on the cell's cores (``other%``), their medians over the runs, the runs the
verdict line counts, and a cell without a reading shown as such rather than as 0."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import hot_path  # noqa: E402


def _run(repeat: int, steal: float | None, other: float | None = 0.0) -> hot_path.CellResult:
    return hot_path.CellResult("batch32", 8, 0.0, 8, repeat, boundaries=400, p50_ms=0.3,
                               p99_ms=0.5, boundaries_per_s=1300.0, phases_per_s=2600.0,
                               controller_us_per_boundary=700.0, steal_pct=steal,
                               other_pct=other)


def _options() -> hot_path.Options:
    return hot_path.Options(ns=(8,), delays_ms=(0.0,), transports=("batch32",), quick=False,
                            json=False, pair_dependency=False, max_measured_s=6.0,
                            cell_timeout_s=90.0, repeat=3, cpus=(0, 1))


def test_steal_pct_is_the_steal_seconds_over_the_wall_and_none_without_a_reading() -> None:
    assert hot_path.steal_pct(1.0, 1.25, 0.5) == pytest.approx(50.0)
    assert hot_path.steal_pct(None, 1.25, 0.5) is None
    assert hot_path.steal_pct(1.0, None, 0.5) is None
    assert hot_path.steal_pct(1.0, 1.0, 0.0) is None


def test_the_summary_takes_the_median_of_the_runs_that_measured_steal() -> None:
    (cell,) = hot_path.summarize([_run(0, 30.0), _run(1, None), _run(2, 2.0), _run(3, 4.0)])
    assert cell.steal_pct == hot_path.Spread(4.0, 2.0, 30.0)
    assert cell.contended_runs == 1  # 30 % only: 2 and 4 are below CONTENDED_STEAL_PCT
    (none,) = hot_path.summarize([_run(0, None), _run(1, None)])
    assert none.steal_pct is None


def test_the_table_prints_each_runs_steal_and_a_dash_where_it_was_not_measured(
    capsys: pytest.CaptureFixture[str],
) -> None:
    hot_path.print_table([_run(0, 12.4), _run(1, None), _run(2, 0.0)], _options(), 1.0)
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("batch32   ring-pair")]
    assert [row.split()[-2] for row in rows] == ["12%", "-", "0%"]
    assert "steal%" in out.splitlines()[0]
    assert "host steal 6 [0-12] % of a core" in out
    assert "1 of 3 runs had host steal >= 10 %" in out


def test_a_cell_without_contended_runs_says_nothing_of_steal_in_its_verdict(
    capsys: pytest.CaptureFixture[str],
) -> None:
    hot_path.print_table([_run(0, 0.0), _run(1, 9.9)], _options(), 1.0)
    out = capsys.readouterr().out
    verdict = next(line for line in out.splitlines() if "C++: p99" in line)
    assert verdict.endswith("(strict)")


def test_other_pct_is_the_busy_time_less_the_cells_own_cpu_floored_at_zero() -> None:
    assert hot_path.other_pct(10.0, 12.0, 1.5, 2.0) == pytest.approx(25.0)
    assert hot_path.other_pct(10.0, 12.0, 2.1, 2.0) == 0.0  # ticks against exact clocks
    assert hot_path.other_pct(None, 12.0, 1.5, 2.0) is None
    assert hot_path.other_pct(10.0, None, 1.5, 2.0) is None
    assert hot_path.other_pct(10.0, 12.0, 1.5, 0.0) is None


def test_runs_that_shared_their_cores_are_shown_and_counted_in_the_verdict(
    capsys: pytest.CaptureFixture[str],
) -> None:
    runs = [_run(0, 0.0, 65.0), _run(1, 0.0, 3.0), _run(2, 0.0, None)]
    (cell,) = hot_path.summarize(runs)
    assert cell.other_pct == hot_path.Spread(34.0, 3.0, 65.0)
    assert cell.shared_runs == 1
    hot_path.print_table(runs, _options(), 1.0)
    out = capsys.readouterr().out
    assert "other%" in out.splitlines()[0]
    rows = [line for line in out.splitlines() if line.startswith("batch32   ring-pair")]
    assert [row.split()[-1] for row in rows] == ["65%", "3%", "-"]
    assert "other processes 34 [3-65] % of a core" in out
    verdict = next(line for line in out.splitlines() if "C++: p99" in line)
    assert verdict.endswith("1 of 3 runs shared their cores with other processes "
                            "(>= 20 % of a core)")
