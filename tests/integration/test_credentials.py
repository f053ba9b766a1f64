"""Device credentials never appear in logs, events, metrics, operator answers, stored state or
errors (issue 10, section 6).

A controller process at debug log level drives the TL1 switches of a ``lightrail emulate``
process, one rail logging in with an inline password, the other with ``password_env``; a job
switches both rails, one switch reboots (the driver logs in again), the operator views, the
job's events, /metrics and every etcd value under the prefix are read; a second controller
process whose environment holds a wrong password fails its login. Every output collected is
searched for the passwords."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import urllib.request
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from google.protobuf.json_format import MessageToDict

from lightrail.agents.client import ControllerClient
from lightrail.agents.leader import LeaderTargets
from lightrail.controller.cli.embedded import embedded_config, spawn_emulator
from lightrail.controller.cli.operator import operator_call
from lightrail.controller.config import Config, FabricSection
from lightrail.controller.domain.events import JobEvent
from lightrail.controller.domain.model import Collective, PhaseKey, ProcessGroup, RankPlacement
from lightrail.controller.store.etcd import EtcdStore
from lightrail.controller.store.etcd_server import EmbeddedEtcd
from lightrail.drivers.base import AuthenticationFailed, SwitchCapabilities, SwitchKind, SwitchSpec
from lightrail.drivers.options import DriverContext
from lightrail.drivers.tl1.driver import make_driver
from lightrail.emulator.control import ControlClient
from lightrail.emulator.ocs import EmulatedOcs
from lightrail.emulator.servers.tl1 import Tl1Server
from lightrail.v1 import operator_pb2

INLINE = "Lr-Inline-Pw-7f3a91"
FROM_ENV = "Lr-Env-Pw-c04d2e"
WRONG = "Lr-Wrong-Pw-9b1e55"
SECRETS = (INLINE, FROM_ENV, WRONG)
PASSWORD_VAR = "LR_TEST_TL1_PASSWORD"
START_S = 30.0
"""Bound on a controller process's start (a deadline, not a timing assertion)."""


def leaks(text: str) -> list[str]:
    """The passwords ``text`` contains."""
    return [s for s in SECRETS if s in text]


def credential_config(etcd: EmbeddedEtcd, section: FabricSection, replica_id: str) -> Config:
    """``section`` (served by the emulator) with rail 0 logging in as ``lr-inline`` with the
    inline password and rail 1 as ``lr-env`` with ``$LR_TEST_TL1_PASSWORD``."""
    assert section.rail is not None
    options = {sid: {k: v for k, v in opts.items() if k not in ("username", "password")}
               for sid, opts in section.rail.switch_options.items()}
    options["ocs-rail0"].update(username="lr-inline", password=INLINE)
    options["ocs-rail1"].update(username="lr-env", password_env=PASSWORD_VAR)
    rail = section.rail.model_copy(update={"switch_options": options})
    return embedded_config(etcd.endpoint, section.model_copy(update={"rail": rail}),
                           admission_timeout_s=5.0, replica_id=replica_id)


@dataclass
class Child:
    """A controller process: where it serves, and its stdout (filled in when it exited)."""

    grpc_target: str
    metrics_url: str
    proc: asyncio.subprocess.Process
    stdout: str = ""


@asynccontextmanager
async def controller_process(cfg: Config, password: str, log: Path, *,
                             announce: str = "leader") -> AsyncIterator[Child]:
    """``lightrail controller --announce=ANNOUNCE`` at debug level, JSON logs to ``log``, with
    ``$LR_TEST_TL1_PASSWORD`` = ``password``; yields once it announced itself; SIGTERM on
    exit."""
    data = cfg.model_dump(mode="json")
    data["logging"] = {"level": "debug", "format": "json"}
    path = log.with_suffix(".yaml")
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    with log.open("wb") as err:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "lightrail.controller", "--config", str(path),
            f"--announce={announce}",
            stdout=asyncio.subprocess.PIPE, stderr=err, stdin=asyncio.subprocess.DEVNULL,
            env={**os.environ, PASSWORD_VAR: password})
    assert proc.stdout is not None
    line = b""
    child = Child("", "", proc)
    try:
        line = await asyncio.wait_for(proc.stdout.readline(), START_S)
        info = json.loads(line) if line else {}
        child.grpc_target, child.metrics_url = info.get("grpc", ""), info.get("metrics", "")
        yield child
    finally:
        with contextlib.suppress(ProcessLookupError):  # exited already
            proc.terminate()
        rest = await asyncio.wait_for(proc.stdout.read(), START_S)
        await asyncio.wait_for(proc.wait(), START_S)
        child.stdout = (line + rest).decode()


async def run_job(target: str) -> list[JobEvent]:
    """Register a 2-rank job on host0/host1, admit one phase per rail (rail 0: GPU 0, rail 1:
    GPU 1 of each host), release, unregister; the job's events meanwhile."""
    placements = [RankPlacement(0, "host0", 0), RankPlacement(1, "host1", 0),
                  RankPlacement(2, "host0", 1), RankPlacement(3, "host1", 1)]
    events: list[JobEvent] = []
    async with ControllerClient(target) as client:
        await client.register_job("leak-job", placements)

        async def watch() -> None:
            async for ev in client.watch("leak-job"):
                events.append(ev)

        watcher = asyncio.create_task(watch())
        for pair in ((0, 1), (2, 3)):
            key = PhaseKey(ProcessGroup.of(pair), Collective.SEND_RECV)
            await asyncio.gather(*(client.enter("leak-job", r, key, timeout_s=10) for r in pair))
            for r in pair:
                await client.release_phase("leak-job", r, key)
        await client.unregister_job("leak-job")
        await asyncio.wait_for(watcher, 10.0)  # the stream ends with the job
    return events


