"""deploy/prometheus/ against Prometheus itself (Debian's prometheus 2.42 and its promtool):
``promtool check config``, ``check rules`` and ``test rules``; then a real Prometheus scraping a
running controller every second, with rules.yml loaded: every dashboard and rule expression
parses and runs there, every rule evaluates healthy, and every metric an expression names is
one the daemon exports (its /metrics families; histograms as _bucket/_sum/_count)."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import yaml

from lightrail.agents.client import ControllerClient
from lightrail.controller.app import RunningController
from lightrail.controller.cli.embedded import embedded_config, running_controller
from lightrail.controller.config import FabricSection
from lightrail.controller.domain.model import Collective, PhaseKey, ProcessGroup, RankPlacement
from lightrail.controller.store.etcd_server import EmbeddedEtcd
from lightrail.emulator.ocs import EmulatedFabricDevices
from tests.promql import (
    GENERATED_BY_PROMETHEUS,
    PROMETHEUS,
    RULES,
    binary_or_skip,
    dashboard_expressions,
    exported_names,
    families_of,
    load_rules,
    metric_names,
    recorded_names,
    rule_expressions,
)

PLACE = [RankPlacement(r, f"host{r // 2}", r % 2) for r in range(8)]
RING = PhaseKey(ProcessGroup.of(range(8)), Collective.ALL_REDUCE)
WAIT_S = 15.0


def promtool(*args: str, cwd: Path = PROMETHEUS) -> str:
    result = subprocess.run([binary_or_skip("promtool"), *args], cwd=cwd, capture_output=True,
                            text=True, timeout=60, check=False)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    return output


def test_promtool_checks_the_config_and_the_rules_it_names() -> None:
    out = promtool("check", "config", "prometheus.yml")
    assert "SUCCESS: 1 rule files found" in out
    assert f"SUCCESS: {len(load_rules())} rules found" in out


def test_promtool_checks_the_rules() -> None:
    assert f"SUCCESS: {len(load_rules())} rules found" in promtool("check", "rules", "rules.yml")


def test_promtool_rule_unit_tests_pass_and_cover_every_alert() -> None:
    out = promtool("test", "rules", "rules_test.yml")
    assert "SUCCESS" in out
    tests = yaml.safe_load((PROMETHEUS / "rules_test.yml").read_text("utf-8"))["tests"]
    firing: set[str] = set()
    quiet: set[str] = set()
    for case in tests:
        for check in case.get("alert_rule_test", []):
            (firing if check["exp_alerts"] else quiet).add(check["alertname"])
    alerts = {str(r["alert"]) for r in load_rules() if "alert" in r}
    assert firing == alerts, alerts ^ firing
    assert quiet == alerts, alerts ^ quiet


# --- a real Prometheus -------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Prometheus:
    """The HTTP API of a Prometheus server at ``url``."""

    def __init__(self, url: str) -> None:
        self.url = url

    def get(self, path: str, **params: str) -> dict[str, Any]:
        """The JSON answer of ``GET path?params`` (error answers too: 400 carries JSON)."""
        query = urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(f"{self.url}{path}?{query}", timeout=5) as resp:
                body = resp.read()
        except urllib.error.HTTPError as e:
            body = e.read()
        answer: dict[str, Any] = json.loads(body)
        return answer

    def query(self, promql: str) -> dict[str, Any]:
        return self.get("/api/v1/query", query=promql)


@pytest.fixture
def prometheus_at(tmp_path: Path) -> Iterator[Any]:
    """Start a Prometheus scraping a target each second, with rules.yml evaluated each
    second; yields a function ``start(target) -> Prometheus`` (ready to answer)."""
    binary = binary_or_skip("prometheus")
    procs: list[subprocess.Popen[bytes]] = []

    def start(target: str) -> Prometheus:
        config = tmp_path / "prometheus.yml"
        config.write_text(yaml.safe_dump({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(RULES)],
            "scrape_configs": [{"job_name": "lightrail-controller",
                                "static_configs": [{"targets": [target]}]}],
        }))
        port = _free_port()
        log = (tmp_path / "prometheus.log").open("wb")
        procs.append(subprocess.Popen(
            [binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
            stdout=log, stderr=subprocess.STDOUT))
        prom = Prometheus(f"http://127.0.0.1:{port}")
        deadline = time.monotonic() + WAIT_S
        while True:
            try:
                with urllib.request.urlopen(f"{prom.url}/-/ready", timeout=1):
                    return prom
            except OSError:
                if procs[-1].poll() is not None or time.monotonic() > deadline:
                    raise AssertionError("prometheus did not start: "
                                         + (tmp_path / "prometheus.log").read_text()) from None
                time.sleep(0.05)

    yield start
    for proc in procs:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest_asyncio.fixture
async def polled_ctl(etcd: EmbeddedEtcd) -> AsyncIterator[RunningController]:
    """A controller on demo-4x2 (2 ms delay) polling optical power every 0.5 s."""
    cfg = embedded_config(
        etcd.endpoint,
        FabricSection.model_validate({"builtin": "demo-4x2", "reconfiguration_delay_ms": 2}),
        admission_timeout_s=5.0)
    cfg = cfg.model_copy(update={"controller": cfg.controller.model_copy(
        update={"power_poll_interval_s": 0.5})})
    async with running_controller(cfg, devices=EmulatedFabricDevices()) as rc:
        yield rc


async def _until(what: str, check: Any, timeout_s: float = WAIT_S) -> Any:
    """Poll the blocking ``check()`` (off the loop) until it returns something true."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = await asyncio.to_thread(check)
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        await asyncio.sleep(0.1)


