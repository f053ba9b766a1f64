"""One TL1 session over one TCP connection: pipelined commands matched to their replies by
ctag, a background reader, autonomous messages handed on (used by
``lightrail.drivers.tl1.driver.Tl1Driver``; the wire syntax is in ``lightrail.drivers.tl1.wire``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

import structlog

from lightrail.drivers.base import (
    CommandGate,
    DeviceTimeout,
    DeviceUnreachable,
    DriverError,
    ProtocolError,
    check_gate,
)
from lightrail.drivers.tl1.wire import (
    FrameSplitter,
    Tl1Acknowledgment,
    Tl1Autonomous,
    Tl1Response,
    Tl1SyntaxError,
    decode_frame,
    format_command,
)

_log = structlog.get_logger(__name__)

_READ_CHUNK = 65536
_MAX_CTAG = 999_999


class StreamWriterLike(Protocol):
    """The part of ``asyncio.StreamWriter`` a session uses."""

    def write(self, data: bytes) -> None: ...

    async def drain(self) -> None: ...

    def close(self) -> None: ...

    def is_closing(self) -> bool: ...

    async def wait_closed(self) -> None: ...


class ConnectionLost(DeviceUnreachable):
    """The connection dropped while a command waited for its reply. ``mid_reply`` is True
    when part of a frame had arrived (the command may or may not have taken effect)."""

    def __init__(self, switch_id: str, message: str, *, mid_reply: bool) -> None:
        super().__init__(switch_id, message)
        self.mid_reply = mid_reply


@dataclass(slots=True)
class _Pending:
    code: str
    future: asyncio.Future[Tl1Response]
    lines: list[str] = field(default_factory=list)
    comments: list[str] = field(default_factory=list)


class Tl1Session:
    """One TL1 connection: sends commands with fresh ctags, reads frames in a background task,
    resolves each caller's future by ctag, hands autonomous messages to ``on_autonomous`` and
    reports the loss of the connection once to ``on_lost``.

    ``command`` returns the response (COMPLD or DENY; the caller maps DENY). It raises
    ``DeviceTimeout`` after ``timeout_s`` seconds without the final frame of the reply,
    ``DeviceUnreachable`` (``ConnectionLost``) when the connection is or goes down, and
    ``ProtocolError`` when the device sent something unparseable (the session then closes).
    """

    def __init__(
        self,
        switch_id: str,
        reader: asyncio.StreamReader,
        writer: StreamWriterLike,
        *,
        timeout_s: float,
        tid: str = "",
        on_autonomous: Callable[[Tl1Autonomous], None] | None = None,
        on_lost: Callable[[DriverError], None] | None = None,
        command_gate: CommandGate | None = None,
    ) -> None:
        self._switch_id = switch_id
        self._gate = command_gate
        self._reader = reader
        self._writer = writer
        self._timeout_s = timeout_s
        self._tid = tid
        self._on_autonomous = on_autonomous
        self._on_lost = on_lost
        self._splitter = FrameSplitter()
        self._pending: dict[str, _Pending] = {}
        self._ctag = 0
        self._lost: DriverError | None = None
        self._task: asyncio.Task[None] | None = None
        self._log = _log.bind(switch=switch_id)

    @property
    def alive(self) -> bool:
        """True until the connection is lost or closed."""
        return self._lost is None

    @property
    def in_flight(self) -> int:
        """Commands sent and not yet answered."""
        return len(self._pending)

    def start(self) -> None:
        """Start the reader task (call once, inside the running loop)."""
        if self._task is None:
            self._task = asyncio.create_task(
                self._read_loop(), name=f"tl1-reader-{self._switch_id}"
            )

    async def command(
        self,
        code: str,
        *,
        aid: str = "",
        params: Sequence[str] = (),
        timeout_s: float | None = None,
        secret: bool = False,
    ) -> Tl1Response:
        """Send one command and wait for its complete reply (``>`` parts are merged).
        ``secret`` keeps the aid out of the debug log (login). Raises ``NotLeader``
        (nothing sent) when the command gate refuses."""
        check_gate(self._gate, self._switch_id)
        if self._lost is not None:
            raise ConnectionLost(
                self._switch_id, f"connection lost earlier: {self._lost}", mid_reply=False
            )
        ctag = self._next_ctag()
        text = format_command(code, ctag, tid=self._tid, aid=aid, params=params)
        future: asyncio.Future[Tl1Response] = asyncio.get_running_loop().create_future()
        self._pending[ctag] = _Pending(code, future)
        self._log.debug("tl1 send", code=code, ctag=ctag, aid=None if secret else aid)
        deadline_s = self._timeout_s if timeout_s is None else timeout_s
        try:
            try:
                self._writer.write(text.encode("ascii"))
                await self._writer.drain()
            except (ConnectionError, OSError) as e:
                error = ConnectionLost(self._switch_id, f"send failed: {e}", mid_reply=False)
                self._lose(lambda: error)
                raise error from None
            try:
                async with asyncio.timeout(deadline_s):
                    return await future
            except TimeoutError:
                raise DeviceTimeout(
                    self._switch_id, f"{code} (ctag {ctag}): no reply within {deadline_s:g} s"
                ) from None
        finally:
            self._pending.pop(ctag, None)

    async def close(self) -> None:
        """Close the connection; pending commands fail with ``DeviceUnreachable``."""
        self._lose(lambda: ConnectionLost(self._switch_id, "session closed", mid_reply=False))
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        with contextlib.suppress(OSError, TimeoutError):
            async with asyncio.timeout(1.0):
                await self._writer.wait_closed()

    def _next_ctag(self) -> str:
        while True:
            self._ctag = self._ctag % _MAX_CTAG + 1
            ctag = str(self._ctag)
            if ctag not in self._pending:
                return ctag

    async def _read_loop(self) -> None:
        make_error: Callable[[], DriverError] | None = None
        sid = self._switch_id
        try:
            while True:
                try:
                    data = await self._reader.read(_READ_CHUNK)
                except (ConnectionError, OSError) as e:
                    make_error = functools.partial(
                        ConnectionLost, sid, f"connection failed: {e}",
                        mid_reply=self._splitter.pending,
                    )
                    return
                if not data:
                    mid = self._splitter.pending
                    reason = "connection closed by the device" + (" mid-reply" if mid else "")
                    make_error = functools.partial(ConnectionLost, sid, reason, mid_reply=mid)
                    return
                try:
                    for raw in self._splitter.feed(data):
                        frame = decode_frame(raw)
                        if frame is not None:
                            self._dispatch(frame)
                except Tl1SyntaxError as e:
                    make_error = functools.partial(
                        ProtocolError, sid, f"unparseable reply, connection dropped: {e}"
                    )
                    self._log.warning("tl1 garbage from device", error=str(e))
                    return
        finally:
            self._lose(
                make_error
                or (lambda: ConnectionLost(sid, "session reader stopped", mid_reply=False))
            )

    def _dispatch(self, frame: Tl1Response | Tl1Autonomous | Tl1Acknowledgment) -> None:
        if isinstance(frame, Tl1Response):
            pending = self._pending.get(frame.ctag)
            if pending is None or pending.future.done():
                self._log.debug(
                    "tl1 reply for no waiting command (late or stray)",
                    ctag=frame.ctag, completion=frame.completion.value,
                )
                return
            pending.lines.extend(frame.lines)
            pending.comments.extend(frame.comments)
            if frame.final:
                pending.future.set_result(
                    replace(frame, lines=tuple(pending.lines), comments=tuple(pending.comments))
                )
        elif isinstance(frame, Tl1Autonomous):
            if self._on_autonomous is not None:
                self._on_autonomous(frame)
        else:
            self._log.debug("tl1 acknowledgment", code=frame.code, ctag=frame.ctag)

    def _lose(self, make_error: Callable[[], DriverError]) -> None:
        if self._lost is not None:
            return
        self._lost = make_error()
        for pending in list(self._pending.values()):
            if not pending.future.done():
                pending.future.set_exception(make_error())
        with contextlib.suppress(OSError, RuntimeError):
            self._writer.close()
        if self._on_lost is not None:
            self._on_lost(self._lost)
