"""``lightrail emulate``: a fabric's switches served by their own process, reached by the
controller's real drivers through the config the command writes, faults and change logs through
the control API; bad fabrics refused with one line naming what is wrong."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import yaml

from lightrail.controller.cli.embedded import spawn_emulator
from lightrail.controller.config import build_fabric, load_config
from lightrail.drivers.base import CrossConnect, DeviceTimeout, DeviceUnreachable
from lightrail.drivers.registry import DriverRegistry
from lightrail.emulator.control import ControlApiError, ControlClient
from lightrail.emulator.ocs import ChangeAction
from lightrail.emulator.servers.fabric import rail_section

REPO = Path(__file__).resolve().parents[2]
MIXED = REPO / "deploy" / "examples" / "mixed-fabric.yaml"
LIGHTRAIL = [sys.executable, "-m", "lightrail.controller.cli.main"]


@asynccontextmanager
async def emulate(*args: str) -> AsyncIterator[dict[str, object]]:
    """``lightrail emulate ARGS`` as a child process; yields its announcement, SIGTERMs it on
    exit and checks it stopped cleanly (exit code 0)."""
    proc = await asyncio.create_subprocess_exec(
        *LIGHTRAIL, "emulate", *args, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, stdin=asyncio.subprocess.DEVNULL)
    assert proc.stdout is not None
    try:
        line = await asyncio.wait_for(proc.stdout.readline(), 30)
        assert line, "emulator exited before serving"
        yield json.loads(line)
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        rc = await asyncio.wait_for(proc.wait(), 15)
    assert rc == 0


async def test_written_config_reaches_every_device_through_its_real_driver(
        tmp_path: Path) -> None:
    out = tmp_path / "controller.yaml"
    env_before = {k: os.environ.pop(k, None) for k in ("POLATIS_USER", "POLATIS_PASSWORD")}
    try:
        async with emulate("--fabric", str(MIXED), "--write-config", str(out)) as info:
            switches = info["switches"]
            assert isinstance(switches, dict)
            assert {s: v["model"] for s, v in switches.items()} == {
                "ocs-tl1": "tl1", "ocs-restconf": "restconf", "siph-mesh": "siph"}
            cfg = load_config(out)  # a valid controller config ...
            fabric = build_fabric(cfg.fabric)
            assert [h.name for h in fabric.hosts.values()] == ["gpu-a", "gpu-b"]
            registry = DriverRegistry()  # ... whose switches the daemon's own drivers reach
            for sid, sw in fabric.switches.items():
                assert sw.options["port"] == switches[sid]["port"]
                driver = registry.create(sw.spec)
                await driver.open()
                try:
                    assert await driver.get_cross_connects() == frozenset()
                    ingress = 1
                    egress = sw.capabilities.port_count + 1
                    xc = CrossConnect(ingress, egress)
                    await driver.apply(frozenset({xc}), frozenset({ingress, egress}))
                    assert xc in await driver.get_cross_connects()
                finally:
                    await driver.close()
            control = info["control"]
            assert isinstance(control, str)
            async with ControlClient(control) as client:
                logs = await client.change_logs()
                for sid in fabric.switches:
                    assert [r.action for r in logs[sid]][-1] is ChangeAction.MAKE
                    assert logs[sid][-1].cross_connect.ingress == 1
                # a fault injected through the control API reaches the device the driver uses
                await client.set_unreachable("ocs-tl1", True)
                driver = registry.create(fabric.switches["ocs-tl1"].spec)
                with pytest.raises(DeviceUnreachable, match="ocs-tl1"):
                    await driver.open()  # the login is refused: the device closes
                await driver.close()
    finally:
        for k, v in env_before.items():
            if v is not None:
                os.environ[k] = v


async def test_spawned_emulator_outlives_its_clients_and_reports_changes() -> None:
    section = rail_section("demo-4x2", delay_ms=1)
    async with spawn_emulator(section, protocol="restconf") as emulator:
        fabric = build_fabric(emulator.section)
        assert {sw.model for sw in fabric.switches.values()} == {"restconf"}
        assert set(emulator.switches) == set(fabric.switches)
        sw = fabric.switches["ocs-rail0"]
        xc = CrossConnect(1, sw.capabilities.port_count + 2)
        driver = DriverRegistry().create(sw.spec)
        await driver.open()
        await driver.apply(frozenset({xc}), frozenset({xc.ingress, xc.egress}))
        await driver.close()  # the client goes away; the device keeps its state
        async with ControlClient(emulator.control_url) as client:
            state = await client.device("ocs-rail0")
            assert state.cross_connects == frozenset({xc})
            assert state.write_count == 1
            log = await client.change_log("ocs-rail0")
            assert [(r.action, r.cross_connect) for r in log] == [(ChangeAction.MAKE, xc)]
            assert await client.change_log("ocs-rail0", since=1) == []


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*LIGHTRAIL, "emulate", *args], capture_output=True, text=True,
                          timeout=60, check=False)


def test_unknown_fabric_is_one_line_exit_2() -> None:
    r = run_cli("--fabric", "no-such-fabric")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "lightrail emulate: --fabric: 'no-such-fabric' is neither a built-in fabric "
        "(demo-4x2, rail-16x8) nor a readable file"]


def test_model_no_emulator_speaks_is_refused_naming_the_switch(tmp_path: Path) -> None:
    doc = yaml.safe_load(MIXED.read_text())
    doc["fabric"]["switches"][1]["model"] = "calient-s320"
    path = tmp_path / "f.yaml"
    path.write_text(yaml.safe_dump(doc))
    r = run_cli("--fabric", str(path))
    assert r.returncode == 2
    assert "switch 'ocs-restconf': model 'calient-s320' cannot be emulated" in r.stderr
    assert "Traceback" not in r.stderr


def test_invalid_fabric_file_names_the_field(tmp_path: Path) -> None:
    path = tmp_path / "f.yaml"
    path.write_text("fabric:\n  rail: {hosts: 0, gpus_per_host: 2}\n")
    r = run_cli("--fabric", str(path))
    assert r.returncode == 2
    assert "fabric.rail.hosts" in r.stderr and "Traceback" not in r.stderr
    r = run_cli("--fabric", str(MIXED), "--delay-ms", "5")
    assert r.returncode == 2 and "built-in fabrics only" in r.stderr


async def test_command_log_names_the_login_that_sent_each_command() -> None:
    section = rail_section("demo-4x2", delay_ms=1)
    async with spawn_emulator(section, accounts={"ctl-a": "secret-a"}) as emulator, \
            ControlClient(emulator.control_url) as client:
        sw = build_fabric(emulator.section).switches["ocs-rail1"]
        options = {**sw.options, "username": "ctl-a", "password": "secret-a"}
        spec = dataclasses.replace(sw.spec, options=options)
        driver = DriverRegistry().create(spec)
        await driver.open()
        await driver.get_cross_connects()
        await driver.close()
        commands = await client.commands("ocs-rail1")
        assert commands and commands[0].code == "ACT-USER" and commands[0].user is None
        after_login = [c for c in commands[1:] if c.code != "CANC-USER"]
        assert after_login and {c.user for c in after_login} == {"ctl-a"}
        assert all(a.at_s <= b.at_s for a, b in itertools.pairwise(commands))
        assert await client.commands("ocs-rail1", since=len(commands)) == []
        assert await client.commands("ocs-rail0") == []  # nobody talked to it


async def test_command_log_of_a_restconf_device_is_not_found() -> None:
    async with spawn_emulator(rail_section("demo-4x2", delay_ms=1), protocol="restconf"
                              ) as emulator, ControlClient(emulator.control_url) as client:
        with pytest.raises(ControlApiError) as err:
            await client.commands("ocs-rail0")
        assert err.value.status == 404 and err.value.field == "id"
        with pytest.raises(ControlApiError) as err:
            await client.change_log("ocs-rail0", since=-1)
        assert err.value.status == 400 and err.value.field == "since"


@pytest.mark.parametrize("protocol", ["tl1", "restconf"])
async def test_silent_partition_times_out_keeps_the_connection_and_heals(protocol: str) -> None:
    """Issue 14 section 4: through the control API a device stops answering but keeps its
    connections open; the controller's real driver times out with ``DeviceTimeout`` naming the
    switch (not the ``DeviceUnreachable`` of a closed connection) and works again once the
    partition ends."""
    section = rail_section("demo-4x2", delay_ms=1)
    async with spawn_emulator(section, protocol=protocol) as emulator, \
            ControlClient(emulator.control_url) as client:
        sw = build_fabric(emulator.section).switches["ocs-rail0"]
        spec = dataclasses.replace(sw.spec, options={**sw.options, "timeout_s": 0.3})
        driver = DriverRegistry().create(spec)
        await driver.open()
        try:
            assert await driver.get_cross_connects() == frozenset()
            reply = await client.set_partitioned("ocs-rail0", True)
            assert reply["applied"] == {"fault": "partition", "on": True}
            assert (await client.device("ocs-rail0")).partitioned
            with pytest.raises(DeviceTimeout, match="ocs-rail0") as info:
                await driver.get_cross_connects()
            assert info.value.retryable
            # the device still accepts a connection and holds it open without answering
            reader, writer = await asyncio.open_connection("127.0.0.1", int(sw.options["port"]))
            request = (b"RTRV-PATCH:ocs-rail0::1;" if protocol == "tl1" else
                       b"GET /restconf/data HTTP/1.1\r\nHost: x\r\n\r\n")
            writer.write(request)
            await writer.drain()
            with pytest.raises(TimeoutError):  # neither an answer nor EOF (a closed socket)
                await asyncio.wait_for(reader.read(1), 0.3)
            writer.close()
            await client.set_partitioned("ocs-rail0", False)
            assert not (await client.device("ocs-rail0")).partitioned
            xc = CrossConnect(1, sw.capabilities.port_count + 2)
            await driver.apply(frozenset({xc}), frozenset({xc.ingress, xc.egress}))
            assert await driver.get_cross_connects() == frozenset({xc})
        finally:
            await driver.close()
        with pytest.raises(ControlApiError) as err:
            await client.inject("ocs-rail0", {"fault": "partition", "on": "yes"})
        assert err.value.status == 400 and err.value.field == "on"
