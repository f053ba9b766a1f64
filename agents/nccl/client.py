"""Phase calls over the host agent's frame socket (``lightrail agent --nccl-socket``), for a
framework side in Python: the torch gate uses it when ``LIGHTRAIL_NCCL_SOCKET`` is set.

The same frames as the NCCL profiler plugin (``agents/nccl/lightrail_nccl_wire.h``): each
process group is a communicator of this connection (REGISTER with its global ranks, then
INIT); ENTER blocks until its ADMIT; RELEASE is written and not answered. One ordered stream
socket, so a release always reaches the agent before the next enter, with no round trip —
where the gRPC socket (``lightrail.agents.client.BlockingPhaseClient``) waits for each
ReleasePhase's reply.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable

from lightrail.agents.errors import Admission, ControllerUnavailable, error_for
from lightrail.agents.nccl.registration import RegistrationRefused, read_exactly
from lightrail.agents.nccl.wire import (
    HEADER_BYTES,
    Admit,
    Enter,
    Fini,
    FrameError,
    Init,
    Register,
    Registered,
    Release,
    Status,
    check_register,
    decode,
    decode_header,
    encode,
)
from lightrail.controller.domain.errors import ErrorCode
from lightrail.controller.domain.model import PhaseKey, ProcessGroup


class FramePhaseClient:
    """EnterPhase/ReleasePhase of one rank over the agent's frame socket at ``socket_path``
    (blocking; thread-safe: one call at a time). ``job_id`` and ``rank`` (global) are fixed for
    the connection. Raises ``ControllerUnavailable`` when the agent cannot be reached or goes
    away, ``PhaseError`` subclasses for refusals, ``RegistrationRefused`` when the agent refuses
    a group's registration."""

    def __init__(self, socket_path: str, job_id: str, rank: int, *,
                 connect_timeout_s: float = 10.0) -> None:
        self.socket_path = socket_path
        self.job_id = job_id
        self.rank = rank
        self._lock = threading.Lock()
        self._comms: dict[ProcessGroup, int] = {}
        self._held: dict[tuple[int, str], int] = {}
        self._seq = 0
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.settimeout(connect_timeout_s)
        try:
            self._sock.connect(socket_path)
        except OSError as exc:
            self._sock.close()
            raise ControllerUnavailable(
                ErrorCode.NOT_LEADER,
                f"host agent frame socket {socket_path}: {exc.strerror or exc}") from None
        self._sock.settimeout(None)

    def _io(self, what: str, fn: Callable[[], object]) -> object:
        try:
            return fn()
        except (OSError, ConnectionError) as exc:
            raise ControllerUnavailable(
                ErrorCode.NOT_LEADER,
                f"host agent frame socket {self.socket_path}: {what}: {exc}") from None

    def _read_frame(self) -> object:
        header = decode_header(read_exactly(self._sock, HEADER_BYTES))
        return decode(header.type, read_exactly(self._sock, header.length))

    def _comm(self, group: ProcessGroup) -> int:
        """This connection's communicator id of ``group`` (registered and announced at first
        use)."""
        comm = self._comms.get(group)
        if comm is not None:
            return comm
        comm = len(self._comms) + 1
        name = f"lightrail-gate/{self.job_id}/{os.getpid()}/{comm}"
        reg = check_register(Register(name, 0, self.job_id, group.ranks, self.rank))
        self._io("REGISTER", lambda: self._sock.sendall(encode(reg)))
        reply = self._io("REGISTERED", self._read_frame)
        if not isinstance(reply, Registered):
            raise FrameError(f"type={type(reply).__name__.upper()} answers a REGISTER")
        if reply.status is not Status.OK:
            raise RegistrationRefused(reply.message)
        init = Init(comm, len(group.ranks), group.ranks.index(self.rank), os.getpid(), 0, name)
        self._io("INIT", lambda: self._sock.sendall(encode(init)))
        self._comms[group] = comm
        return comm

    def enter(self, job_id: str, rank: int, phase: PhaseKey, iteration: int = 0,
              timeout_s: float | None = 30.0, nbytes: int = 0,
              compute_gap_s: float = 0.0) -> Admission:
        """Enter ``phase`` (its group, kind; seq and step 0, iteration 0 at the agent) and block
        until admitted. ``timeout_s`` None: 30 s. Raises ``PhaseError`` subclasses, also when
        the agent answers that the group is not gated (this client registered it: the agent
        lost the registration), never a silent go-ahead."""
        with self._lock:
            comm = self._comm(phase.group)
            self._seq += 1
            seq = self._seq
            frame = Enter(comm, phase.collective, seq, max(0, nbytes),
                          int((30.0 if timeout_s is None else timeout_s) * 1000))
            self._io("ENTER", lambda: self._sock.sendall(encode(frame)))
            reply = self._io("ADMIT", self._read_frame)
            if not isinstance(reply, Admit) or reply.seq != seq:
                raise FrameError(f"seq={seq}: the agent answered {reply!r}")
            if reply.status is not Status.OK:  # UNGATED too: we registered it, never go ahead
                code = ErrorCode[reply.status.name] if reply.status.name in ErrorCode.__members__ \
                    else ErrorCode.INVALID_PHASE
                raise error_for(code, reply.message)
            self._held[(comm, phase.collective.value)] = seq
            return Admission(reply.noop, max(1, reply.steps), 0.0)

    def release_phase(self, job_id: str, rank: int, phase: PhaseKey, iteration: int = 0
                      ) -> None:
        """Release ``phase``: one frame written, no answer (ordered before the next enter)."""
        with self._lock:
            comm = self._comms.get(phase.group)
            seq = None if comm is None else self._held.pop((comm, phase.collective.value), None)
            if comm is None or seq is None:
                return  # never entered here
            frame = Release(comm, phase.collective, seq)
            self._io("RELEASE", lambda: self._sock.sendall(encode(frame)))

    def close(self) -> None:
        """FINI every communicator (the agent releases what is held) and close."""
        with self._lock:
            try:
                for comm in self._comms.values():
                    self._sock.sendall(encode(Fini(comm)))
            except OSError:
                pass
            finally:
                self._sock.close()
