"""The host agent's NCCL socket: phase calls of the NCCL profiler plugin (``agents/nccl/``) and
the framework side's registrations of communicators, in the frames of
``lightrail.agents.nccl.wire``, turned into ``HostAgent.enter`` / ``release``.

NCCL tells its plugin only a communicator's name, hash, size and rank; the framework side
(``lightrail.agents.nccl.registration.register_comm``) registers the job id and the global
ranks of the communicator under its name (or its hash). The first ENTER of a communicator
resolves it (waiting up to ``registration_wait_s`` for the registration to arrive); its phases
are ``PhaseKey(ProcessGroup.of(global ranks), collective)`` (seq 0, step 0) at iteration 0 for
global rank ``ranks[nccl rank]``: every run of one (group, kind) is an instance of the same
phase, as in the torch gate. A communicator no registration names, or one registered as never
gated, is answered UNGATED (the plugin stops gating it).

A connection that closes releases the phase it holds and withdraws an enter still waiting (the
process went away). A frame that cannot be decoded is logged with the field and value and the
connection is closed; the agent carries on.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from lightrail.agents.errors import PhaseError
from lightrail.agents.host.agent import HostAgent
from lightrail.agents.nccl.wire import (
    HEADER_BYTES,
    MAX_NAME,
    STATUS_OF_ERROR,
    Admit,
    Enter,
    Fini,
    Frame,
    FrameError,
    Init,
    Register,
    Registered,
    Release,
    Status,
    decode,
    decode_header,
    encode,
)
from lightrail.controller.domain.model import PhaseKey, ProcessGroup

log = structlog.get_logger(__name__)

DEFAULT_NCCL_SOCKET = "/run/lightrail/nccl.sock"


@dataclass(frozen=True, slots=True)
class _Member:
    """A communicator of one connection resolved to its job: ``rank`` is the global rank."""

    job_id: str
    group: ProcessGroup
    rank: int


@dataclass(frozen=True, slots=True)
class _Held:
    comm_id: int
    seq: int
    job_id: str
    rank: int
    phase: PhaseKey


@dataclass(slots=True)
class _Connection:
    """One plugin process (or one registration) on the socket."""

    peer: str
    comms: dict[int, Init] = field(default_factory=dict)
    members: dict[int, _Member | None] = field(default_factory=dict)
    """Resolved communicators; None: not gated."""
    held: _Held | None = None
    entering: asyncio.Task[None] | None = None


class _ProtocolError(Exception):
    """A decodable frame that the connection's state does not allow."""


