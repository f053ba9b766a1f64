"""Long-running commands show progress on a terminal and nothing of it when piped (issue 12
section 4): ``replay`` against a controller, ``evaluate`` and ``slices-eval`` as processes with
stdout and stderr piped carry no progress text and no ANSI codes; on a pseudo-terminal the bar
is drawn."""

from __future__ import annotations

import asyncio
import os
import pty
import subprocess
import sys
from pathlib import Path

from tests.integration.test_cli_errors import ENTRY, two_rank_trace

SLICES = ("slices-eval", "--torus", "4x4", "--requests", "60", "--seed", "1")


def piped(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", ENTRY, *args], capture_output=True, text=True,
                          timeout=120, check=False, env={**os.environ, "TERM": "xterm"})


def assert_quiet(done: subprocess.CompletedProcess[str], *progress_words: str) -> None:
    assert done.returncode == 0, done.stderr
    for stream in (done.stdout, done.stderr):
        assert "\x1b[" not in stream
        for word in progress_words:
            assert word not in stream


def test_evaluate_and_slices_eval_are_quiet_when_piped(tmp_path: Path) -> None:
    assert_quiet(piped("evaluate", str(two_rank_trace(tmp_path)), "--delay-ms", "1"),
                 "evaluating")
    done = piped(*SLICES)
    assert_quiet(done, "slices-eval:", "replaying")
    assert "rejection rate" in done.stdout


def test_slices_eval_draws_its_progress_on_a_terminal() -> None:
    """stderr on a pseudo-terminal: the bar's label and its count are drawn there."""
    leader, follower = pty.openpty()
    try:
        proc = subprocess.Popen([sys.executable, "-c", ENTRY, *SLICES],
                                stdout=subprocess.DEVNULL, stderr=follower,
                                env={**os.environ, "TERM": "xterm", "COLUMNS": "120"})
        os.close(follower)
        chunks: list[bytes] = []
        while True:
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            chunks.append(chunk)
        assert proc.wait(timeout=120) == 0
    finally:
        os.close(leader)
    drawn = b"".join(chunks).decode(errors="replace")
    assert "slices-eval: every policy replayed" in drawn and "3/3" in drawn
    assert "\x1b[" in drawn


async def test_replay_is_quiet_when_piped(ctl: object, tmp_path: Path) -> None:
    from lightrail.controller.app import RunningController

    assert isinstance(ctl, RunningController)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", ENTRY, "replay", str(two_rank_trace(tmp_path)), "--controller",
        ctl.grpc_target, "--iterations", "2", stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env={**os.environ, "TERM": "xterm"})
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    done = subprocess.CompletedProcess[str]([], proc.returncode or 0, out.decode(),
                                            err.decode())
    assert_quiet(done, "replaying")
    assert "Per-phase summary" in done.stdout
