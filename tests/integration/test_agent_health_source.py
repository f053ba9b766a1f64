"""``lightrail agent --health`` (issue 12, section 3): the NVML source is the default and,
where NVML is missing, the agent fails at start with one line naming NVML and the option;
emulated GPUs only when asked (the demo and tests pass ``--health emulated``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from lightrail.agents.host.nvml import NvmlHealthSource
from lightrail.agents.host.nvml_binding import NvmlUnavailableError


async def nvml_works() -> bool:
    probe = NvmlHealthSource("probe")
    try:
        await probe.open()
    except NvmlUnavailableError:
        return False
    await probe.close()
    return True


async def test_agent_without_nvml_fails_at_start_naming_nvml_and_the_option(
    tmp_path: Path,
) -> None:
    if await nvml_works():
        pytest.skip("NVML works on this machine: nothing is missing")
    run = subprocess.run(  # noqa: ASYNC221  # a short-lived child; nothing else runs meanwhile
        [sys.executable, "-m", "lightrail.controller.cli.main", "agent", "--controller",
         "127.0.0.1:1", "--socket", str(tmp_path / "agent.sock"), "--host", "gpu-a"],
        capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode == 1, run.stderr
    line = run.stderr.strip().splitlines()[-1]
    assert line.startswith("lightrail agent: NVML unavailable on host gpu-a: "), line
    assert "--health emulated" in line
    assert not (tmp_path / "agent.sock").exists()  # it served nothing
