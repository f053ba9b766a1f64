"""``controller.runtime.eager.start_eager``: a coroutine runs in the caller until it first
suspends; the rest goes on in a task that behaves like a plain one (results, errors,
cancellation reaching the coroutine's ``finally``)."""

from __future__ import annotations

import asyncio

import pytest

from lightrail.controller.runtime.eager import start_eager


async def test_a_coroutine_that_never_suspends_finishes_in_the_caller() -> None:
    done: list[str] = []

    async def quick() -> None:
        done.append("ran")

    async with asyncio.TaskGroup() as tg:
        assert start_eager(tg, quick(), "quick") is None
        assert done == ["ran"]  # before the caller yielded to the loop


async def test_a_suspending_coroutine_runs_its_first_step_now_and_the_rest_in_a_task() -> None:
    steps: list[str] = []
    gate: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    async def slow() -> None:
        steps.append("first")
        steps.append(f"got {await gate}")
        await asyncio.sleep(0)  # a bare yield after a future
        steps.append("last")

    async with asyncio.TaskGroup() as tg:
        task = start_eager(tg, slow(), "slow")
        assert task is not None and task.get_name() == "slow"
        assert steps == ["first"]
        gate.set_result(7)
        await asyncio.wait_for(task, 5)
    assert steps == ["first", "got 7", "last"]


async def test_an_error_in_the_first_step_fails_the_task_group_not_the_caller() -> None:
    async def broken() -> None:
        raise ValueError("bug")

    with pytest.raises(ExceptionGroup) as info:
        async with asyncio.TaskGroup() as tg:
            assert start_eager(tg, broken(), "broken") is not None  # no raise here
    assert [type(e) for e in info.value.exceptions] == [ValueError]


async def test_an_exception_of_an_awaited_future_reaches_the_coroutine() -> None:
    seen: list[str] = []
    gate: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    async def waits() -> None:
        try:
            await gate
        except KeyError as exc:
            seen.append(f"caught {exc}")

    async with asyncio.TaskGroup() as tg:
        task = start_eager(tg, waits(), "waits")
        assert task is not None
        gate.set_exception(KeyError("k"))
        await asyncio.wait_for(task, 5)
    assert seen == ["caught 'k'"]


@pytest.mark.parametrize("before_first_run", [True, False])
async def test_cancelling_the_task_runs_the_coroutines_finally(before_first_run: bool) -> None:
    cleaned: list[str] = []
    gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def holds() -> None:
        try:
            await gate
        finally:
            cleaned.append("finally")

    async with asyncio.TaskGroup() as tg:
        task = start_eager(tg, holds(), "holds")
        assert task is not None
        if not before_first_run:
            await asyncio.sleep(0)  # the task is now waiting on the gate
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert cleaned == ["finally"]
    assert gate.cancelled() == (not before_first_run)
