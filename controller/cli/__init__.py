"""The `lightrail` command: the composition root that wires the daemon, agents and emulator.

One module per command group (``daemons``, ``replay``, ``operator``, ``slices``); ``main`` builds
the parser.
"""

import os

# The CLI forks etcd and controller processes; gRPC's fork handlers only print warnings then.
# Set here, before any submodule imports grpc.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
