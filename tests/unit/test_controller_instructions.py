"""bench/controller_instructions.py: the callgrind total it reads and the per-boundary figure
it prints (the cells themselves need valgrind and minutes; not run here)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from controller_instructions import CountError, callgrind_total, per_boundary


def test_the_total_is_the_summary_line_of_the_output_file(tmp_path: Path) -> None:
    out = tmp_path / "callgrind.out.123"
    out.write_bytes(b"# callgrind format\nversion: 1\ncmd: lightrail controller\n"
                    b"events: Ir\nfl=(1) x.c\nfn=(1) f\n0 12\nsummary: 2798646763\n"
                    b"totals: 2798646763\n")
    assert callgrind_total(out) == 2_798_646_763


def test_an_output_without_a_summary_or_unreadable_names_the_file(tmp_path: Path) -> None:
    cut = tmp_path / "callgrind.out.9"
    cut.write_bytes(b"# callgrind format\nevents: Ir\nfn=(1) f\n0 12\n")  # killed mid-write
    with pytest.raises(CountError, match=r"callgrind\.out\.9: no 'summary:' line"):
        callgrind_total(cut)
    with pytest.raises(CountError, match=r"missing: cannot read the callgrind output"):
        callgrind_total(tmp_path / "missing")


def test_per_boundary_is_the_difference_over_the_extra_boundaries() -> None:
    assert per_boundary(1_000, 100, 4_000, 400) == 10.0
    with pytest.raises(ValueError, match="need B > A, got A=400, B=400"):
        per_boundary(1_000, 400, 4_000, 400)
