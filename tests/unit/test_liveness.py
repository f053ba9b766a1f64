"""JobLiveness and expire_idle_jobs (issue 14 section 3), on an injected clock."""

from __future__ import annotations

import asyncio

import pytest

from lightrail.controller.runtime.liveness import JobLiveness, expire_idle_jobs


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_attached_jobs_never_expire_and_the_last_detach_starts_the_clock() -> None:
    clock = Clock()
    live = JobLiveness(clock)
    live.attach("a")
    live.attach("a")  # two streams
    live.touch("b")  # registered, no stream
    clock.now += 50
    assert live.expired(["a", "b"], 30) == [("b", 50.0)]
    live.detach("a")
    assert live.attached("a") and live.idle_s("a") is None
    clock.now += 5
    live.detach("a")
    assert not live.attached("a") and live.idle_s("a") == 0.0
    clock.now += 29
    assert [j for j, _ in live.expired(["a", "b"], 30)] == ["b"]
    clock.now += 1
    assert live.expired(["a", "b"], 30) == [("b", 85.0), ("a", 30.0)]  # oldest first


def test_touch_restarts_an_idle_clock_but_not_while_attached() -> None:
    clock = Clock()
    live = JobLiveness(clock)
    live.touch("a")
    clock.now += 20
    live.touch("a")  # e.g. a unary release
    clock.now += 20
    assert live.expired(["a"], 30) == []
    assert live.idle_s("a") == 20.0
    live.attach("a")
    live.touch("a")
    assert live.idle_s("a") is None


def test_registered_jobs_never_seen_start_idle_and_gone_jobs_are_dropped() -> None:
    clock = Clock()
    live = JobLiveness(clock)
    assert live.expired(["recovered"], 10) == []  # e.g. restored from etcd: idle from now
    clock.now += 10
    assert live.expired(["recovered"], 10) == [("recovered", 10.0)]
    live.touch("unknown")  # a call for a job that is not registered
    assert live.expired([], 0.5) == []
    assert live.idle_s("unknown") is None and live.idle_s("recovered") is None


def test_expire_idle_jobs_retires_each_expired_job_once_and_retries_failures() -> None:
    clock = Clock()
    live = JobLiveness(clock)
    registered = {"a", "b"}
    retired: list[tuple[str, str]] = []
    fail = {"b": 1}
    sweeps = 0

    async def retire(job_id: str, reason: str) -> bool:
        if fail.get(job_id):
            fail[job_id] -= 1
            raise OSError("etcd unavailable")
        retired.append((job_id, reason))
        registered.discard(job_id)
        return True

    async def sleep(_s: float) -> None:
        nonlocal sweeps
        sweeps += 1
        if sweeps == 4:
            raise asyncio.CancelledError
        clock.now += 60

    live.touch("a")
    live.touch("b")

    async def main() -> None:
        with pytest.raises(asyncio.CancelledError):
            await expire_idle_jobs(live, lambda: sorted(registered), retire, 60.0, sleep)

    asyncio.run(main())
    # first sweep: a retired, b failed (store down); second sweep: b retired
    assert [j for j, _ in retired] == ["a", "b"]
    assert retired[0][1] == ("expired: no stream and no call for 60 s "
                             "(controller.job_idle_expiry_s = 60)")
    assert registered == set()
