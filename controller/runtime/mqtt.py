"""The MQTT bridge (aiomqtt): events out, device alarms in (DESIGN.md "Observability").

Out: every event of the journal (``lightrail.controller.runtime.journal``) as JSON
(``EventRecord.to_json``: ``schema_version``, ``event_id`` to dedupe on, ...) on
``<prefix>/events/<kind>`` at QoS 1, and the replica's status, retained, on ``<prefix>/status``
(``state`` leading while this replica leads; offline on shutdown or, as the connection's last
will, when it dies). In: ``<prefix>/alarms/<switch>`` (``alarms.parse_alarm_payload``), each
valid alarm handed to the rule every driver alarm takes (``alarms.DeviceAlarms.raise_alarm``);
an invalid one is logged naming the field and value, counted
(``lightrail_mqtt_alarms_rejected_total``) and changes nothing. ``<prefix>`` defaults to
``lightrail/<fabric>``.

The bridge never blocks the controller: events wait in one bounded buffer (a journal
subscription of ``buffer_events``) while the broker is slow or away; when it is full the oldest
event is dropped and counted (``lightrail_mqtt_events_dropped_total``). Each connection attempt
uses a new ``aiomqtt.Client`` (one reused after a failed or timed-out connect can stay broken),
with a growing backoff between attempts. An event whose PUBACK was not seen before a break is
sent again after the reconnect (QoS 1 is at least once: consumers dedupe on ``event_id``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import aiomqtt
import structlog

from lightrail.controller.domain.events import EVENT_SCHEMA_VERSION
from lightrail.controller.domain.timing import Backoff, BackoffState
from lightrail.controller.runtime import metrics
from lightrail.controller.runtime.alarms import AlarmPayloadError, parse_alarm_payload
from lightrail.controller.runtime.journal import EventJournal, Subscription
from lightrail.drivers.base import DeviceAlarm, SwitchCapabilities

log = structlog.get_logger(__name__)

RECONNECT_BACKOFF = Backoff(initial_s=0.2, max_s=30.0, jitter=0.5)
"""Waits between connection attempts to the broker, seconds."""


@dataclass(frozen=True, slots=True)
class MqttTls:
    """TLS to the broker: ``ca_file`` (PEM) verifies it; ``cert_file``/``key_file`` (PEM) are
    the client certificate when the broker asks for one."""

    ca_file: str
    cert_file: str | None = None
    key_file: str | None = None


@dataclass(frozen=True, slots=True)
class MqttSettings:
    """Where and how the bridge connects. ``topic_prefix``: e.g. ``lightrail/demo-4x2``;
    ``keepalive_s``: MQTT keepalive (the broker sends the will after 1.5 x this of silence);
    ``buffer_events``: events kept while the broker is away; ``timeout_s``: per broker
    operation (connect, publish acknowledgement)."""

    host: str
    port: int
    topic_prefix: str
    client_id: str
    keepalive_s: int = 30
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    tls: MqttTls | None = None
    buffer_events: int = 1000
    timeout_s: float = 5.0
    backoff: Backoff = RECONNECT_BACKOFF


@dataclass(frozen=True, slots=True)
class ReplicaStatus:
    """What the retained status names: the replica, its version, the fabric it serves."""

    replica_id: str
    version: str
    fabric: str


class MqttSetupError(ValueError):
    """A credential of the ``mqtt`` config section cannot be read; the message names the
    field and the variable or file."""


def read_credential(field_name: str, *, env: str | None = None,
                    file: str | None = None) -> str | None:
    """The value of environment variable ``env``, or the first line of ``file`` (e.g. a
    systemd credential under ``$CREDENTIALS_DIRECTORY``); None when neither is given.
    Raises ``MqttSetupError`` naming ``mqtt.<field_name>`` and the variable or file."""
    if env is not None:
        value = os.environ.get(env)
        if not value:
            raise MqttSetupError(f"mqtt.{field_name}: environment variable {env!r} is not set")
        return value
    if file is None:
        return None
    try:
        return Path(file).read_text(encoding="utf-8").splitlines()[0]
    except (OSError, UnicodeDecodeError, IndexError) as exc:
        why = getattr(exc, "strerror", None) or ("empty file" if isinstance(exc, IndexError)
                                                 else str(exc))
        raise MqttSetupError(f"mqtt.{field_name}: cannot read {file!r}: {why}") from None


AlarmSink = Callable[[DeviceAlarm, str], None]
"""``DeviceAlarms.raise_alarm``: (alarm, source)."""


class MqttBridge:
    """Runs (``run``, as a task) until ``close``; see the module docstring."""

    def __init__(self, settings: MqttSettings, journal: EventJournal, on_alarm: AlarmSink,
                 switches: Mapping[str, SwitchCapabilities], status: ReplicaStatus) -> None:
        self._s = settings
        self._journal = journal
        self._on_alarm = on_alarm
        self._switches = switches
        self._status = status
        self._buffer: Subscription = journal.subscribe(settings.buffer_events,
                                                       on_drop=metrics.MQTT_EVENTS_DROPPED.inc)
        self._client: aiomqtt.Client | None = None
        self.connected = asyncio.Event()
        """Set while connected (tests and ``close`` wait on it)."""
        self.connections = 0
        """Successful connections so far."""
        self._task: asyncio.Task[None] | None = None

    def start(self, tg: asyncio.TaskGroup) -> None:
        """Run the bridge (``run``) as a task of ``tg``; it connects in the background, so a
        broker that is away delays nothing."""
        self._task = tg.create_task(self.run(), name="mqtt")

    async def stop(self, timeout_s: float) -> None:
        """``close`` (send what is buffered and the offline status, at most ``timeout_s``),
        then stop the task ``start`` made."""
        await self.close(timeout_s)
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait({self._task}, timeout=timeout_s)

    @property
    def status_topic(self) -> str:
        return f"{self._s.topic_prefix}/status"

    @property
    def buffered(self) -> int:
        """Events waiting to be sent."""
        return len(self._buffer)

    def _status_payload(self, state: str) -> bytes:
        st = self._status
        return json.dumps({
            "schema_version": EVENT_SCHEMA_VERSION, "state": state,
            "leader": st.replica_id if state == "leading" else None,
            "replica_id": st.replica_id, "version": st.version, "fabric": st.fabric,
            "at_unix_s": time.time(),
        }).encode()

    def _new_client(self) -> aiomqtt.Client:
        s = self._s
        tls = None if s.tls is None else aiomqtt.TLSParameters(
            ca_certs=s.tls.ca_file, certfile=s.tls.cert_file, keyfile=s.tls.key_file)
        return aiomqtt.Client(
            s.host, s.port, username=s.username, password=s.password, identifier=s.client_id,
            keepalive=s.keepalive_s, timeout=s.timeout_s, tls_params=tls,
            will=aiomqtt.Will(self.status_topic, self._status_payload("offline"), qos=1,
                              retain=True))

    async def run(self) -> None:
        """Connect, publish and listen; on any broker failure wait a backoff and connect
        again with a new client. Runs until cancelled."""
        backoff = BackoffState(self._s.backoff)
        where = f"{self._s.host}:{self._s.port}"
        try:
            while True:
                delay_s = 0.0
                client = self._new_client()  # a new client per attempt (see module docstring)
                try:
                    async with client:
                        self._client = client
                        self.connections += 1
                        metrics.MQTT_CONNECTED.set(1)
                        log.info("mqtt_connected", broker=where, prefix=self._s.topic_prefix)
                        backoff.reset()
                        await client.publish(self.status_topic, self._status_payload("leading"),
                                             qos=1, retain=True)
                        await client.subscribe(f"{self._s.topic_prefix}/alarms/+", qos=1)
                        self.connected.set()
                        await self._serve(client)
                except aiomqtt.MqttError as exc:
                    delay_s = backoff.next_s()
                    log.warning("mqtt_unavailable", broker=where, error=str(exc),
                                buffered=len(self._buffer), retry_in_s=round(delay_s, 3))
                finally:
                    self._client = None
                    self.connected.clear()
                    metrics.MQTT_CONNECTED.set(0)
                await asyncio.sleep(delay_s)
        finally:
            self._journal.unsubscribe(self._buffer)

    async def _serve(self, client: aiomqtt.Client) -> None:
        """Publish the buffer and take alarms in until either fails (its ``MqttError``
        propagates)."""
        tasks = {asyncio.ensure_future(self._publish_loop(client)),
                 asyncio.ensure_future(self._alarm_loop(client))}
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in tasks:
                t.cancel()
            for t in tasks:
                with contextlib.suppress(asyncio.CancelledError, aiomqtt.MqttError):
                    await t
        for t in done:
            t.result()  # raises the MqttError that ended the connection

    async def _publish_loop(self, client: aiomqtt.Client) -> None:
        buf = self._buffer
        prefix = self._s.topic_prefix
        while True:
            await buf.wait()
            record = buf.peek()
            await client.publish(f"{prefix}/events/{record.kind}",
                                 json.dumps(record.to_json()).encode(), qos=1)
            buf.pop(record)

    async def _alarm_loop(self, client: aiomqtt.Client) -> None:
        async for message in client.messages:
            topic = message.topic.value
            switch_id = topic.rsplit("/", 1)[-1]
            payload = message.payload
            raw = payload if isinstance(payload, bytes) else str(payload).encode()
            try:
                alarm = parse_alarm_payload(switch_id, raw, self._switches, time.monotonic())
            except AlarmPayloadError as exc:
                metrics.MQTT_ALARMS_REJECTED.inc()
                log.error("mqtt_alarm_rejected", topic=topic, error=str(exc))
                continue
            self._on_alarm(alarm, "mqtt")

    async def close(self, timeout_s: float) -> None:
        """Send what is buffered (while connected, at most ``timeout_s``), then publish the
        offline status (retained) and disconnect. Does not raise; the caller cancels ``run``
        afterwards."""
        await asyncio.sleep(0)  # let the journal hand over events published just before
        deadline = asyncio.get_running_loop().time() + timeout_s
        while self._client is not None and len(self._buffer):
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                break
            await asyncio.sleep(min(0.01, left))
        client = self._client
        if len(self._buffer):
            log.warning("mqtt_events_unsent", events=len(self._buffer))
        if client is not None:
            try:
                await asyncio.wait_for(client.publish(
                    self.status_topic, self._status_payload("offline"), qos=1, retain=True),
                    max(0.1, deadline - asyncio.get_running_loop().time()))
            except (aiomqtt.MqttError, TimeoutError) as exc:
                log.warning("mqtt_offline_status_failed", error=str(exc))


class EventOutputs:
    """What carries events out while this replica leads: the journal's task and the MQTT
    bridge (None without MQTT), started (``start``) and stopped (``stop``) together."""

    def __init__(self, journal_task: asyncio.Task[None], bridge: MqttBridge | None) -> None:
        self._journal_task = journal_task
        self.bridge = bridge

    @classmethod
    async def start(cls, tg: asyncio.TaskGroup, journal: EventJournal,
                    bridge: MqttBridge | None) -> EventOutputs:
        """Start ``journal`` (subscribed when this returns) and then ``bridge`` in ``tg``."""
        task = await journal.start(tg)
        if bridge is not None:
            bridge.start(tg)
        return cls(task, bridge)

    async def stop(self, timeout_s: float) -> None:
        """Stop the bridge (what it buffered sent first, at most ``timeout_s``), then the
        journal."""
        if self.bridge is not None:
            await self.bridge.stop(timeout_s)
        self._journal_task.cancel()
