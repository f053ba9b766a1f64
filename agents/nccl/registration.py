"""The framework side of the NCCL plugin: tell the host agent which job and global ranks a
communicator has (NCCL hands its profiler plugin only the communicator's name, hash, size and
rank). A process-group backend calls ``register_comm`` for each NCCL communicator it creates,
before the communicator's first call; every rank may register the same communicator (the
same registration again is accepted).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence

from lightrail.agents.nccl.wire import (
    HEADER_BYTES,
    FrameError,
    Register,
    Registered,
    Status,
    check_register,
    decode,
    decode_header,
    encode,
)

SOCKET_ENV = "LIGHTRAIL_NCCL_SOCKET"
DEFAULT_SOCKET = "/run/lightrail/nccl.sock"


class RegistrationRefused(ValueError):
    """The agent refused the registration; the message says which field and value."""


def nccl_socket_path() -> str:
    """The agent's NCCL socket: ``LIGHTRAIL_NCCL_SOCKET``, else ``/run/lightrail/nccl.sock``."""
    return os.environ.get(SOCKET_ENV) or DEFAULT_SOCKET


def read_exactly(sock: socket.socket, n: int) -> bytes:
    """``n`` bytes from the blocking stream ``sock``. Raises ``ConnectionError`` when the agent
    closes it first, ``OSError`` (``TimeoutError``) from the socket."""
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("the host agent closed the NCCL socket before answering")
        data += chunk
    return data


def register_comm(
    socket_path: str | None,
    comm_name: str,
    job_id: str,
    global_ranks: Sequence[int],
    rank: int,
    *,
    comm_hash: int = 0,
    gated: bool = True,
    timeout_s: float = 10.0,
) -> None:
    """Register the communicator ``comm_name`` (NCCL's ``commName``; or, when it is "", the
    communicator whose NCCL ``commHash`` is ``comm_hash``) as job ``job_id``'s group whose
    communicator rank i is global rank ``global_ranks[i]``; ``rank``: the caller's global rank.
    ``gated`` False: a group inside one host, never gated. ``socket_path`` None: the default
    (``nccl_socket_path``). Blocks until the agent answered (at most ``timeout_s``).

    Raises ``RegistrationRefused`` (the agent's reason, naming the field and value),
    ``lightrail.agents.nccl.wire.FrameError`` for values that cannot be sent (an empty job id,
    ``rank`` not in ``global_ranks``, duplicates, a name over 1024 bytes, a negative rank),
    ``OSError`` when no agent listens there (``FileNotFoundError``,
    ``ConnectionRefusedError``) or it does not answer in time (``TimeoutError``)."""
    frame = check_register(
        Register(comm_name, comm_hash, job_id, tuple(global_ranks), rank, gated))
    data = encode(frame)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout_s)
        sock.connect(socket_path or nccl_socket_path())
        sock.sendall(data)
        header = decode_header(read_exactly(sock, HEADER_BYTES))
        reply = decode(header.type, read_exactly(sock, header.length))
    if not isinstance(reply, Registered):
        raise FrameError(f"type={header.type.name} answers a REGISTER; REGISTERED expected")
    if reply.status is not Status.OK:
        raise RegistrationRefused(reply.message)
