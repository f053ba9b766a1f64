"""``lightrail controller`` exit codes (issue 14 section 5, README "Exit codes"): each way the
daemon ends has its own documented code and one line naming the cause; ``--debug`` adds the
traceback."""

from __future__ import annotations

import asyncio
import json
import socket
import sys
from pathlib import Path

import yaml

from lightrail.controller.app import LeadershipLost, TlsSetupError
from lightrail.controller.cli.daemons import controller_failure
from lightrail.controller.cli.exitcodes import ExitCode
from lightrail.controller.store.errors import StoreError
from lightrail.controller.store.etcd import EtcdStore
from lightrail.controller.store.etcd_server import EmbeddedEtcd
from lightrail.drivers.base import DeviceUnreachable

CONTROLLER = [sys.executable, "-m", "lightrail.controller"]
WAIT_S = 60.0


def dead_endpoint() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def write_config(tmp_path: Path, endpoint: str, **controller: object) -> Path:
    path = tmp_path / "controller.yaml"
    path.write_text(yaml.safe_dump({
        "controller": {"replica_id": "exit-test", "listen": "127.0.0.1:0",
                       "metrics_listen": "127.0.0.1:0", "shutdown_timeout_s": 2.0,
                       **controller},
        "etcd": {"endpoints": [endpoint], "lease_ttl_s": 2.0},
        "fabric": {"builtin": "demo-4x2"},
        "logging": {"level": "error", "format": "console"},
    }))
    return path


async def run(*args: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        *CONTROLLER, *args, stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE)
    _, err = await asyncio.wait_for(proc.communicate(), WAIT_S)
    return proc.returncode if proc.returncode is not None else -1, err.decode()


async def test_debug_adds_the_traceback_to_the_one_line(tmp_path: Path) -> None:
    """etcd unreachable at start (3; the one line itself: test_cli_errors) with ``--debug``."""
    endpoint = dead_endpoint()
    rc, err = await run("--config", str(write_config(tmp_path, endpoint)), "--debug")
    assert rc == 3 and rc == ExitCode.STORE_UNAVAILABLE
    assert "Traceback (most recent call last)" in err
    assert err.strip().splitlines()[-1].startswith(f"lightrail controller: etcd {endpoint}: ")


async def test_config_error_is_2(tmp_path: Path) -> None:
    path = write_config(tmp_path, dead_endpoint(), admission_timeout_s=-1)
    rc, err = await run("--config", str(path))
    assert rc == 2 and rc == ExitCode.CONFIG_ERROR
    assert "controller.admission_timeout_s" in err and "Traceback" not in err


async def test_a_fenced_leader_exits_4_with_one_line(etcd: EmbeddedEtcd, tmp_path: Path) -> None:
    path = write_config(tmp_path, etcd.endpoint)
    proc = await asyncio.create_subprocess_exec(
        *CONTROLLER, "--config", str(path), "--announce", stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    assert proc.stdout is not None
    try:
        line = await asyncio.wait_for(proc.stdout.readline(), WAIT_S)
        assert json.loads(line)["grpc"]
        async with EtcdStore.connect(etcd.endpoint) as store:
            assert await store.delete("leader")  # as when etcd expires the leader's lease
        _, raw = await asyncio.wait_for(proc.communicate(), WAIT_S)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    err = raw.decode()
    assert proc.returncode == 4 and proc.returncode == ExitCode.FENCED, err
    assert err.strip().splitlines()[-1] == (
        "lightrail controller: leader lease not renewed within half its TTL; fenced")
    assert "Traceback" not in err


def test_the_most_telling_error_of_a_task_group_decides() -> None:
    endpoints = ["10.0.0.1:2379", "10.0.0.2:2379"]
    group = BaseExceptionGroup("tasks", [RuntimeError("boom"), StoreError("range: timed out")])
    f = controller_failure(group, endpoints)
    assert f.code is ExitCode.STORE_UNAVAILABLE
    assert f.message == "etcd 10.0.0.1:2379, 10.0.0.2:2379: range: timed out"
    nested = ExceptionGroup("outer", [ExceptionGroup("inner", [LeadershipLost("fenced")]),
                                      DeviceUnreachable("ocs-0", "no answer")])
    assert controller_failure(nested, endpoints).code is ExitCode.FENCED
    assert controller_failure(DeviceUnreachable("ocs-0", "refused"), endpoints).code is \
        ExitCode.DEVICE_UNAVAILABLE
    assert controller_failure(TlsSetupError("cert_file: no such file"), endpoints).code is \
        ExitCode.CONFIG_ERROR
    bug = controller_failure(ExceptionGroup("g", [KeyError("x")]), endpoints)
    assert bug.code is ExitCode.INTERNAL_ERROR
    assert bug.message == ("internal error: KeyError: 'x' (a bug: run with --debug for the "
                           "traceback and report it)")
    assert "\n" not in controller_failure(RuntimeError("two\nlines"), endpoints).message
