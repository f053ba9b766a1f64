"""``lightrail events`` and ``lightrail alarms`` against a real controller on a real etcd (the
CLI in process, or as a process for ``--follow``): recent events with ids, filters, JSON Lines,
an unknown kind refused, a driver alarm listed and then cleared, a followed stream."""

from __future__ import annotations

import asyncio
import io
import json
import re
import sys
from contextlib import redirect_stderr, redirect_stdout

import grpc

from lightrail.agents.client import ControllerClient
from lightrail.controller.app import RunningController
from lightrail.controller.cli.main import main as cli_main
from lightrail.controller.domain.model import RankPlacement
from lightrail.emulator.ocs import EmulatedFabricDevices
from lightrail.v1 import operator_pb2, operator_pb2_grpc

WAIT_S = 30.0
LOG_LINE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \[")


async def cli(*argv: str) -> tuple[int, str, str]:
    """``lightrail ARGV`` in a thread (the CLI runs its own event loop): rc, stdout, stderr
    (without the in-process controller's log lines)."""
    out, err = io.StringIO(), io.StringIO()

    def run() -> int:
        with redirect_stdout(out), redirect_stderr(err):
            return cli_main(list(argv))

    rc = await asyncio.to_thread(run)

    def clean(text: str) -> str:
        return "".join(ln for ln in text.splitlines(keepends=True) if not LOG_LINE.match(ln))

    return rc, clean(out.getvalue()), clean(err.getvalue())


async def _wait_event(target: str, kind: str) -> operator_pb2.FabricEvent:
    """The first event of ``kind`` on the operator stream (recent ones included)."""
    async with grpc.aio.insecure_channel(target) as ch:
        call = operator_pb2_grpc.OperatorServiceStub(ch).StreamEvents(
            operator_pb2.StreamEventsRequest(kinds=[kind], follow=True))
        try:
            return await asyncio.wait_for(anext(aiter(call)), WAIT_S)
        finally:
            call.cancel()


async def test_events_prints_the_recent_events_with_ids_and_filters(
        ctl: RunningController) -> None:
    target = ctl.grpc_target
    async with ControllerClient(target) as client:
        for job in ("cli-a", "cli-b"):
            await client.register_job(job, [RankPlacement(0, "host0", 0)])
            await client.unregister_job(job)
    rc, out, err = await cli("events", "--controller", target, "--json", "--job", "cli-a")
    assert rc == 0, err
    events = [json.loads(line) for line in out.splitlines()]
    assert [(e["kind"], e["job_id"]) for e in events] == [("registered", "cli-a"),
                                                         ("unregistered", "cli-a")]
    assert all(e["schema_version"] == 1 and e["event_id"] for e in events)
    assert events[0]["event_id"] != events[1]["event_id"]
    rc, out, err = await cli("events", "--controller", target, "--kind", "unregistered")
    assert rc == 0, err
    lines = out.splitlines()
    assert len(lines) == 2 and all("unregistered" in ln and "job=cli-" in ln for ln in lines)
    assert all(re.search(r"\[embedded-[0-9a-f]{8}-\d+\]$", ln) for ln in lines), lines
    rc, out, err = await cli("events", "--controller", target, "--kind", "bogus")
    assert rc == 1 and "kinds: unknown event kind 'bogus'" in err


async def test_alarms_lists_a_driver_alarm_then_its_clearing(
        ctl: RunningController, devices: EmulatedFabricDevices) -> None:
    target = ctl.grpc_target
    devices["ocs-rail0"].fail_port(2)
    await _wait_event(target, "device_alarm")
    rc, out, err = await cli("alarms", "--controller", target, "--json")
    assert rc == 0, err
    assert json.loads(out)["alarms"] == [{
        "switch_id": "ocs-rail0", "port": 2, "condition": "LOS", "severity": "major",
        "raised_unix_s": json.loads(out)["alarms"][0]["raised_unix_s"],
        "description": "port 2 failed", "source": "driver", "cleared": False}]
    rc, out, err = await cli("alarms", "--controller", target)
    assert rc == 0 and "ocs-rail0" in out and "LOS" in out and "active" in out, (out, err)
    devices["ocs-rail0"].repair_port(2)
    async with grpc.aio.insecure_channel(target) as ch:
        stub = operator_pb2_grpc.OperatorServiceStub(ch)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + WAIT_S
        while (await stub.ListAlarms(operator_pb2.ListAlarmsRequest())).alarms:
            assert loop.time() < deadline, "the alarm was not cleared"
            await asyncio.sleep(0.01)
    rc, out, _ = await cli("alarms", "--controller", target, "--json")
    assert json.loads(out)["alarms"] == []
    rc, out, _ = await cli("alarms", "--controller", target, "--json", "--all")
    assert [(a["condition"], a["cleared"]) for a in json.loads(out)["alarms"]] == [
        ("LOS", True)]
    rc, _, err = await cli("alarms", "--controller", target, "--switch", "nope")
    assert rc == 1 and "switch_id: unknown switch 'nope'" in err


async def test_events_follow_prints_new_events_as_they_happen(ctl: RunningController) -> None:
    target = ctl.grpc_target
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "lightrail.controller.cli.main", "events", "--follow", "--json",
        "--controller", target, "--job", "followed", stdout=asyncio.subprocess.PIPE,
        stdin=asyncio.subprocess.DEVNULL)
    try:
        assert proc.stdout is not None
        async with ControllerClient(target) as client:
            # printed once whether the follower subscribed before (a new event) or after (a
            # recent one) the registration
            await client.register_job("followed", [RankPlacement(0, "host0", 0)])
            line = await asyncio.wait_for(proc.stdout.readline(), WAIT_S)
            assert json.loads(line)["kind"] == "registered"
            await client.unregister_job("followed")
            line = await asyncio.wait_for(proc.stdout.readline(), WAIT_S)
            assert (json.loads(line)["kind"], json.loads(line)["job_id"]) == (
                "unregistered", "followed")
        assert proc.returncode is None  # still following
    finally:
        proc.terminate()
        await proc.wait()
