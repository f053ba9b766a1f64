"""``lightrail ARGV`` run in a thread of the test process (the CLI runs its own event loop), for
tests whose controller runs in-process: exit code, stdout and stderr."""

from __future__ import annotations

import asyncio
import io
from contextlib import redirect_stderr, redirect_stdout

from lightrail.controller.cli.main import main as cli_main


async def cli_in_thread(*argv: str) -> tuple[int, str, str]:
    """Run ``lightrail ARGV`` in a worker thread; returns (exit code, stdout, stderr).
    ``redirect_stdout`` is process-wide: an in-process controller's log lines land there too."""
    out, err = io.StringIO(), io.StringIO()

    def run() -> int:
        with redirect_stdout(out), redirect_stderr(err):
            return cli_main(list(argv))

    rc = await asyncio.to_thread(run)
    return rc, out.getvalue(), err.getvalue()
