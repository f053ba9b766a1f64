"""The systemd notification helper against a real AF_UNIX datagram socket (path and abstract
namespace), the watchdog interval rules of sd_watchdog_enabled(3), and the no-op without
``$NOTIFY_SOCKET``."""

from __future__ import annotations

import asyncio
import os
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from lightrail.controller.runtime.sdnotify import SystemdNotifier


@pytest.fixture
def listener(tmp_path: Path) -> Iterator[tuple[socket.socket, str]]:
    """A datagram socket bound where ``$NOTIFY_SOCKET`` would name it, and that name."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    path = str(tmp_path / "notify.sock")
    sock.bind(path)
    sock.settimeout(5.0)
    yield sock, path
    sock.close()


def received(sock: socket.socket) -> list[str]:
    return sock.recv(4096).decode().split("\n")


def test_ready_status_reloading_stopping_reach_the_socket(
    listener: tuple[socket.socket, str],
) -> None:
    sock, path = listener
    notifier = SystemdNotifier.from_environ({"NOTIFY_SOCKET": path})
    assert notifier.enabled
    assert notifier.ready("standby:\nserving")
    assert received(sock) == ["READY=1", "STATUS=standby: serving"]  # one line
    assert notifier.reloading("reloading")
    lines = received(sock)
    assert lines[0] == "RELOADING=1"
    assert lines[1].startswith("MONOTONIC_USEC=") and lines[1].split("=")[1].isdecimal()
    assert lines[2] == "STATUS=reloading"
    assert notifier.stopping()
    assert received(sock) == ["STOPPING=1"]
    assert notifier.status("leading")
    assert received(sock) == ["STATUS=leading"]
    notifier.close()


def test_abstract_namespace_socket() -> None:
    name = f"lightrail-test-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(5.0)
        notifier = SystemdNotifier.from_environ({"NOTIFY_SOCKET": "@" + name})
        assert notifier.watchdog()
        assert received(sock) == ["WATCHDOG=1"]
        notifier.close()


def test_no_notify_socket_is_a_no_op() -> None:
    notifier = SystemdNotifier.from_environ({})
    assert not notifier.enabled
    assert not notifier.ready("x")
    assert notifier.watchdog_interval_s is None


def test_a_missing_socket_is_logged_not_raised(tmp_path: Path) -> None:
    notifier = SystemdNotifier(str(tmp_path / "gone.sock"))
    assert notifier.ready() is False


def test_watchdog_interval_is_half_the_timeout_for_this_process_only() -> None:
    env = {"NOTIFY_SOCKET": "/run/x", "WATCHDOG_USEC": "3000000"}
    assert SystemdNotifier.from_environ(env).watchdog_interval_s == 1.5
    own = {**env, "WATCHDOG_PID": str(os.getpid())}
    assert SystemdNotifier.from_environ(own).watchdog_interval_s == 1.5
    other = {**env, "WATCHDOG_PID": str(os.getpid() + 1)}
    assert SystemdNotifier.from_environ(other).watchdog_interval_s is None
    for bad in ("0", "-5", "soon", ""):
        bad_env = {**env, "WATCHDOG_USEC": bad}
        assert SystemdNotifier.from_environ(bad_env).watchdog_interval_s is None
    assert SystemdNotifier.from_environ({"WATCHDOG_USEC": "3000000"}).watchdog_interval_s is None


async def test_watchdog_task_pings_from_the_event_loop(
    listener: tuple[socket.socket, str],
) -> None:
    sock, path = listener
    notifier = SystemdNotifier(path, watchdog_usec=20_000)  # every 10 ms
    task = asyncio.create_task(notifier.run_watchdog())
    try:
        for _ in range(3):
            assert await asyncio.to_thread(received, sock) == ["WATCHDOG=1"]
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        notifier.close()


async def test_watchdog_task_returns_without_a_watchdog() -> None:
    await asyncio.wait_for(SystemdNotifier("/run/x").run_watchdog(), 5.0)
