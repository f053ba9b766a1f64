"""The frames of the host agent's NCCL socket (``agents/nccl/lightrail_nccl_wire.h`` is the
definition; this is its Python codec, used by the agent side and the framework side).

Every frame is a 12-byte little-endian header (magic ``LRNC``, version 1, type, payload length)
and its payload. ``encode`` turns a frame into bytes; ``decode`` turns a header's type and a
payload into a frame and raises ``FrameError`` naming the field and value of anything it cannot
accept (a wrong magic, version or type, a length beyond ``MAX_PAYLOAD``, a payload of the wrong
size, non-zero padding, an unknown collective or status, an invalid name).
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

from lightrail.controller.domain.errors import ErrorCode
from lightrail.controller.domain.model import Collective

MAGIC = 0x434E524C
"""The bytes ``LRNC`` as a little-endian u32."""
VERSION = 1
HEADER_BYTES = 12
MAX_PAYLOAD = 65536
MAX_NAME = 1024
"""The longest communicator name, job id or message, in UTF-8 bytes."""

_HEADER = struct.Struct("<IHHI")
_INIT = struct.Struct("<IIIIQH")
_ENTER = struct.Struct("<IB3sQQI")
_RELEASE = struct.Struct("<IB3sQ")
_FINI = struct.Struct("<I")
_REGISTER = struct.Struct("<QIIBBHH")
_ADMIT = struct.Struct("<QIIBBH")
_REGISTERED = struct.Struct("<IH")
_PAD3 = b"\0\0\0"


class FrameType(enum.IntEnum):
    """Frame types (``LR_INIT`` ... in the C header)."""

    INIT = 1
    ENTER = 2
    RELEASE = 3
    FINI = 4
    REGISTER = 5
    ADMIT = 16
    REGISTERED = 17


COLLECTIVE_CODES: dict[Collective, int] = {
    Collective.ALL_REDUCE: 1,
    Collective.REDUCE_SCATTER: 2,
    Collective.ALL_GATHER: 3,
    Collective.ALL_TO_ALL: 4,
    Collective.SEND_RECV: 5,
    Collective.BROADCAST: 6,
}
"""Wire code of each collective (``LR_ALL_REDUCE`` ...)."""
_COLLECTIVES = {code: c for c, code in COLLECTIVE_CODES.items()}


class Status(enum.IntEnum):
    """The answer to an ENTER or a REGISTER (``LR_OK``, ``LR_STATUS_*``)."""

    OK = 0
    DEADLINE_EXCEEDED = 1
    UNKNOWN_JOB = 2
    INVALID_RANK = 3
    INVALID_PHASE = 4
    RANK_BUSY = 5
    DEVICE_FAILURE = 6
    PLACEMENT_CHANGED = 7
    NOT_LEADER = 8
    CANCELLED = 9
    UNGATED = 10
    """The communicator is not under Lightrail (registered as never gated, or unregistered)."""
    BAD_REQUEST = 11
    SWITCH_MAINTENANCE = 12
    """The phase needs a switch in maintenance (``ErrorCode.SWITCH_MAINTENANCE``)."""


STATUS_OF_ERROR: dict[ErrorCode, Status] = {code: Status[code.name] for code in ErrorCode}
"""The wire status of each refusal of the controller."""


class FrameError(ValueError):
    """A frame that cannot be accepted; the message names the field and the value."""


@dataclass(frozen=True, slots=True)
class Header:
    """A frame header: ``type`` and ``length`` (payload bytes)."""

    type: FrameType
    length: int


@dataclass(frozen=True, slots=True)
class Init:
    """A communicator of the plugin's process: ``comm_id`` (the plugin's number of it),
    NCCL's ``nranks`` and ``rank`` in it, the process ``pid``, NCCL's ``comm_hash`` and the
    user's ``comm_name`` ("" when NCCL has none)."""

    comm_id: int
    nranks: int
    rank: int
    pid: int
    comm_hash: int
    comm_name: str


@dataclass(frozen=True, slots=True)
class Enter:
    """The first call of phase ``seq``: ``collective`` on ``comm_id``, moving ``nbytes``
    (a hint; 0: unknown), admission timeout ``timeout_ms``."""

    comm_id: int
    collective: Collective
    seq: int
    nbytes: int
    timeout_ms: int


@dataclass(frozen=True, slots=True)
class Release:
    """Phase ``seq`` (``collective`` on ``comm_id``) is over."""

    comm_id: int
    collective: Collective
    seq: int


@dataclass(frozen=True, slots=True)
class Fini:
    """Communicator ``comm_id`` was finalized."""

    comm_id: int


@dataclass(frozen=True, slots=True)
class Register:
    """The framework side: the communicator ``comm_name`` (or, when it is "", the one with NCCL
    hash ``comm_hash``) belongs to ``job_id``; its rank i is global rank ``ranks[i]``; ``rank``
    is the caller's global rank; ``gated`` False: it stays inside one host, never gated."""

    comm_name: str
    comm_hash: int
    job_id: str
    ranks: tuple[int, ...]
    rank: int
    gated: bool = True


