"""``--json`` of the operator commands (controller/cli/jsonout.py): snake_case keys in the
proto's order, 64-bit integers as numbers, absent values as null, companion ``has_`` flags
folded in."""

from __future__ import annotations

import json

from lightrail.controller.cli.jsonout import dumps, to_plain
from lightrail.v1 import operator_pb2


def test_numbers_are_numbers_and_keys_keep_the_proto_order() -> None:
    doc = to_plain(operator_pb2.GetStatusResponse(
        replica_id="r1", leader=True, reconfigurations=2**40, uptime_s=1.5))
    assert list(doc) == ["replica_id", "leader", "fabric", "jobs", "switches", "cross_connects",
                         "reconfigurations", "uptime_s", "version", "switches_not_up"]
    assert doc["reconfigurations"] == 2**40 and isinstance(doc["reconfigurations"], int)
    assert json.loads(dumps(operator_pb2.GetStatusResponse(jobs=3)))["jobs"] == 3


def test_absent_values_are_null() -> None:
    gpus = operator_pb2.ListGpusResponse(gpus=[
        operator_pb2.GpuInfo(host="h0", gpu=1, state="healthy"),
        operator_pb2.GpuInfo(host="h1", gpu=0, job_id="j", rank=0, has_rank=True,
                             heartbeat_age_s=0.25)])
    first, second = to_plain(gpus)["gpus"]
    assert first["rank"] is None and first["heartbeat_age_s"] is None
    assert "has_rank" not in first
    assert second["rank"] == 0 and second["heartbeat_age_s"] == 0.25
    switch = to_plain(operator_pb2.SwitchInfo(switch_id="s", rail=0, has_rail=False))
    assert switch["rail"] is None and "has_rail" not in switch
    assert switch["cross_connects"] is None  # unknown (an unreachable switch), never a false 0
