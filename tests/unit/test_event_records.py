"""The one conversion of events for MQTT and the operator stream, the journal's ids and ring,
the alarm log, and the validation of MQTT alarm payloads (pure parts, no broker)."""

from __future__ import annotations

import asyncio
import json

import pytest

from lightrail.controller.api.operator_service import fabric_event_pb
from lightrail.controller.config import ConfigError, parse_config
from lightrail.controller.domain.events import (
    EVENT_SCHEMA_VERSION,
    FabricEvent,
    FabricEventKind,
    JobEvent,
    JobEventKind,
    record_of,
)
from lightrail.controller.runtime.alarms import AlarmLog, AlarmPayloadError, parse_alarm_payload
from lightrail.controller.runtime.events import EventBus
from lightrail.controller.runtime.journal import EventJournal
from lightrail.drivers.base import AlarmSeverity, DeviceAlarm, SwitchCapabilities, SwitchKind

SWITCHES = {"ocs-rail0": SwitchCapabilities(kind=SwitchKind.NXN, port_count=8,
                                            atomic_bulk=True, settle_time_s=0.0)}


def test_job_event_json_has_schema_id_and_fields() -> None:
    ev = JobEvent("dlrm", JobEventKind.RECONFIGURED, "phase x: confirmed", at_unix_s=12.5,
                  fields={"switches": "ocs-rail0", "device_s": "0.002"})
    rec = record_of(ev, "r1-abc-7")
    data = json.loads(json.dumps(rec.to_json()))
    assert data == {
        "schema_version": EVENT_SCHEMA_VERSION, "event_id": "r1-abc-7",
        "kind": "reconfigured", "at_unix_s": 12.5, "job_id": "dlrm",
        "switch_id": "ocs-rail0", "message": "phase x: confirmed",
        "fields": {"device_s": "0.002", "switches": "ocs-rail0"},
    }
    assert list(data) == ["schema_version", "event_id", "kind", "at_unix_s", "job_id",
                          "switch_id", "message", "fields"]


def test_fabric_event_without_job_is_null_in_json_and_empty_on_the_stream() -> None:
    ev = FabricEvent(FabricEventKind.LEADERSHIP, "replica a leads", at_unix_s=1.0,
                     fields={"state": "leading"})
    rec = record_of(ev, "a-1-1")
    assert rec.to_json()["job_id"] is None and rec.to_json()["switch_id"] is None
    pb = fabric_event_pb(rec)
    assert (pb.event_id, pb.kind, pb.schema_version, pb.job_id, pb.switch_id) == (
        "a-1-1", "leadership", EVENT_SCHEMA_VERSION, "", "")
    assert dict(pb.fields) == {"state": "leading"}


def test_a_reconfiguration_of_several_switches_names_no_one_switch() -> None:
    ev = JobEvent("j", JobEventKind.RECONFIGURED, "m", fields={"switches": "a,b"})
    assert record_of(ev, "x").switch_id is None


async def test_journal_numbers_events_once_keeps_a_ring_and_drops_oldest_when_full() -> None:
    bus = EventBus()
    journal = EventJournal(bus, "r1", capacity=3)
    dropped: list[int] = []
    async with asyncio.TaskGroup() as tg:
        task = await journal.start(tg)
        sub = journal.subscribe(2, on_drop=lambda: dropped.append(1))
        for i in range(4):
            bus.publish(JobEvent("j", JobEventKind.REGISTERED, f"e{i}"))
        bus.publish_fabric(FabricEvent(FabricEventKind.FAILOVER, "f", job_id="j"))
        await asyncio.sleep(0)
        task.cancel()
    ids = [r.event_id for r in journal.recent()]
    assert len(ids) == 3 and len(set(ids)) == 3
    assert all(i.startswith("r1-") for i in ids)
    assert [r.message for r in journal.recent()] == ["e2", "e3", "f"]
    assert [r.kind for r in journal.recent(kinds=["failover"])] == ["failover"]
    assert journal.recent(job_id="other") == []
    assert len(sub) == 2 and sub.dropped == 3 and len(dropped) == 3
    assert [(await sub.get()).message for _ in range(2)] == ["e3", "f"]


