"""The Grafana dashboards of deploy/grafana/ (plain JSON) and their provisioning: structure
(unique ids, a laid-out grid, every target with an expression, one datasource uid that the
provisioning defines, variables defined where used), the topics each dashboard covers, and
every metric named in a dashboard or rule declared by the daemon's registry (the real
Prometheus check is tests/integration/test_prometheus.py)."""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml
from prometheus_client import generate_latest

from lightrail.controller.runtime.metrics import REGISTRY
from tests.promql import (
    GENERATED_BY_PROMETHEUS,
    PROVISIONING,
    dashboard_expressions,
    exported_names,
    families_of,
    load_dashboards,
    metric_names,
    recorded_names,
    rule_expressions,
)

BOARDS = load_dashboards()
BUILTIN_VARIABLES = frozenset({"__rate_interval", "__interval", "__range"})


def provisioned_datasource_uid() -> str:
    doc = yaml.safe_load(
        (PROVISIONING / "datasources" / "lightrail-prometheus.yaml").read_text("utf-8"))
    [ds] = doc["datasources"]
    assert ds["type"] == "prometheus"
    uid = ds["uid"]
    assert isinstance(uid, str)
    return uid


def test_the_four_dashboards_exist_with_unique_uids() -> None:
    assert set(BOARDS) == {"lightrail-fabric.json", "lightrail-jobs.json",
                           "lightrail-devices.json", "lightrail-failovers.json"}
    uids = [b["uid"] for b in BOARDS.values()]
    assert len(set(uids)) == len(uids)


@pytest.mark.parametrize("name", sorted(BOARDS))
def test_dashboard_structure(name: str) -> None:
    board: dict[str, Any] = BOARDS[name]
    uid = provisioned_datasource_uid()
    assert board["title"].startswith("Lightrail / ")
    assert isinstance(board["schemaVersion"], int)
    panels = board["panels"]
    assert panels
    ids = [p["id"] for p in panels]
    assert all(isinstance(i, int) for i in ids) and len(set(ids)) == len(ids), ids
    cells: set[tuple[int, int]] = set()
    variables = {v["name"] for v in board["templating"]["list"]}
    for p in panels:
        where = f"{name} panel {p['id']}"
        assert p["type"] in {"timeseries", "stat", "table", "state-timeline"}, where
        assert p["title"] and p["description"], where
        assert p["datasource"] == {"type": "prometheus", "uid": uid}, where
        g = p["gridPos"]
        assert g["w"] > 0 and g["x"] >= 0 and g["x"] + g["w"] <= 24 and g["h"] > 0, where
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"])
                for y in range(g["y"], g["y"] + g["h"])}
        assert not mine & cells, f"{where} overlaps another panel"
        cells |= mine
        targets = p["targets"]
        assert targets, where
        ref_ids = [t["refId"] for t in targets]
        assert len(set(ref_ids)) == len(ref_ids), where
        for t in targets:
            assert t["expr"].strip(), where
            assert t["datasource"] == {"type": "prometheus", "uid": uid}, where
            used = set(re.findall(r"\$\{?(\w+)\}?", t["expr"]))
            assert used <= variables | BUILTIN_VARIABLES, f"{where}: undefined {used}"
    for v in board["templating"]["list"]:
        assert v["datasource"] == {"type": "prometheus", "uid": uid}, f"{name} {v['name']}"


def _names_in(board: str) -> set[str]:
    return {n for e in dashboard_expressions() if e.where.startswith(board)
            for n in metric_names(e.promql)}


def test_each_dashboard_covers_its_topic() -> None:
    assert {"lightrail_leader", "lightrail_jobs", "lightrail_cross_connects",
            "lightrail_reconfigurations_total", "lightrail_build_info",
            "lightrail_etcd_request_seconds_bucket"} <= _names_in("lightrail-fabric.json")
    assert {"lightrail_phase_admissions_total", "lightrail_phase_admission_seconds_bucket",
            "lightrail_stall_seconds_total", "lightrail_provisioning_phases_total"
            } <= _names_in("lightrail-jobs.json")
    assert {"lightrail_device_apply_seconds_bucket", "lightrail_device_errors_total",
            "lightrail_switch_up", "lightrail_port_power_dbm"
            } <= _names_in("lightrail-devices.json")
    assert {"lightrail_failover_seconds_bucket", "lightrail_failover_no_spare_total"
            } <= _names_in("lightrail-failovers.json")


def test_every_metric_named_is_declared_by_the_daemon() -> None:
    declared = exported_names(families_of(generate_latest(REGISTRY).decode()))
    known = declared | GENERATED_BY_PROMETHEUS
    for e in dashboard_expressions():
        assert metric_names(e.promql) <= known, (e.where, metric_names(e.promql) - known)
    for e in rule_expressions():
        missing = metric_names(e.promql) - known - recorded_names()
        assert not missing, (e.where, missing)


def test_the_dashboard_provider_loads_files() -> None:
    doc = yaml.safe_load(
        (PROVISIONING / "dashboards" / "lightrail.yaml").read_text("utf-8"))
    [provider] = doc["providers"]
    assert provider["type"] == "file" and provider["options"]["path"]
