"""The metric declarations: every job-labelled metric is forgotten with its job, leader
transitions are counted, the build is described."""

from __future__ import annotations

import platform

import grpc
from prometheus_client import Counter, Gauge, Histogram

from lightrail.controller.runtime import metrics
from lightrail.controller.runtime.metrics import REGISTRY


def _label_names(metric: object) -> tuple[str, ...]:
    names = getattr(metric, "_labelnames", ())
    assert isinstance(names, tuple)
    return names


def test_every_metric_with_a_job_id_label_is_forgotten_with_its_job() -> None:
    declared = [m for m in vars(metrics).values()
                if isinstance(m, Counter | Gauge | Histogram)
                and "job_id" in _label_names(m)]
    assert declared  # the check below would pass on an empty list
    assert set(map(id, declared)) == set(map(id, metrics.JOB_METRICS))


def test_forget_job_removes_that_job_only() -> None:
    metrics.PHASE_ADMISSIONS.labels("fj-a", "noop").inc()
    metrics.PHASE_ADMISSION_SECONDS.labels("fj-a", "all_reduce").observe(0.01)
    metrics.STALL_SECONDS.labels("fj-a").inc(1.0)
    metrics.PHASE_ADMISSIONS.labels("fj-b", "noop").inc()
    metrics.forget_job("fj-a")
    job_ids = {s.labels.get("job_id") for m in REGISTRY.collect() for s in m.samples}
    assert "fj-a" not in job_ids
    assert "fj-b" in job_ids
    metrics.forget_job("fj-b")


def test_leader_transitions_count_each_change() -> None:
    def count(to: str) -> float:
        return REGISTRY.get_sample_value("lightrail_leader_transitions_total", {"to": to}) or 0

    leader, standby = count("leader"), count("standby")
    metrics.set_leader(True)
    assert REGISTRY.get_sample_value("lightrail_leader") == 1
    metrics.set_leader(False)
    assert REGISTRY.get_sample_value("lightrail_leader") == 0
    assert (count("leader"), count("standby")) == (leader + 1, standby + 1)


def test_build_info_names_the_versions() -> None:
    [sample] = [s for m in REGISTRY.collect() if m.name == "lightrail_build"
                for s in m.samples]
    assert sample.name == "lightrail_build_info" and sample.value == 1
    assert sample.labels["python"] == platform.python_version()
    assert sample.labels["grpc"] == grpc.__version__
    assert sample.labels["version"]


def test_etcd_requests_are_timed_by_method() -> None:
    def count() -> float:
        return REGISTRY.get_sample_value("lightrail_etcd_request_seconds_count",
                                         {"method": "txn"}) or 0

    before = count()
    metrics.observe_etcd_request("txn", 0.002)
    assert count() == before + 1
