"""bench/hot_path.py's ``--controller-wrapper``: the controller runs under the wrapper's
command line (as under valgrind or a profiler), serves, and exits on SIGTERM."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from hot_path import ControllerProcess

from lightrail.controller.store.etcd_server import EmbeddedEtcd

LIGHTRAIL = Path(sys.executable).with_name("lightrail")


def _argv(pid: int) -> list[bytes]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")


def _words(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").split()


async def test_the_controller_runs_under_the_wrapper(etcd: EmbeddedEtcd, tmp_path: Path) -> None:
    marker = tmp_path / "wrapped"
    # a wrapper that leaves a mark, then runs the command it was given in its own place
    wrapper = ["sh", "-c", f'echo "$@" > {marker}; exec "$@"', "wrapper"]
    ctrl = ControllerProcess(tmp_path, etcd.endpoint, 8, 0.0, lightrail=LIGHTRAIL,
                             wrapper=wrapper)
    await ctrl.start(30.0)  # returns once the controller's health check says SERVING
    try:
        assert ctrl.pid is not None
        assert b"controller" in _argv(ctrl.pid)  # exec'd: the wrapper's pid is the controller's
    finally:
        code = await ctrl.stop(15.0)
    assert code == 0
    assert _words(marker)[:2] == [str(LIGHTRAIL), "controller"]
