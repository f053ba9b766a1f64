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
    # A server's listener and its accepted connections on iomgr (polled by grpc.aio's own
    # poller thread, which reads the socket and completes the call in one place) instead of
    # EventEngine's thread pool, which hands each read and write between its threads before
    # the poller thread sees it: Python gRPC's server path until EventEngine became its
    # default (grpc/grpc#41432). Clients are unchanged (``event_engine_client``). Measured with
    # bench/hot_path.py, interleaved on a 2-core VM (README "Benchmarks"): controller CPU per
    # boundary -17 % at N=256 and -19 % at N=2048, N=8 unchanged. The iomgr endpoints stay in
    # the pinned grpcio; a release without them would reject the names ("Unknown experiment"
    # in its log) and serve on EventEngine.
    "GRPC_EXPERIMENTS": "-event_engine_listener,-event_engine_for_all_other_endpoints",
}
"""Environment variables this process sets for gRPC unless already set (a value of the
caller's own wins whole: ``GRPC_EXPERIMENTS=`` restores gRPC's defaults)."""



def grpc_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """``GRPC_ENVIRONMENT``, where ``environ`` sets none of its variables:
    ``os.environ.update(grpc_environment(os.environ))`` before ``import grpc`` (it takes effect
    only then, in this process and in those it starts, which inherit it)."""
    return {name: environ.get(name, value) for name, value in GRPC_ENVIRONMENT.items()}


os.environ.update(grpc_environment(os.environ))
