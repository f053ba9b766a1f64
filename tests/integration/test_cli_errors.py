"""The daemons and the replay, run as processes, answer an unreachable etcd or controller with
one line naming the address and the cause, and a non-zero exit code, not a traceback
(issue 10, section 3: 61 and 39 lines before)."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

ENTRY = "import sys; from lightrail.controller.cli.main import main; sys.exit(main())"


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def two_rank_trace(tmp_path: Path) -> Path:
    """An AICB workload: one all-reduce over 2 ranks."""
    trace = tmp_path / "job.csv"
    trace.write_text(
        "[rank0 ~ rank1]\n"
        "comm_type,comm_group,comm_group_size,msg_size,stage,dst,src,additional,"
        "_elapsed_time,algbw,busbw,count\n"
        "CommType.all_reduce,CommGroup.dp_group,2,1024,step,None,None,,None,None,None,1\n",
        encoding="utf-8")
    return trace


def lightrail(*args: str, timeout_s: float = 60.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", ENTRY, *args], capture_output=True, text=True,
                          timeout=timeout_s, check=False)


def test_controller_with_etcd_unreachable_says_so_in_one_line(tmp_path: Path) -> None:
    port = closed_port()
    config = tmp_path / "controller.yaml"
    config.write_text(
        f'controller: {{replica_id: t, listen: "127.0.0.1:{closed_port()}", '
        f'metrics_listen: "127.0.0.1:{closed_port()}"}}\n'
        f'etcd: {{endpoints: ["127.0.0.1:{port}"], lease_ttl_s: 5}}\n'
        "fabric: {builtin: demo-4x2}\n",
        encoding="utf-8")
    done = lightrail("controller", "--config", str(config))
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 3, done.stderr  # etcd unreachable at start (README "Exit codes")
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"lightrail controller: etcd 127.0.0.1:{port}: ")
    assert "etcd unavailable" in lines[0] and "Traceback" not in done.stderr


def test_replay_with_the_controller_unreachable_says_so_in_one_line(tmp_path: Path) -> None:
    trace = two_rank_trace(tmp_path)
    port = closed_port()
    done = lightrail("replay", str(trace), "--controller", f"127.0.0.1:{port}",
                     "--no-progress")
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 1, done.stderr
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"lightrail replay: controller 127.0.0.1:{port}: UNAVAILABLE: ")


def test_version_and_every_option_has_help() -> None:
    import argparse

    from lightrail.controller.cli.main import build_parser

    done = lightrail("--version")
    assert done.returncode == 0 and done.stdout.startswith("lightrail ")
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    missing = [f"{name} {opt.option_strings or opt.dest}"
               for name, cmd in sub.choices.items() for opt in cmd._actions
               if not opt.help and not isinstance(opt, argparse._HelpAction)]
    assert missing == []


def test_operator_command_without_a_controller_names_the_address_and_how_to_set_it() -> None:
    port = closed_port()
    done = lightrail("status", "--controller", f"127.0.0.1:{port}")
    assert done.returncode == 1
    assert f"127.0.0.1:{port}" in done.stderr and "LIGHTRAIL_CONTROLLER" in done.stderr
    assert "Traceback" not in done.stderr


async def test_a_closed_pipe_ends_quietly(ctl: object) -> None:
    """``lightrail hosts --json | head`` when the reader is gone before the output: no
    BrokenPipe traceback, the SIGPIPE exit code of a Unix tool."""
    import asyncio
    import os

    from lightrail.controller.app import RunningController
    from lightrail.controller.cli.main import EXIT_CLOSED_PIPE

    assert isinstance(ctl, RunningController)
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader went away before the command printed anything
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", ENTRY, "hosts", "--json", "--controller", ctl.grpc_target,
        stdout=write_end, stderr=asyncio.subprocess.PIPE)
    os.close(write_end)
    _, err_bytes = await asyncio.wait_for(proc.communicate(), 60)
    err = err_bytes.decode()
    assert proc.returncode == EXIT_CLOSED_PIPE, err
    assert "Traceback" not in err and "BrokenPipe" not in err


async def test_replay_summary_names_the_controllers_fabric(ctl: object, tmp_path: Path) -> None:
    """``lightrail replay --controller A`` names the fabric the controller serves and its
    reconfiguration delay, not the address in the fabric's place (issue 12)."""
    import asyncio

    from lightrail.controller.app import RunningController

    assert isinstance(ctl, RunningController)
    trace = two_rank_trace(tmp_path)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", ENTRY, "replay", str(trace), "--controller", ctl.grpc_target,
        "--no-progress", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, err.decode()
    assert (f"fabric demo-4x2 at {ctl.grpc_target} (reconfiguration delay 2 ms)"
            in out.decode()), out.decode()


async def test_jobs_shows_provisioning_and_explains_its_columns(ctl: object) -> None:
    import asyncio

    from lightrail.agents.client import ControllerClient
    from lightrail.controller.app import RunningController
    from lightrail.controller.domain.model import RankPlacement

    assert isinstance(ctl, RunningController)
    async with ControllerClient(ctl.grpc_target) as c:
        await c.register_job("jobs-cli", [RankPlacement(0, "host0", 0),
                                          RankPlacement(1, "host1", 0)])
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", ENTRY, "jobs", "--controller", ctl.grpc_target,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={"COLUMNS": "250", "PATH": "/usr/bin:/bin"})
    out_b, err = await asyncio.wait_for(proc.communicate(), 60)
    out = " ".join(out_b.decode().split())
    assert proc.returncode == 0, err.decode()
    for column in ("rank admissions", "schedule", "ahead", "late", "on demand"):
        assert column in out
    assert "jobs-cli" in out and "learning" in out
    assert "ahead / late / on demand: phases needing new circuits" in out
