"""Events and alarms over a real MQTT broker (Debian's mosquitto, started per test on a free
loopback port): every event kind of a replay with its id, the retained status, an alarm on the
alarms topic read back like a driver alarm, a bad alarm counted, the broker away and back."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import aiomqtt
import grpc
import pytest
import pytest_asyncio

from lightrail.agents.client import ControllerClient, PhaseError
from lightrail.agents.replay.replayer import HostSlot, Replayer
from lightrail.agents.replay.trace.loader import load_workload
from lightrail.controller.app import RunningController
from lightrail.controller.cli.broker import Mosquitto, mosquitto_binary
from lightrail.controller.cli.embedded import embedded_config, running_controller
from lightrail.controller.config import Config, FabricSection, MqttSection, build_fabric
from lightrail.controller.domain.model import Collective, PhaseKey, ProcessGroup, RankPlacement
from lightrail.controller.runtime import metrics
from lightrail.controller.store.etcd_server import EmbeddedEtcd
from lightrail.emulator.ocs import EmulatedFabricDevices
from lightrail.v1 import agent_pb2, agent_pb2_grpc, operator_pb2, operator_pb2_grpc

DLRM = (Path(__file__).resolve().parents[2].parent / "shared" / "data" / "traces"
        / "param-dlrm-8rank" / "dlrm_kineto.tar.gz")
WAIT_S = 30.0
SECTION = FabricSection.model_validate(
    {"rail": {"hosts": 4, "gpus_per_host": 2, "spares": 1}, "reconfiguration_delay_ms": 2})
PREFIX = "lightrail/rail-4x2"


@dataclass(frozen=True, slots=True)
class Received:
    topic: str
    payload: dict[str, object]
    retain: bool


class Subscriber:
    """An MQTT client subscribed to ``lightrail/#`` that keeps every message it receives."""

    def __init__(self, broker: Mosquitto) -> None:
        self._broker = broker
        self.messages: list[Received] = []
        self._changed = asyncio.Event()

    async def run(self, subscribed: asyncio.Event) -> None:
        async with aiomqtt.Client(self._broker.host, self._broker.port,
                                  identifier="test-subscriber") as client:
            await client.subscribe("lightrail/#", qos=1)
            subscribed.set()
            async for m in client.messages:
                raw = m.payload if isinstance(m.payload, bytes) else str(m.payload).encode()
                self.messages.append(Received(m.topic.value, json.loads(raw), m.retain))
                self._changed.set()

    def events(self) -> list[dict[str, object]]:
        return [m.payload for m in self.messages if "/events/" in m.topic]

    async def wait_for(self, what: str, ok: Callable[[list[Received]], bool]) -> None:
        """Return once ``ok(messages)``; fail naming ``what`` after ``WAIT_S``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + WAIT_S
        while not ok(self.messages):
            self._changed.clear()
            left = deadline - loop.time()
            if left <= 0:
                kinds = sorted({str(e["kind"]) for e in self.events()})
                pytest.fail(f"no {what} within {WAIT_S} s; event kinds seen: {kinds}")
            try:
                await asyncio.wait_for(self._changed.wait(), left)
            except TimeoutError:
                continue


@pytest_asyncio.fixture
async def broker() -> AsyncIterator[Mosquitto]:
    if mosquitto_binary() is None:
        pytest.skip("mosquitto is not installed (Debian package mosquitto; make system-deps)")
    async with Mosquitto() as b:
        yield b


@pytest_asyncio.fixture
async def subscriber(broker: Mosquitto) -> AsyncIterator[Subscriber]:
    sub = Subscriber(broker)
    subscribed = asyncio.Event()
    task = asyncio.create_task(sub.run(subscribed))
    await asyncio.wait_for(subscribed.wait(), WAIT_S)
    yield sub
    task.cancel()
    with pytest.raises((asyncio.CancelledError, aiomqtt.MqttError)):
        await task


def _config(etcd: EmbeddedEtcd, broker: Mosquitto, **mqtt: object) -> Config:
    cfg = embedded_config(etcd.endpoint, SECTION, admission_timeout_s=60.0)
    # the test's health stream reports once and then stays quiet: a long heartbeat deadline
    # keeps that silence from failing the host's other GPU
    ctl = cfg.controller.model_copy(update={"heartbeat_deadline_s": 600.0})
    section = MqttSection.model_validate({"host": broker.host, "port": broker.port, **mqtt})
    return cfg.model_copy(update={"controller": ctl, "mqtt": section})


@pytest_asyncio.fixture
async def mqtt_ctl(etcd: EmbeddedEtcd, broker: Mosquitto, subscriber: Subscriber,
                   devices: EmulatedFabricDevices) -> AsyncIterator[RunningController]:
    async with running_controller(_config(etcd, broker), devices=devices) as rc:
        yield rc


async def _fail_gpu(target: str, host: str, gpu: int) -> None:
    async with grpc.aio.insecure_channel(target) as ch:
        call = agent_pb2_grpc.AgentServiceStub(ch).HealthStream()  # type: ignore[call-arg]
        await call.write(agent_pb2.HealthReport(host=host, gpus=[agent_pb2.GpuHealth(
            gpu=gpu, state=agent_pb2.GPU_FAILED, xid=79, has_xid=True)]))
        await call.read()
        call.cancel()


async def test_a_subscriber_receives_every_event_kind_of_a_replay_with_ids(
        mqtt_ctl: RunningController, subscriber: Subscriber,
        devices: EmulatedFabricDevices) -> None:
    if not DLRM.exists():
        pytest.skip(f"{DLRM} not present")
    target = mqtt_ctl.grpc_target
    await subscriber.wait_for("retained leading status", lambda ms: any(
        m.topic == f"{PREFIX}/status" and m.payload["state"] == "leading" for m in ms))
    fabric = build_fabric(SECTION)
    hosts = [HostSlot(h.name, tuple(range(h.gpu_count)))
             for h in fabric.hosts.values() if not h.spare]
    replayer = Replayer(load_workload(DLRM), target, hosts, job_id="dlrm", iterations=3,
                        time_scale=0.1, timeout_s=60.0)
    one = asyncio.Event()
    replayer.on_progress = lambda done, _n: one.set() if done >= 1 else None
    async with ControllerClient(target) as client:
        run = asyncio.create_task(replayer.run(client))
        await asyncio.wait_for(one.wait(), WAIT_S)
        await _fail_gpu(target, "host1", 0)  # a failover to the spare host
        report = await asyncio.wait_for(run, 120)
        assert report.iterations == 3
        # an admission error: one rank of a pair enters, its partner never comes
        pair = ProcessGroup.of([0, 1])
        await client.register_job("lonely", [RankPlacement(0, "host0", 0),
                                             RankPlacement(1, "host2", 0)])
        with pytest.raises(PhaseError):
            await client.enter("lonely", 0, PhaseKey(pair, Collective.ALL_REDUCE), 0,
                               timeout_s=0.2)
        await client.unregister_job("lonely")
    devices["ocs-rail0"].fail_port(3)  # a device alarm through the driver
    wanted = {"registered", "reconfigured", "placement_changed", "failover", "phase_error",
              "device_alarm", "leadership", "unregistered"}
    await subscriber.wait_for("event of every kind", lambda ms: wanted <= {
        str(e["kind"]) for e in subscriber.events()})
    events = subscriber.events()
    ids = [e["event_id"] for e in events]
    assert len(set(ids)) == len(ids)  # no QoS 1 redelivery here: ids are unique
    for m in subscriber.messages:
        if "/events/" in m.topic:
            assert m.topic == f"{PREFIX}/events/{m.payload['kind']}"
            assert m.payload["schema_version"] == 1 and not m.retain
    failover = next(e for e in events if e["kind"] == "failover")
    fields = failover["fields"]
    assert isinstance(fields, dict)
    assert fields["from"] == "host1/gpu0" and fields["to"].startswith("host4/")
    assert {"planned_s", "device_confirmed_s", "job_notified_s"} <= set(fields)
    alarm = next(e for e in events if e["kind"] == "device_alarm")
    assert alarm["switch_id"] == "ocs-rail0" and alarm["fields"] == {
        "condition": "LOS", "severity": "major", "source": "driver", "port": "3",
        "description": "port 3 failed"}
    # the operator stream carries the same events under the same ids
    async with grpc.aio.insecure_channel(target) as ch:
        stub = operator_pb2_grpc.OperatorServiceStub(ch)
        streamed = [e async for e in stub.StreamEvents(operator_pb2.StreamEventsRequest())]
        alarms = await stub.ListAlarms(operator_pb2.ListAlarmsRequest())
    assert set(ids) <= {e.event_id for e in streamed}
    assert [(a.switch_id, a.port, a.condition, a.source) for a in alarms.alarms] == [
        ("ocs-rail0", 3, "LOS", "driver")]


async def test_an_alarm_on_the_alarms_topic_makes_the_controller_read_the_switch_back(
        mqtt_ctl: RunningController, broker: Mosquitto, subscriber: Subscriber,
        devices: EmulatedFabricDevices) -> None:
    await subscriber.wait_for("retained leading status", lambda ms: any(
        m.topic == f"{PREFIX}/status" for m in ms))
    rail1 = devices["ocs-rail1"]
    before = rail1.command_count
    rejected = metrics.MQTT_ALARMS_REJECTED._value.get()
    async with aiomqtt.Client(broker.host, broker.port, identifier="test-gateway") as gw:
        await gw.publish(f"{PREFIX}/alarms/ocs-rail1", b'{"condition": "LOS"}', qos=1)
        await gw.publish(f"{PREFIX}/alarms/ocs-rail1", json.dumps(
            {"port": 2, "condition": "LOS", "severity": "major",
             "description": "gateway: fibre cut"}).encode(), qos=1)
    await subscriber.wait_for("device alarm from mqtt", lambda ms: any(
        e["kind"] == "device_alarm" and isinstance(f := e["fields"], dict)
        and f.get("source") == "mqtt" for e in subscriber.events()))
    # the read-back: the device answered a command after the alarm (a read of the switch)
    deadline = time.monotonic() + WAIT_S
    while rail1.command_count == before:
        assert time.monotonic() < deadline, "the switch was not read back"
        await asyncio.sleep(0.01)
    # the bad payload changed nothing: counted, and the one alarm in the log is the valid one
    assert metrics.MQTT_ALARMS_REJECTED._value.get() == rejected + 1
    async with grpc.aio.insecure_channel(mqtt_ctl.grpc_target) as ch:
        alarms = await operator_pb2_grpc.OperatorServiceStub(ch).ListAlarms(
            operator_pb2.ListAlarmsRequest(switch_id="ocs-rail1"))
    assert [(a.port, a.condition, a.severity, a.source, a.description)
            for a in alarms.alarms] == [(2, "LOS", "major", "mqtt", "gateway: fibre cut")]


class Gate:
    """A TCP relay to the broker on its own loopback port: the controller's way to the broker,
    opened and shut by the test (the broker and the test's subscriber stay up)."""

    def __init__(self, broker: Mosquitto) -> None:
        self._broker = broker
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self.port = 0

    async def open(self) -> None:
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def shut(self) -> None:
        assert self._server is not None
        self._server.close()
        for w in list(self._writers):
            w.close()
        await self._server.wait_closed()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_r, up_w = await asyncio.open_connection(self._broker.host, self._broker.port)
        self._writers |= {writer, up_w}

        async def pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            try:
                while data := await r.read(65536):
                    w.write(data)
                    await w.drain()
            except OSError:
                pass
            finally:
                w.close()

        await asyncio.gather(pipe(reader, up_w), pipe(up_r, writer))
        self._writers -= {writer, up_w}


async def _recent(target: str) -> list[operator_pb2.FabricEvent]:
    async with grpc.aio.insecure_channel(target) as ch:
        stub = operator_pb2_grpc.OperatorServiceStub(ch)
        return [e async for e in stub.StreamEvents(operator_pb2.StreamEventsRequest())]


async def test_broker_away_buffers_then_drops_and_delivers_after_it_returns(
        etcd: EmbeddedEtcd, broker: Mosquitto, subscriber: Subscriber,
        devices: EmulatedFabricDevices) -> None:
    gate = Gate(broker)
    await gate.open()
    cfg = _config(etcd, broker, buffer_events=3)
    cfg = cfg.model_copy(update={"mqtt": cfg.mqtt.model_copy(  # type: ignore[union-attr]
        update={"port": gate.port})})
    async with running_controller(cfg, devices=devices) as rc:
        target = rc.grpc_target
        before = await _recent(target)
        await subscriber.wait_for("the events so far", lambda ms: before[-1].event_id in {
            e["event_id"] for e in subscriber.events()})
        await gate.shut()  # the broker is away for the controller
        dropped = metrics.MQTT_EVENTS_DROPPED._value.get()
        group = PhaseKey(ProcessGroup.of([0, 1]), Collective.ALL_REDUCE)
        async with ControllerClient(target) as client:
            # the controller goes on admitting: a pair through a reconfiguration
            await client.register_job("busy", [RankPlacement(0, "host0", 0),
                                               RankPlacement(1, "host1", 0)])
            admitted = await asyncio.wait_for(asyncio.gather(
                client.enter("busy", 0, group), client.enter("busy", 1, group)), WAIT_S)
            assert len(admitted) == 2
            await client.unregister_job("busy")
            for i in range(4):
                await client.register_job(f"j{i}", [RankPlacement(0, "host0", 0)])
                await client.unregister_job(f"j{i}")
        after = await _recent(target)
        new = [e for e in after if e.event_id not in {b.event_id for b in before}]
        assert len(new) >= 10
        # all but the last 3 (the buffer) were dropped and counted
        assert metrics.MQTT_EVENTS_DROPPED._value.get() == dropped + len(new) - 3
        await gate.open()
        # the bridge connects again (a new client) and sends the 3 events it kept
        kept = [e.event_id for e in new[-3:]]
        await subscriber.wait_for("the buffered events", lambda ms: set(kept) <= {
            e["event_id"] for e in subscriber.events()})
        received = [e["event_id"] for e in subscriber.events()]
        assert not {e.event_id for e in new[:-3]} & set(received)
    # on shutdown: the leadership event, then the retained status says offline
    await subscriber.wait_for("offline status", lambda ms: any(
        m.topic == f"{PREFIX}/status" and m.payload["state"] == "offline" for m in ms))
    stepped = [e for e in subscriber.events() if e["kind"] == "leadership"]
    assert [e["fields"]["state"] for e in stepped][-1] == "stepped_down"  # type: ignore[index]
    await gate.shut()
