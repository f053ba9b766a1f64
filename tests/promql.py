"""The PromQL that ships in deploy/: every expression of the Grafana dashboards and of the
Prometheus rules, with where it comes from, and the metric names an expression reads.

Shared by tests/unit/test_dashboards.py (structure) and tests/integration/test_prometheus.py
(a real Prometheus parses each expression; the daemon exports each metric named). The metric
names are found by a small lexer, not a PromQL parser: string literals, label matchers, label
lists of ``by``/``without``/``on``/``ignoring``/``group_*``, range and subquery brackets and
function calls are removed, and what remains that looks like a metric name is one. The real
Prometheus test backs it: an expression whose names were misread would still have to parse.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
DASHBOARDS = ROOT / "deploy" / "grafana" / "dashboards"
PROVISIONING = ROOT / "deploy" / "grafana" / "provisioning"
PROMETHEUS = ROOT / "deploy" / "prometheus"
RULES = PROMETHEUS / "rules.yml"

GENERATED_BY_PROMETHEUS = frozenset({"up", "ALERTS", "ALERTS_FOR_STATE"})
"""Series Prometheus makes itself (scrape health, alert state), not exported by the daemon."""

GRAFANA_SUBSTITUTES = {
    "$__rate_interval": "1m",
    "$__interval": "15s",
    "$__range": "1h",
}
"""What Grafana puts in place of its built-in variables, for sending a panel's query to
Prometheus directly (any duration parses; a dashboard variable becomes ``.+``)."""

_KEYWORDS = frozenset({"and", "or", "unless", "by", "without", "on", "ignoring", "group_left",
                       "group_right", "offset", "bool", "inf", "nan", "atan2"})


@dataclass(frozen=True, slots=True)
class Expression:
    """One PromQL expression: ``where`` names its file and panel, rule or variable;
    ``expr`` is as written; ``promql`` has Grafana's variables replaced so Prometheus can
    run it."""

    where: str
    expr: str
    promql: str


def grafana_to_promql(expr: str) -> str:
    """``expr`` with Grafana's built-in variables replaced by durations and dashboard
    variables (``$job_id``, ``${switch}``) by ``.+`` (they stand in ``=~"..."`` matchers)."""
    for name, value in GRAFANA_SUBSTITUTES.items():
        expr = expr.replace(name, value)
    return re.sub(r"\$\{?\w+\}?", ".+", expr)


def load_dashboards() -> dict[str, dict[str, object]]:
    """Every dashboard JSON by file name."""
    return {p.name: json.loads(p.read_text(encoding="utf-8"))
            for p in sorted(DASHBOARDS.glob("*.json"))}


def _label_values_metric(query: str) -> str:
    """The metric of Grafana's ``label_values(metric, label)`` (``metric`` may carry
    matchers)."""
    m = re.fullmatch(r"label_values\(\s*(.+?)\s*,\s*\w+\s*\)", query.strip())
    assert m is not None, f"not a label_values(metric, label) query: {query!r}"
    return m[1]


def dashboard_expressions() -> list[Expression]:
    """Every panel target's ``expr`` and every query variable's metric, of every dashboard."""
    out: list[Expression] = []
    for name, board in load_dashboards().items():
        for panel in board["panels"]:  # type: ignore[attr-defined]
            for target in panel["targets"]:
                where = f"{name} panel {panel['id']} {panel['title']!r} {target['refId']}"
                out.append(Expression(where, target["expr"], grafana_to_promql(target["expr"])))
        for var in board["templating"]["list"]:  # type: ignore[index]
            if var.get("type") == "query":
                metric = _label_values_metric(var["query"]["query"])
                out.append(Expression(f"{name} variable {var['name']}", metric,
                                      grafana_to_promql(metric)))
    return out


def load_rules() -> list[dict[str, object]]:
    """Every rule of rules.yml (recording and alerting), in file order."""
    doc = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    return [rule for group in doc["groups"] for rule in group["rules"]]


def rule_expressions() -> list[Expression]:
    """Every rule's ``expr`` of rules.yml."""
    out = []
    for rule in load_rules():
        name = rule.get("alert") or rule.get("record")
        expr = str(rule["expr"]).strip()
        out.append(Expression(f"rules.yml {name}", expr, expr))
    return out


def recorded_names() -> frozenset[str]:
    """The series names the recording rules of rules.yml make."""
    return frozenset(str(r["record"]) for r in load_rules() if "record" in r)


def metric_names(expr: str) -> frozenset[str]:
    """The metric names ``expr`` reads (see the module doc for how they are found)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', '""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)  # ranges and subqueries
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    text = re.sub(r"\boffset\s+-?\w+", " ", text)
    names: set[str] = set()
    for m in re.finditer(r"[\w:.]+", text):  # whole tokens: no prefix of a function name
        token = m[0]
        if not re.fullmatch(r"[A-Za-z_:][\w:]*", token) or token.lower() in _KEYWORDS:
            continue  # a number, a duration
        if re.match(r"\s*\(", text[m.end():]):
            continue  # a function or aggregation
        names.add(token)
    return frozenset(names)


def exported_names(families: dict[str, str]) -> frozenset[str]:
    """The series names a scrape holds, from its families (name -> type, as in ``# TYPE``):
    a histogram's ``_bucket``, ``_sum`` and ``_count``, a summary's ``_sum`` and ``_count``,
    the rest by their own name."""
    names: set[str] = set()
    for family, kind in families.items():
        if kind == "histogram":
            names.update(f"{family}{s}" for s in ("_bucket", "_sum", "_count"))
        elif kind == "summary":
            names.update((family, f"{family}_sum", f"{family}_count"))
        else:
            names.add(family)
    return frozenset(names)


def families_of(metrics_text: str) -> dict[str, str]:
    """Family name -> type of every ``# TYPE`` line of a /metrics page (every family the
    daemon declares, with or without samples yet)."""
    return dict(re.findall(r"^# TYPE (\S+) (\S+)$", metrics_text, flags=re.MULTILINE))


def binary_or_skip(name: str) -> str:
    """The path of ``name`` (Debian package ``prometheus``), or skip the test; with
    ``LIGHTRAIL_REQUIRE_ETCD=1`` (CI, which installs prometheus with etcd) a failure."""
    path = shutil.which(name)
    if path is None:
        why = f"{name} not found (Debian package: prometheus)"
        if os.environ.get("LIGHTRAIL_REQUIRE_ETCD") == "1":
            pytest.fail(f"{why}; LIGHTRAIL_REQUIRE_ETCD=1 requires it", pytrace=False)
        pytest.skip(why)
    return path