async def operator_views(target: str) -> str:
    """The JSON of every read-only operator call."""
    targets = LeaderTargets(target)
    out = []
    for call in (lambda s: s.GetStatus(operator_pb2.GetStatusRequest(), timeout=5),
                 lambda s: s.ListSwitches(operator_pb2.ListSwitchesRequest(), timeout=5),
                 lambda s: s.ListCircuits(operator_pb2.ListCircuitsRequest(), timeout=5),
                 lambda s: s.ListJobs(operator_pb2.ListJobsRequest(), timeout=5),
                 lambda s: s.ListHosts(operator_pb2.ListHostsRequest(), timeout=5),
                 lambda s: s.ListGpus(operator_pb2.ListGpusRequest(), timeout=5)):
        out.append(json.dumps(MessageToDict(await operator_call(targets, call))))
    return "\n".join(out)


async def logins(control: ControlClient, switch_id: str) -> int:
    """How many ACT-USER commands ``switch_id`` has received."""
    return sum(1 for c in await control.commands(switch_id) if c.code == "ACT-USER")


async def relogin(control: ControlClient, switch_id: str) -> None:
    """Reboot ``switch_id`` (its TL1 sessions drop) and wait until the driver has logged in
    again."""
    before = await logins(control, switch_id)
    await control.reboot(switch_id, keep_cross_connects=True, down_s=0.2)
    async with asyncio.timeout(15.0):
        while await logins(control, switch_id) <= before:  # noqa: ASYNC110 (another process)
            await asyncio.sleep(0.1)


async def test_passwords_appear_in_no_output(etcd: EmbeddedEtcd, tmp_path: Path) -> None:
    accounts = {"lr-inline": INLINE, "lr-env": FROM_ENV}
    section = FabricSection.model_validate({"builtin": "demo-4x2", "reconfiguration_delay_ms": 2})
    async with spawn_emulator(section, accounts=accounts) as emu, \
            ControlClient(emu.control_url) as control:
        cfg = credential_config(etcd, emu.section, "replica-a")
        outputs: dict[str, str] = {}
        log = tmp_path / "controller.log"
        async with controller_process(cfg, FROM_ENV, log) as child:
            assert child.grpc_target, log.read_text()
            events = await run_job(child.grpc_target)
            assert events, "the job's events were collected"
            outputs["events"] = "\n".join(f"{e.kind} {e.message} {e.fields}" for e in events)
            await relogin(control, "ocs-rail0")
            outputs["operator views"] = await operator_views(child.grpc_target)
            outputs["metrics"] = await asyncio.to_thread(
                lambda: urllib.request.urlopen(child.metrics_url, timeout=5).read().decode())
            async with EtcdStore.connect(etcd.endpoint) as store:
                outputs["etcd"] = json.dumps(dict((await store.get_prefix_json("")).items))
            # a second replica whose environment holds a wrong password: a standby until the
            # first stops, then its login to rail 1 fails and it exits
            failed_log = tmp_path / "failed.log"
            second = credential_config(etcd, emu.section, "replica-b")
            async with controller_process(second, WRONG, failed_log,
                                          announce="serving") as failing:
                child.proc.terminate()
                # 5: a switch not opened at start (README "Exit codes")
                assert await asyncio.wait_for(failing.proc.wait(), START_S) == 5
        outputs["controller log"] = log.read_text()
        outputs["failed controller log"] = failed_log.read_text()
        outputs["controller stdout"] = child.stdout + failing.stdout
    # the runs did what they should, so their outputs say something
    assert '"lr-inline"' not in outputs["controller log"]  # not even the user names are logged
    assert "tl1 session open" in outputs["controller log"]
    assert '"level": "debug"' in outputs["controller log"]
    assert "ocs-rail1" in outputs["operator views"]
    assert '"grpc"' in outputs["controller stdout"]
    assert "lightrail_leader" in outputs["metrics"]
    assert "inventory" in outputs["etcd"]
    failed = outputs["failed controller log"]
    assert failed.splitlines()[-1] == ("lightrail controller: switch 'ocs-rail1': login "
                                       "rejected (DENY PICC)")
    assert "Traceback" not in failed
    assert {name: leaks(text) for name, text in outputs.items()} == {
        name: [] for name in outputs}


async def test_login_errors_name_no_password() -> None:
    """The driver's own errors: a rejected login and an unset variable."""
    caps = SwitchCapabilities(kind=SwitchKind.NXN, port_count=4, atomic_bulk=True,
                              settle_time_s=0.0)
    async with Tl1Server(EmulatedOcs("ocs-x", caps), users={"lr": INLINE}) as server:
        for options, expected in (({"password": WRONG}, "login rejected (DENY PICC)"),
                                  ({"password_env": PASSWORD_VAR}, "is not set")):
            spec = SwitchSpec("ocs-x", "tl1", caps, {"host": "127.0.0.1", "port": server.port,
                                                      "username": "lr", **options})
            driver = make_driver(spec, DriverContext(environ={}))
            with pytest.raises(AuthenticationFailed) as info:
                await driver.open()
            await driver.close()
            assert expected in str(info.value)
            assert leaks(f"{info.value} {info.value!r} {spec!r}") == []
