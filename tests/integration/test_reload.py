"""Config reload and systemd notifications of a real ``lightrail controller`` process on a real
etcd (issue 12, section 3).

The process runs under a test ``$NOTIFY_SOCKET`` (a datagram socket this test reads, as systemd
would) with a watchdog asked for: READY=1 once it serves, WATCHDOG=1 keep-alives, a job's phases
admitted; SIGHUP with a good file applies it (RELOADING=1 then READY=1; the new operator list
is in force: a loopback call without a token is now refused); SIGHUP with a bad file keeps the
running configuration (failure metric, phases still admitted, the same leader lease);
``lightrail reload`` of a change that needs a restart is refused naming the field; SIGTERM ends
it with STOPPING=1 and exit 0 (before, SIGHUP killed the daemon: rc 129, no lease resign).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import sys
import urllib.request
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from lightrail.agents.client import ControllerClient
from lightrail.controller.api.auth import token_sha256
from lightrail.controller.cli.embedded import embedded_config
from lightrail.controller.config import FabricSection
from lightrail.controller.domain.model import Collective, PhaseKey, ProcessGroup, RankPlacement
from lightrail.controller.store.etcd import EtcdStore
from lightrail.controller.store.etcd_server import EmbeddedEtcd
from tests.cli_thread import cli_in_thread

WAIT_S = 30.0
"""Bound on each wait (a deadline, not a timing assertion)."""
TOKEN = "reload-oncall-token"
PLACE = [RankPlacement(0, "host0", 0), RankPlacement(1, "host1", 0)]


@dataclass
class Notifications:
    """Every datagram the controller sent to the test's ``$NOTIFY_SOCKET``, as line lists."""

    sock: socket.socket
    messages: list[list[str]] = field(default_factory=list)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)

    async def collect(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            data = await loop.sock_recv(self.sock, 4096)
            self.messages.append(data.decode().split("\n"))
            self.arrived.set()

    async def until(self, found: Callable[[list[list[str]]], bool]) -> None:
        async with asyncio.timeout(WAIT_S):
            while not found(self.messages):
                self.arrived.clear()
                await self.arrived.wait()

    def count(self, line: str) -> int:
        return sum(line in m for m in self.messages)

    def after_last(self, line: str) -> list[list[str]]:
        """The messages after the last one holding ``line``."""
        at = max(i for i, m in enumerate(self.messages) if line in m)
        return self.messages[at + 1:]


def write_config(path: Path, data: dict[str, Any]) -> None:
    path.write_text(yaml.safe_dump(data), encoding="utf-8")


def read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def samples(url: str) -> dict[tuple[str, str], float]:
    """(sample name, label values joined by ',') -> value of a /metrics page."""
    with urllib.request.urlopen(url, timeout=5.0) as resp:
        text = resp.read().decode()
    return {(s.name, ",".join(s.labels.values())): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


async def one_phase(target: str, collective: Collective) -> None:
    """Both ranks of the job enter and release one phase on group {0, 1}."""
    key = PhaseKey(ProcessGroup.of([0, 1]), collective)
    async with ControllerClient(target) as client:
        await asyncio.gather(*(client.enter("reload-job", r, key, timeout_s=10) for r in (0, 1)))
        for r in (0, 1):
            await client.release_phase("reload-job", r, key)


@dataclass
class Child:
    proc: asyncio.subprocess.Process
    grpc_target: str
    metrics_url: str


@contextlib.asynccontextmanager
async def controller(path: Path, notify: str, log: Path) -> AsyncIterator[Child]:
    env = {**os.environ, "NOTIFY_SOCKET": notify, "WATCHDOG_USEC": "1000000"}
    with log.open("wb") as err:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "lightrail.controller", "--config", str(path), "--announce",
            stdout=asyncio.subprocess.PIPE, stderr=err, stdin=asyncio.subprocess.DEVNULL,
            env=env)
    assert proc.stdout is not None
    try:
        line = await asyncio.wait_for(proc.stdout.readline(), WAIT_S)
        assert line, read(log)
        info = json.loads(line)
        yield Child(proc, info["grpc"], info["metrics"])
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
        await asyncio.wait_for(proc.wait(), WAIT_S)


async def leader_key(etcd: EmbeddedEtcd) -> tuple[object, int | None]:
    async with EtcdStore.connect(etcd.endpoint) as store:
        kv = await store.get("leader")
    assert kv is not None
    return kv.value, kv.lease_id


async def reload_signal(child: Child, notes: Notifications) -> list[str]:
    """SIGHUP ``child``; the lines of the READY=1 message that ends the reload."""
    reloads = notes.count("RELOADING=1")
    child.proc.send_signal(signal.SIGHUP)
    await notes.until(lambda ms: notes.count("RELOADING=1") > reloads
                      and any("READY=1" in m for m in notes.after_last("RELOADING=1")))
    return next(m for m in notes.after_last("RELOADING=1") if "READY=1" in m)


async def good_reload(child: Child, notes: Notifications, path: Path,
                      data: dict[str, Any]) -> None:
    """A new admission timeout and an operator list, by SIGHUP: applied; loopback without a
    token may no longer reload."""
    data["controller"]["admission_timeout_s"] = 4.0
    data["controller"]["operators"] = [{"name": "oncall", "token_sha256": token_sha256(TOKEN)}]
    write_config(path, data)
    ready = await reload_signal(child, notes)
    assert any(s.startswith("STATUS=config reloaded (SIGHUP)") for s in ready), ready
    assert child.proc.returncode is None
    metrics = samples(child.metrics_url)
    assert metrics[("lightrail_config_last_reload_successful", "")] == 1
    assert ("lightrail_config_reload_failures_total", "invalid") not in metrics
    rc, _, err = await cli_in_thread("reload", "--controller", child.grpc_target)
    assert rc == 1 and "UNAUTHENTICATED" in err, err
    rc, out, err = await cli_in_thread("reload", "--controller", child.grpc_target,
                                       "--token", TOKEN)
    assert rc == 0, err
    assert out.strip() == f"applied: {path}: nothing changed"


async def bad_reload(child: Child, notes: Notifications, path: Path,
                     data: dict[str, Any]) -> None:
    """An invalid value, by SIGHUP: refused, counted, phases still admitted."""
    data["controller"]["admission_timeout_s"] = "soon"
    write_config(path, data)
    ready = await reload_signal(child, notes)
    assert any("refused (invalid)" in s for s in ready if s.startswith("STATUS=")), ready
    metrics = samples(child.metrics_url)
    assert metrics[("lightrail_config_reload_failures_total", "invalid")] == 1
    assert metrics[("lightrail_config_last_reload_successful", "")] == 0
    await one_phase(child.grpc_target, Collective.ALL_REDUCE)
    await one_phase(child.grpc_target, Collective.SEND_RECV)
    assert child.proc.returncode is None


async def restart_refused(child: Child, path: Path, data: dict[str, Any]) -> None:
    """A change only a restart applies, over the Reload call: refused, the field named."""
    data["controller"]["admission_timeout_s"] = 4.0
    data["controller"]["metrics_listen"] = "127.0.0.1:1"
    write_config(path, data)
    rc, out, err = await cli_in_thread("reload", "--controller", child.grpc_target,
                                       "--token", TOKEN, "--json")
    assert rc == 1, err
    answer = json.loads(out)
    assert answer["applied"] is False
    assert answer["path"] == str(path)
    assert "controller.metrics_listen: '127.0.0.1:0' -> '127.0.0.1:1'" in answer["error"]
    assert "needs a restart" in answer["error"]
    assert samples(child.metrics_url)[
        ("lightrail_config_reload_failures_total", "needs_restart")] == 1


async def test_sighup_reloads_a_good_file_keeps_serving_on_a_bad_one_and_notifies_systemd(
    etcd: EmbeddedEtcd, tmp_path: Path
) -> None:
    cfg = embedded_config(
        etcd.endpoint,
        FabricSection.model_validate({"builtin": "demo-4x2", "reconfiguration_delay_ms": 2}),
        admission_timeout_s=5.0, replica_id="reload-1")
    data = cfg.model_dump(mode="json")
    data["logging"] = {"level": "info", "format": "json"}
    path = tmp_path / "controller.yaml"
    write_config(path, data)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(tmp_path / "notify.sock"))
    sock.setblocking(False)
    notes = Notifications(sock)
    collector = asyncio.create_task(notes.collect())
    log = tmp_path / "controller.log"
    try:
        async with controller(path, str(tmp_path / "notify.sock"), log) as child:
            await notes.until(lambda ms: any("READY=1" in m for m in ms))
            await notes.until(lambda ms: any("WATCHDOG=1" in m for m in ms))
            ready = next(m for m in notes.messages if "READY=1" in m)
            assert any(s.startswith("STATUS=standby: serving") for s in ready)
            async with ControllerClient(child.grpc_target) as client:
                await client.register_job("reload-job", PLACE)
            await one_phase(child.grpc_target, Collective.SEND_RECV)
            leader_before = await leader_key(etcd)
            await good_reload(child, notes, path, data)
            await bad_reload(child, notes, path, data)
            assert await leader_key(etcd) == leader_before  # the same lease, never resigned
            await restart_refused(child, path, data)
        assert child.proc.returncode == 0, read(log)
        await notes.until(lambda ms: any("STOPPING=1" in m for m in ms))
        text = read(log)
        assert '"event": "config_reloaded"' in text
        assert '"event": "config_reload_refused"' in text
    finally:
        collector.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await collector
        sock.close()