@dataclass(frozen=True, slots=True)
class Admit:
    """The answer to ENTER ``seq``: ``status`` OK (admitted; ``noop``, ``steps``) or why not,
    with a ``message``."""

    seq: int
    status: Status
    steps: int = 1
    noop: bool = False
    message: str = ""


@dataclass(frozen=True, slots=True)
class Registered:
    """The answer to REGISTER: ``status`` OK or BAD_REQUEST with a ``message``."""

    status: Status
    message: str = ""


Frame = Init | Enter | Release | Fini | Register | Admit | Registered


def _text(value: str, name: str) -> bytes:
    raw = value.encode("utf-8")
    if len(raw) > MAX_NAME:
        raise FrameError(f"{name} length={len(raw)} bytes; at most {MAX_NAME}")
    return raw


def _u32(value: int, name: str) -> int:
    if not 0 <= value < 1 << 32:
        raise FrameError(f"{name}={value} is not a u32")
    return value


def _u64(value: int, name: str) -> int:
    if not 0 <= value < 1 << 64:
        raise FrameError(f"{name}={value} is not a u64")
    return value


def _payload(frame: Frame) -> tuple[FrameType, bytes]:
    if isinstance(frame, Init):
        name = _text(frame.comm_name, "comm_name")
        return FrameType.INIT, _INIT.pack(
            _u32(frame.comm_id, "comm_id"), _u32(frame.nranks, "nranks"),
            _u32(frame.rank, "rank"), _u32(frame.pid, "pid"),
            _u64(frame.comm_hash, "comm_hash"), len(name)) + name
    if isinstance(frame, Enter):
        return FrameType.ENTER, _ENTER.pack(
            _u32(frame.comm_id, "comm_id"), COLLECTIVE_CODES[frame.collective], _PAD3,
            _u64(frame.seq, "seq"), _u64(frame.nbytes, "nbytes"),
            _u32(frame.timeout_ms, "timeout_ms"))
    if isinstance(frame, Release):
        return FrameType.RELEASE, _RELEASE.pack(
            _u32(frame.comm_id, "comm_id"), COLLECTIVE_CODES[frame.collective], _PAD3,
            _u64(frame.seq, "seq"))
    if isinstance(frame, Fini):
        return FrameType.FINI, _FINI.pack(_u32(frame.comm_id, "comm_id"))
    if isinstance(frame, Register):
        job = _text(frame.job_id, "job_id")
        name = _text(frame.comm_name, "comm_name")
        ranks = [_u32(r, "ranks[]") for r in frame.ranks]
        if len(ranks) > (MAX_PAYLOAD - _REGISTER.size - 2 * MAX_NAME) // 4:
            raise FrameError(f"ranks count={len(ranks)}; too many for one frame")
        return FrameType.REGISTER, _REGISTER.pack(
            _u64(frame.comm_hash, "comm_hash"), _u32(frame.rank, "rank"), len(ranks),
            int(frame.gated), 0, len(job), len(name)) + struct.pack(
            f"<{len(ranks)}I", *ranks) + job + name
    if isinstance(frame, Admit):
        msg = _text(frame.message, "message")
        return FrameType.ADMIT, _ADMIT.pack(
            _u64(frame.seq, "seq"), frame.status, _u32(frame.steps, "steps"), int(frame.noop), 0,
            len(msg)) + msg
    msg = _text(frame.message, "message")
    return FrameType.REGISTERED, _REGISTERED.pack(frame.status, len(msg)) + msg


def encode(frame: Frame) -> bytes:
    """The bytes of ``frame``, header included. Raises ``FrameError`` for a field that does not
    fit its wire type (a negative or too large integer, a name over ``MAX_NAME`` bytes)."""
    ftype, body = _payload(frame)
    return _HEADER.pack(MAGIC, VERSION, ftype, len(body)) + body


def decode_header(data: bytes) -> Header:
    """The header in the first ``HEADER_BYTES`` of ``data``. Raises ``FrameError`` for a wrong
    magic, version or type, or a length over ``MAX_PAYLOAD``."""
    if len(data) < HEADER_BYTES:
        raise FrameError(f"header length={len(data)} bytes; {HEADER_BYTES} expected")
    magic, version, ftype, length = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise FrameError(f"magic=0x{magic:08x}; 0x{MAGIC:08x} (LRNC) expected")
    if version != VERSION:
        raise FrameError(f"version={version}; {VERSION} expected")
    if ftype not in FrameType._value2member_map_:
        raise FrameError(f"type={ftype} is not a frame type")
    if length > MAX_PAYLOAD:
        raise FrameError(f"length={length} exceeds {MAX_PAYLOAD}")
    return Header(FrameType(ftype), length)


def _size(body: bytes, want: int, ftype: FrameType) -> None:
    if len(body) != want:
        raise FrameError(f"length={len(body)} for a {ftype.name} frame; {want} expected")


