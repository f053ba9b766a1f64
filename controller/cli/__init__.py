"""The `lightrail` command: the composition root that wires the daemon, agents and emulator.

One module per command group (``daemons``, ``replay``, ``operator``, ``slices``); ``main`` builds
the parser.

Importing this package sets the process's gRPC environment (``GRPC_ENVIRONMENT``), which gRPC
core reads once, when ``grpc`` is first imported: so it comes before any submodule imports
grpc. ``tests/conftest.py`` and the benchmarks set it (``grpc_environment``) before they import
grpc for the same reason, so that the controllers they run in-process serve as the daemon
does.
"""

import os
from collections.abc import Mapping
from typing import Final

GRPC_ENVIRONMENT: Final = {
    # The CLI forks etcd and controller processes; gRPC's fork handlers are for
    # fork-without-exec and only print warnings then.
    "GRPC_ENABLE_FORK_SUPPORT": "false",
    # gRPC's connections on iomgr, polled by grpc.aio's own poller thread (which reads the
    # socket and completes the call in one place), not on EventEngine's thread pool (which
    # hands each read and write between its threads before the poller thread sees them):
    # Python gRPC's transport until EventEngine became its default (grpc/grpc#41432). For the
    # server (listener, accepted connections) and the clients (the agent's channel, etcd's).
    # Measured with bench/hot_path.py, interleaved, on a 2-core VM (README "Benchmarks"):
    # controller CPU per boundary -17 % at N=256 and -19 % at N=2048; the Python load
    # generator's own CPU -1 to -43 % (median -20 %). The pinned grpcio keeps the iomgr
    # endpoints; a release without them would reject the names ("Unknown experiment" in its
    # log) and run on EventEngine, which tests/integration/test_grpc_environment.py would
    # report.
    "GRPC_EXPERIMENTS": "-event_engine_listener,-event_engine_for_all_other_endpoints,"
                        "-event_engine_client",
}
"""Environment variables this process sets for gRPC unless already set (a value of the
caller's own wins whole: ``GRPC_EXPERIMENTS=`` restores gRPC's defaults)."""


def grpc_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """``GRPC_ENVIRONMENT``, each variable that ``environ`` already sets taken from it: use
    ``os.environ.update(grpc_environment(os.environ))`` before ``import grpc`` (it takes effect
    only then, in this process and in those it starts, which inherit it)."""
    return {name: environ.get(name, value) for name, value in GRPC_ENVIRONMENT.items()}


os.environ.update(grpc_environment(os.environ))