def _values(answer: dict[str, Any]) -> list[float]:
    assert answer["status"] == "success", answer
    return [float(r["value"][1]) for r in answer["data"]["result"]]


async def test_a_real_prometheus_runs_every_dashboard_and_rule_expression(
    polled_ctl: RunningController, prometheus_at: Any
) -> None:
    async with ControllerClient(polled_ctl.grpc_target, retry_budget_s=2.0) as client:
        await client.register_job("prom-job", PLACE)
        await asyncio.gather(*(client.enter("prom-job", r, RING, timeout_s=5.0)
                               for r in range(8)))
    target = polled_ctl.metrics_url.removeprefix("http://").removesuffix("/metrics")
    prom: Prometheus = await asyncio.to_thread(prometheus_at, target)

    def target_up() -> bool:
        targets = prom.get("/api/v1/targets")["data"]["activeTargets"]
        return bool(targets) and all(t["health"] == "up" for t in targets)

    # the ring holds 8 cross-connects (16 ports on 2 switches), read every 0.5 s; the
    # registry is the process's, so earlier tests' series may be there too: look at ours
    in_use = {(sid, str(p)) for sid in ("ocs-rail0", "ocs-rail1")
              for xc in polled_ctl.service.coordinator.confirmed(sid)
              for p in (xc.ingress, xc.egress)}
    assert len(in_use) == 16

    def scraped_power() -> dict[tuple[str, str], float]:
        answer = prom.query('lightrail_port_power_dbm{switch=~"ocs-rail[01]"}')
        assert answer["status"] == "success", answer
        power = {(r["metric"]["switch"], r["metric"]["port"]): float(r["value"][1])
                 for r in answer["data"]["result"]}
        return power if in_use <= power.keys() else {}

    def rules_evaluated() -> list[dict[str, Any]] | None:
        rules = [r for g in prom.get("/api/v1/rules")["data"]["groups"] for r in g["rules"]]
        done = len(rules) == len(load_rules()) and all(
            not r["lastEvaluation"].startswith("0001-") for r in rules)
        return rules if done else None

    await _until("the controller's target up", target_up)
    power = await _until("optical power scraped", scraped_power)
    assert {power[port] for port in in_use} == {-3.0}
    rules = await _until("every rule evaluated", rules_evaluated)
    assert [(r["name"], r["health"], r.get("lastError", "")) for r in rules
            if r["health"] != "ok"] == []

    expressions = dashboard_expressions() + rule_expressions()
    answers = await asyncio.to_thread(lambda: [prom.query(e.promql) for e in expressions])
    failed = [(e.where, a.get("error")) for e, a in zip(expressions, answers, strict=True)
              if a["status"] != "success"]
    assert failed == []

    body = await asyncio.to_thread(
        lambda: urllib.request.urlopen(polled_ctl.metrics_url, timeout=5).read().decode())
    exported = exported_names(families_of(body))
    known = exported | GENERATED_BY_PROMETHEUS | recorded_names()
    unknown = {(e.where, n) for e in expressions for n in metric_names(e.promql) - known}
    assert unknown == set()
    # and the data is there, as Prometheus stored it
    assert _values(prom.query("sum(lightrail_leader)")) == [1.0]
    assert _values(prom.query('lightrail_switch_up{switch=~"ocs-rail[01]"}')
                   ) == [1.0, 1.0]
    assert _values(prom.query('lightrail_build_info{version!=""}')) == [1.0]
    assert _values(prom.query('sum(lightrail_phase_admissions_total{job_id="prom-job"})')
                   ) == [8.0]
    assert _values(prom.query("sum(lightrail_etcd_request_seconds_count)"))[0] > 0