def test_alarm_log_clears_by_switch_port_and_condition() -> None:
    log = AlarmLog(history=2)
    los = DeviceAlarm("s", 3, "LOS", AlarmSeverity.MAJOR, 0.0, "port 3 failed")
    log.record(los, "driver", 10.0)
    log.record(DeviceAlarm("s", None, "REBOOT", AlarmSeverity.CRITICAL, 0.0), "mqtt", 11.0)
    assert [e.alarm.condition for e in log.entries()] == ["LOS", "REBOOT"]
    log.record(DeviceAlarm("s", 3, "LOS", AlarmSeverity.CLEARED, 0.0), "driver", 12.0)
    assert [e.alarm.condition for e in log.entries()] == ["REBOOT"]
    cleared = log.entries(include_cleared=True)[-1]
    assert (cleared.alarm, cleared.raised_unix_s, cleared.cleared_unix_s) == (los, 10.0, 12.0)
    assert log.entries("other", include_cleared=True) == []


def test_a_valid_alarm_payload() -> None:
    alarm = parse_alarm_payload(
        "ocs-rail0", b'{"port": 3, "condition": "LOS", "severity": "major", '
                     b'"description": "fibre cut"}', SWITCHES, 5.0)
    assert alarm == DeviceAlarm("ocs-rail0", 3, "LOS", AlarmSeverity.MAJOR, 5.0, "fibre cut")
    wide = parse_alarm_payload("ocs-rail0", b'{"condition": "REBOOT", "severity": "critical"}',
                               SWITCHES, 5.0)
    assert wide.port is None and wide.description == ""


@pytest.mark.parametrize(("switch", "payload", "named"), [
    ("ocs-rail9", b'{"condition": "LOS", "severity": "major"}', "switch: unknown switch "
                                                                "'ocs-rail9'"),
    ("ocs-rail0", b"not json", "(payload): not JSON"),
    ("ocs-rail0", b"[1, 2]", "(payload): expected a JSON object"),
    ("ocs-rail0", b'{"severity": "major"}', "condition: expected a non-empty string, got None"),
    ("ocs-rail0", b'{"condition": " ", "severity": "major"}', "condition:"),
    ("ocs-rail0", b'{"condition": "LOS", "severity": "fatal"}', "severity: expected one of "
                                                               "critical, major"),
    ("ocs-rail0", b'{"condition": "LOS", "severity": "major", "port": 17}',
     "port: expected a port of ocs-rail0 (1..16) or null, got 17"),
    ("ocs-rail0", b'{"condition": "LOS", "severity": "major", "port": true}', "port:"),
    ("ocs-rail0", b'{"condition": "LOS", "severity": "major", "port": "3"}',
     "port: expected a port of ocs-rail0 (1..16) or null, got '3'"),
    ("ocs-rail0", b'{"condition": "LOS", "severity": "major", "description": 5}',
     "description: expected a string, got 5"),
    ("ocs-rail0", b'{"condition": "LOS", "severity": "major", "colour": "red"}',
     "colour: unknown field (got 'red')"),
    ("ocs-rail0", b'{"condition": "LOS", "severity": "major", "at_unix_s": "now"}',
     "at_unix_s: expected a number, got 'now'"),
])
def test_bad_alarm_payloads_name_the_field_and_value(switch: str, payload: bytes,
                                                     named: str) -> None:
    with pytest.raises(AlarmPayloadError) as err:
        parse_alarm_payload(switch, payload, SWITCHES, 0.0)
    assert named in str(err.value)


@pytest.mark.parametrize(("mqtt", "named"), [
    ({"host": "b", "port": 0}, "mqtt.port: Input should be greater than or equal to 1 (got 0)"),
    ({"host": "b", "topic_prefix": "lightrail/#"}, "mqtt.topic_prefix: Value error, a topic "
                                                   "prefix may not hold the wildcards"),
    ({"host": "b", "topic_prefix": "/x"}, "mqtt.topic_prefix: Value error, expected topic "
                                          "levels"),
    ({"host": "b", "keepalive_s": 1}, "mqtt.keepalive_s: Input should be greater than or "
                                      "equal to 5 (got 1)"),
    ({"host": "b", "username": "u", "password_env": "P", "password_file": "/f"},
     "give password_env or password_file, not both"),
    ({"host": "b", "password_env": "P"}, "a password needs username or username_env"),
    ({"host": "b", "colour": 1}, "mqtt.colour: Extra inputs are not permitted"),
    ({"port": 1883}, "mqtt.host: Field required"),
])
def test_bad_mqtt_sections_name_the_field_and_value(mqtt: dict[str, object],
                                                    named: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config({"mqtt": mqtt})
    assert named in str(err.value)


def test_no_mqtt_section_means_no_mqtt() -> None:
    assert parse_config({}).mqtt is None
    assert parse_config({"mqtt": {"host": "broker"}}).mqtt is not None