def _at_least(body: bytes, want: int, ftype: FrameType) -> None:
    if len(body) < want:
        raise FrameError(f"length={len(body)} for a {ftype.name} frame; at least {want} expected")


def _pad(pad: bytes | int) -> None:
    if pad not in (_PAD3, 0):
        raise FrameError(f"pad={pad!r} is not zero")


def _collective(code: int) -> Collective:
    c = _COLLECTIVES.get(code)
    if c is None:
        raise FrameError(f"kind={code} is not a collective (1..{len(_COLLECTIVES)})")
    return c


def _status(code: int) -> Status:
    if code not in Status._value2member_map_:
        raise FrameError(f"status={code} is not a status")
    return Status(code)


def _name(raw: bytes, field: str) -> str:
    if len(raw) > MAX_NAME:
        raise FrameError(f"{field} length={len(raw)} bytes; at most {MAX_NAME}")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FrameError(f"{field}={raw!r} is not UTF-8") from exc
    if "\0" in text:
        raise FrameError(f"{field}={text!r} contains a NUL")
    return text


def decode(ftype: FrameType, body: bytes) -> Frame:
    """The frame of type ``ftype`` whose payload is ``body``. Raises ``FrameError``."""
    if ftype is FrameType.INIT:
        _at_least(body, _INIT.size, ftype)
        comm_id, nranks, rank, pid, comm_hash, name_len = _INIT.unpack_from(body)
        _size(body, _INIT.size + name_len, ftype)
        if nranks == 0 or rank >= nranks:
            raise FrameError(f"rank={rank} is not a rank of a communicator of nranks={nranks}")
        return Init(comm_id, nranks, rank, pid, comm_hash,
                    _name(body[_INIT.size:], "comm_name"))
    if ftype is FrameType.ENTER:
        _size(body, _ENTER.size, ftype)
        comm_id, kind, pad, seq, nbytes, timeout_ms = _ENTER.unpack(body)
        _pad(pad)
        if timeout_ms == 0:
            raise FrameError("timeout_ms=0; an admission timeout is required")
        return Enter(comm_id, _collective(kind), seq, nbytes, timeout_ms)
    if ftype is FrameType.RELEASE:
        _size(body, _RELEASE.size, ftype)
        comm_id, kind, pad, seq = _RELEASE.unpack(body)
        _pad(pad)
        return Release(comm_id, _collective(kind), seq)
    if ftype is FrameType.FINI:
        _size(body, _FINI.size, ftype)
        return Fini(*_FINI.unpack(body))
    if ftype is FrameType.REGISTER:
        return _decode_register(body)
    if ftype is FrameType.ADMIT:
        _at_least(body, _ADMIT.size, ftype)
        seq, status, steps, noop, pad, msg_len = _ADMIT.unpack_from(body)
        _size(body, _ADMIT.size + msg_len, ftype)
        _pad(pad)
        if noop > 1:
            raise FrameError(f"noop={noop} is not 0 or 1")
        return Admit(seq, _status(status), steps, bool(noop),
                     _name(body[_ADMIT.size:], "message"))
    _at_least(body, _REGISTERED.size, ftype)
    status, msg_len = _REGISTERED.unpack_from(body)
    _size(body, _REGISTERED.size + msg_len, ftype)
    return Registered(_status(status), _name(body[_REGISTERED.size:], "message"))


def _decode_register(body: bytes) -> Register:
    ftype = FrameType.REGISTER
    _at_least(body, _REGISTER.size, ftype)
    comm_hash, rank, nranks, gated, pad, job_len, name_len = _REGISTER.unpack_from(body)
    _pad(pad)
    _size(body, _REGISTER.size + 4 * nranks + job_len + name_len, ftype)
    if gated > 1:
        raise FrameError(f"gated={gated} is not 0 or 1")
    ranks = struct.unpack_from(f"<{nranks}I", body, _REGISTER.size)
    at = _REGISTER.size + 4 * nranks
    job_id = _name(body[at:at + job_len], "job_id")
    comm_name = _name(body[at + job_len:], "comm_name")
    return check_register(
        Register(comm_name, comm_hash, job_id, tuple(ranks), rank, bool(gated)))


def check_register(reg: Register) -> Register:
    """``reg`` when it names a communicator, a job and a rank set that holds ``rank``.
    Raises ``FrameError`` naming the field and value."""
    if not reg.job_id:
        raise FrameError("job_id is empty")
    if not reg.comm_name and reg.comm_hash == 0:
        raise FrameError("comm_name is empty and comm_hash=0: nothing names the communicator")
    if not reg.ranks:
        raise FrameError("ranks is empty")
    if len(set(reg.ranks)) != len(reg.ranks):
        raise FrameError(f"ranks={list(reg.ranks)} has duplicates")
    if reg.rank not in reg.ranks:
        raise FrameError(f"rank={reg.rank} is not one of ranks={list(reg.ranks)}")
    return reg
