"""Eager start of a coroutine (what Python 3.12's ``asyncio.eager_task_factory`` does, for
3.11): run it in the caller up to its first suspension and make a task only when it does
suspend.

The hot path uses it for reconfigurations: on an idle switch of the emulator or a fast device
the whole reconcile runs without suspending, so the admission goes out without a task, a loop
turn and a done callback per phase instance.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Generator
from typing import Any


def start_eager(
    tg: asyncio.TaskGroup, coro: Coroutine[Any, Any, None], name: str
) -> asyncio.Task[None] | None:
    """Run ``coro`` now, in the caller, until it first suspends. Returns None when it finished
    in that step; else the task of ``tg`` (named ``name``) that runs the rest of it.

    An ``Exception`` it raises in the first step is not raised to the caller: it is raised
    again in a task of ``tg``, as if ``coro`` had been a task from the start (so a bug still
    fails the task group instead of the caller's request). The task drives ``coro`` itself
    (``_Continuation``): its cancellation, even before it first runs, is thrown into ``coro``
    where it is suspended, so ``coro``'s ``finally`` blocks run as for a plain task.
    """
    try:
        yielded = coro.send(None)
    except StopIteration:
        return None
    except Exception as exc:  # handed to the task group, as a task would
        return tg.create_task(_raise(exc), name=name)
    return tg.create_task(_Continuation(coro, yielded), name=name)


async def _raise(exc: Exception) -> None:
    raise exc


class _Continuation(Coroutine[Any, Any, None]):
    """``coro`` after its first step, as a coroutine for ``asyncio.Task``: the task's first
    ``send`` returns what that step yielded (an asyncio future, or None for a bare yield), so
    the task waits on it exactly as it would have; every later ``send`` / ``throw`` /
    ``close`` goes to ``coro``."""

    __slots__ = ("_coro", "_first")

    _NONE: Any = object()

    def __init__(self, coro: Coroutine[Any, Any, None], yielded: Any) -> None:
        self._coro = coro
        self._first = yielded

    def send(self, value: Any) -> Any:
        first = self._first
        if first is not _Continuation._NONE:
            self._first = _Continuation._NONE
            return first
        return self._coro.send(value)

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any:
        self._first = _Continuation._NONE  # the error goes in where coro is suspended
        if val is None and tb is None:
            return self._coro.throw(typ)
        return self._coro.throw(typ, val, tb)

    def close(self) -> None:
        self._first = _Continuation._NONE
        self._coro.close()

    def __await__(self) -> Generator[Any, None, None]:
        raise TypeError("a _Continuation is driven by its task, not awaited")