def _prepare_socket(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    _remove_socket(path)


def _remove_socket(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


def _clip(text: str) -> str:
    raw = text.encode("utf-8")[:MAX_NAME]
    return raw.decode("utf-8", errors="ignore")


class NcclEndpoint:
    """Serves the NCCL socket for ``agent``. ``registration_wait_s``: how long the first ENTER
    of a communicator waits for its registration before it is answered UNGATED."""

    def __init__(self, agent: HostAgent, *, registration_wait_s: float = 10.0) -> None:
        self._agent = agent
        self._wait_s = registration_wait_s
        self._by_name: dict[str, Register] = {}
        self._by_hash: dict[int, Register] = {}
        self._registered = asyncio.Condition()
        self._open: dict[asyncio.StreamWriter, asyncio.Task[None]] = {}
        """The connections being served, closed on shutdown."""
        self.bad_frames = 0
        """Connections closed for a frame that could not be accepted."""

    # --- registrations ----------------------------------------------------------------------

    def register(self, reg: Register) -> None:
        """Record ``reg`` under its name (and its hash when given); a later registration of the
        same name or hash replaces it (a restarted job)."""
        if reg.comm_name:
            old = self._by_name.get(reg.comm_name)
            if old is not None and old != reg:
                log.info("nccl_comm_reregistered", comm=reg.comm_name, job=reg.job_id,
                         ranks=list(reg.ranks), was_job=old.job_id, was_ranks=list(old.ranks))
            self._by_name[reg.comm_name] = reg
        if reg.comm_hash:
            self._by_hash[reg.comm_hash] = reg

    def _lookup(self, init: Init) -> Register | None:
        if init.comm_name:
            return self._by_name.get(init.comm_name)
        return self._by_hash.get(init.comm_hash)

    async def _resolve(self, init: Init) -> _Member | str | None:
        """The communicator's job and global rank; None: not gated; a string: why the
        registration does not fit the communicator."""
        async with self._registered:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    self._registered.wait_for(lambda: self._lookup(init) is not None),
                    self._wait_s)
        reg = self._lookup(init)
        what = repr(init.comm_name) if init.comm_name else f"hash {init.comm_hash:016x}"
        if reg is None:
            log.warning("nccl_comm_unregistered", comm=init.comm_name,
                        comm_hash=f"{init.comm_hash:016x}", pid=init.pid, nranks=init.nranks,
                        wait_s=self._wait_s)
            return None
        if not reg.gated:
            return None
        if len(reg.ranks) != init.nranks:
            return (f"communicator {what} has nranks={init.nranks} but its registration "
                    f"(job {reg.job_id}) lists {len(reg.ranks)} global ranks {list(reg.ranks)}")
        return _Member(reg.job_id, ProcessGroup.of(reg.ranks), reg.ranks[init.rank])

    # --- serving ----------------------------------------------------------------------------

    async def serve(self, socket_path: str, stop: asyncio.Event,
                    ready: asyncio.Event | None = None) -> None:
        """Serve on the Unix socket ``socket_path`` (file mode 0660) until ``stop`` is set,
        setting ``ready`` once it listens; open connections are closed and the socket removed
        on the way out. Raises ``OSError`` when it cannot be bound."""
        path = Path(socket_path)
        _prepare_socket(path)
        server = await asyncio.start_unix_server(self._serve_connection, path=str(path))
        os.chmod(path, 0o660)
        log.info("nccl_endpoint_serving", host=self._agent.host, socket=str(path))
        if ready is not None:
            ready.set()
        try:
            await stop.wait()
        finally:
            server.close()
            for writer in list(self._open):
                writer.close()  # its reader ends: the handler releases what it holds
            if self._open:
                await asyncio.wait(set(self._open.values()), timeout=5.0)
            await server.wait_closed()
            _remove_socket(path)

    async def _serve_connection(self, reader: asyncio.StreamReader,
                                writer: asyncio.StreamWriter) -> None:
        conn = _Connection(peer=f"fd{writer.get_extra_info('socket').fileno()}")
        task = asyncio.current_task()
        assert task is not None
        self._open[writer] = task
        try:
            await self._read_frames(conn, reader, writer)
        except FrameError as exc:
            self.bad_frames += 1
            log.warning("nccl_bad_frame", peer=conn.peer, error=str(exc))
        except _ProtocolError as exc:
            self.bad_frames += 1
            log.warning("nccl_protocol_error", peer=conn.peer, error=str(exc))
        except (ConnectionError, asyncio.IncompleteReadError) as exc:
            if isinstance(exc, asyncio.IncompleteReadError) and exc.partial:
                self.bad_frames += 1
                log.warning("nccl_bad_frame", peer=conn.peer,
                            error=f"connection closed inside a frame ({len(exc.partial)} of "
                                  f"{exc.expected} bytes)")
        finally:
            del self._open[writer]
            await self._drop(conn)
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def _read_frames(self, conn: _Connection, reader: asyncio.StreamReader,
                           writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                head = await reader.readexactly(HEADER_BYTES)
            except asyncio.IncompleteReadError as exc:
                if not exc.partial:
                    return  # closed between frames
                raise
            header = decode_header(head)
            frame = decode(header.type, await reader.readexactly(header.length))
            await self._on_frame(conn, frame, writer)

    async def _on_frame(self, conn: _Connection, frame: Frame,
                        writer: asyncio.StreamWriter) -> None:
        if isinstance(frame, Init):
            if frame.comm_id in conn.comms:
                raise _ProtocolError(f"comm_id={frame.comm_id} was announced already")
            conn.comms[frame.comm_id] = frame
            conn.peer = f"pid{frame.pid}"
            log.debug("nccl_comm_init", peer=conn.peer, comm_id=frame.comm_id,
                      comm=frame.comm_name, nranks=frame.nranks, rank=frame.rank)
        elif isinstance(frame, Enter):
            if conn.entering is not None and not conn.entering.done():
                raise _ProtocolError(f"seq={frame.seq}: ENTER while another one waits")
            if frame.comm_id not in conn.comms:
                raise _ProtocolError(f"comm_id={frame.comm_id} was never announced (INIT)")
            if conn.held is not None:
                raise _ProtocolError(f"seq={frame.seq}: ENTER while phase seq={conn.held.seq} "
                                     "is held (the plugin releases first)")
            conn.entering = asyncio.create_task(self._enter(conn, frame, writer),
                                                name=f"nccl-enter-{conn.peer}-{frame.seq}")
        elif isinstance(frame, Release | Fini):
            self._on_end(conn, frame)
        elif isinstance(frame, Register):
            self.register(frame)
            async with self._registered:
                self._registered.notify_all()
            log.info("nccl_comm_registered", comm=frame.comm_name,
                     comm_hash=f"{frame.comm_hash:016x}", job=frame.job_id,
                     ranks=list(frame.ranks), gated=frame.gated)
            writer.write(encode(Registered(Status.OK)))
            await writer.drain()
        else:
            raise _ProtocolError(f"type={type(frame).__name__.upper()} is sent by the agent, "
                                 "never to it")

    def _on_end(self, conn: _Connection, frame: Release | Fini) -> None:
        """RELEASE of the held phase, or FINI of a communicator (releasing its held phase)."""
        held = conn.held
        if isinstance(frame, Release):
            if held is None or held.seq != frame.seq or held.comm_id != frame.comm_id:
                log.warning("nccl_release_unheld", peer=conn.peer, comm_id=frame.comm_id,
                            seq=frame.seq, held=None if held is None else held.seq)
                return
        else:
            if conn.comms.pop(frame.comm_id, None) is None:
                raise _ProtocolError(f"comm_id={frame.comm_id} was never announced (INIT)")
            conn.members.pop(frame.comm_id, None)
            if held is None or held.comm_id != frame.comm_id:
                return
        conn.held = None
        self._agent.release(held.job_id, held.rank, held.phase)

    async def _enter(self, conn: _Connection, frame: Enter,
                     writer: asyncio.StreamWriter) -> None:
        try:
            reply = await self._admit(conn, frame)
        except Exception as exc:  # a bug here must not leave the plugin waiting for ADMIT
            log.exception("nccl_enter_failed", peer=conn.peer, seq=frame.seq, error=str(exc))
            writer.close()  # the plugin sees the agent go away (its refusal policy applies)
            return
        writer.write(encode(reply))
        with contextlib.suppress(ConnectionError):
            await writer.drain()

    async def _admit(self, conn: _Connection, frame: Enter) -> Admit:
        if frame.comm_id not in conn.members:
            resolved = await self._resolve(conn.comms[frame.comm_id])
            if isinstance(resolved, str):
                return Admit(frame.seq, Status.BAD_REQUEST, message=_clip(resolved))
            conn.members[frame.comm_id] = resolved
        member = conn.members[frame.comm_id]
        if member is None:
            return Admit(frame.seq, Status.UNGATED,
                         message="no registration gates this communicator")
        phase = PhaseKey(member.group, frame.collective)
        try:
            adm = await self._agent.enter(member.job_id, member.rank, phase, 0,
                                          frame.timeout_ms / 1000.0, frame.nbytes)
        except PhaseError as exc:
            return Admit(frame.seq, STATUS_OF_ERROR[exc.code], message=_clip(exc.detail))
        conn.held = _Held(frame.comm_id, frame.seq, member.job_id, member.rank, phase)
        return Admit(frame.seq, Status.OK, adm.steps, adm.noop)

    async def _drop(self, conn: _Connection) -> None:
        """The connection is gone: withdraw its waiting enter, release its held phase."""
        task = conn.entering
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        held = conn.held
        if held is not None:
            conn.held = None
            log.info("nccl_connection_closed_holding", peer=conn.peer, job=held.job_id,
                     rank=held.rank, phase=str(held.phase))
            self._agent.release(held.job_id, held.rank, held.phase)


__all__ = ["DEFAULT_NCCL_SOCKET", "NcclEndpoint"]
