"""The one progress display of the long-running commands (controller/cli/progress.py): drawn on
a terminal, nothing at all when the stream is not one; the fault campaign's bar follows its
runs (issue 12 section 4)."""

from __future__ import annotations

import io
import sys
from pathlib import Path

from rich.console import Console

from lightrail.controller.cli.progress import progress_display

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import faults


def terminal() -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, force_terminal=True, width=100), buf


def test_the_bar_renders_on_a_terminal() -> None:
    console, buf = terminal()
    with progress_display("replaying job.csv", 5, console=console) as bar:
        assert bar.shown
        bar.update(3)
    text = buf.getvalue()
    assert "replaying job.csv" in text and "3/5" in text
    assert "\x1b[" in text  # drawn with terminal control codes


def test_nothing_is_written_when_the_stream_is_not_a_terminal() -> None:
    buf = io.StringIO()
    with progress_display("replaying job.csv", 5, console=Console(file=buf)) as bar:
        assert not bar.shown
        bar.update(5, description="done")
    assert buf.getvalue() == ""


def test_disabled_draws_nothing_even_on_a_terminal() -> None:
    console, buf = terminal()
    with progress_display("replaying", 2, console=console, enabled=False) as bar:
        bar.update(1)
    assert not bar.shown and buf.getvalue() == ""


def test_the_fault_campaign_bar_counts_each_cases_runs() -> None:
    plan = faults.Plan(kills=2, pauses=1, cases=("leader-kill", "leader-pause"))
    assert faults.planned_runs(plan) == {"leader-kill": 2, "leader-pause": 1}
    console, buf = terminal()
    with faults.campaign_progress(plan, console) as bar:
        kill = faults.CaseResult("leader-kill")
        kill.count_run()
        kill.count_run()
        assert bar.progress.tasks[0].completed == 2
        assert bar.progress.tasks[0].description == "fault campaign: leader-kill 2/2"
        faults.CaseResult("leader-pause").count_run()
    text = buf.getvalue()  # the bar as last drawn (rich redraws at its own pace meanwhile)
    assert "fault campaign: leader-pause 1/1" in text and "3/3" in text
    assert faults.RUN_LISTENERS == []  # removed when the block ends
    quiet = io.StringIO()
    with faults.campaign_progress(plan, Console(file=quiet)):
        faults.CaseResult("leader-kill").count_run()
    assert quiet.getvalue() == ""
