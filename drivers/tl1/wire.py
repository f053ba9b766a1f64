"""TL1 on the wire, Polatis dialect: framing, parsing and formatting. Pure, no I/O.

Used by ``lightrail.drivers.tl1`` (commands out, responses and autonomous messages in) and by
``lightrail.emulator.servers.tl1`` (commands in, responses out), so both ends share one definition
of the
syntax; each direction is still tested against literal text (tests/unit/test_tl1_parser.py).

Input command (Telcordia GR-831 layout; Polatis examples below)::

    <CODE>:[<tid>]:[<aid>]:<ctag>[:[<general block>][:<payload block>...]];

e.g. ``ACT-USER::admin:7::root;``, ``ENT-PATCH::1&2,50&49:8:;``, ``RTRV-PATCH:::9:;``,
``DLT-PATCH::ALL:10:;``, ``RTRV-PORT-POWER::1&&96:11:;``. A value holding TL1 punctuation is
sent as a quoted string (``"a;b"``, with ``\\"`` and ``\\\\`` escapes).

Port lists (aid): ports joined by ``&``; ``a&&b`` is the inclusive range a..b, so
``1&3&5&&8`` is 1, 3, 5, 6, 7, 8. ENT-PATCH takes two lists of equal length, ingress then egress,
paired in order: ``ENT-PATCH::1&&3,50&49&51`` makes 1->50, 2->49, 3->51.

Output response::

    <cr><lf><lf>
    ^^^<sid>^<yy-mm-dd>^<hh:mm:ss><cr><lf>
    M^^<ctag>^COMPLD|DENY<cr><lf>
    [^^^<errcde><cr><lf>]                    (DENY only: a four-letter error code)
    [^^^"<quoted line>"<cr><lf>]*
    [^^^/* <comment> */<cr><lf>]*
    ;                                        (``>`` instead: more of this response follows)

Acknowledgment: ``IP <ctag><cr><lf><`` (in progress). Autonomous message: the ``M^^<ctag>``
line is replaced by ``<almcde>^<atag>^REPT^ALM^<modifier>`` with almcde ``*C`` critical,
``**`` major, ``*^`` minor, ``A^`` non-alarm (cleared), and alarm lines
``"<aid>:<ntfcncde>,<condtype>,<srveff>,<ocrdat>,<ocrtm>:\\"<conddescr>\\""`` with ntfcncde
CR/MJ/MN/NA/CL, srveff SA/NSA, ocrdat MM-DD, ocrtm HH-MM-SS.

Parsing rules (``FrameSplitter``): a frame ends at the first ``;`` (or ``>``/``<``) outside
a quoted string and outside a ``/* */`` comment, whether or not a newline follows; everything
after it belongs to the next frame. Bytes are decoded as Latin-1, so any byte sequence splits
(no multi-byte character can be cut between reads) and garbage fails in ``decode_frame``.

Sources: Telcordia GR-831-CORE (message layout, as reproduced in vendor TL1 manuals, e.g.
the Symmetricom SSU-2000 and TimeSource 3100 TL1 references: COMPLD/DENY formats, ctag ``0``
for an invalid ctag, almcde and ntfcncde values, ``IP`` acknowledgments; ADTRAN MX2800
TL1 chapter: ``>`` continuation); Polatis command syntax from public Polatis TL1 client code:
``polatis_tl1.sh`` (ENT-PATCH/DLT-PATCH/RTRV-PATCH, ``&`` and ``&&`` lists, OPR/RLS/RTRV-
PORT-SHUTTER, TCP port 3082), a Polatis TL1 conformance test suite (``ENT-PATCH::1&2&3,4&5&6``
bulk pairs, ``DLT-PATCH::ALL``, ``DLT-PATCH:::ctag:`` = all, ``RTRV-PATCH::ALL``, DENY
``IDNV`` with ``/* Invalid OXC port: N */``, ``IIAC`` for empty aids, ``PICC`` for a bad login,
``RTRV-NETYPE`` containing ``OCS``), and client code parsing ``"<in>,<out>"`` patch lines,
``"<port>:<dBm>"`` power lines (RTRV-PORT-POWER) and ``SYSTEM:SIZE=<n>x<m>`` (RTRV-EQPT).
Assumptions (no Polatis manual at hand): the ``REPT ALM EQPT`` modifier and alarm line layout
for port alarms (GR-833 layout used), the ``RTRV-NETYPE`` field order
(vendor,model,OCS,firmware), and that an empty aid means "all ports" for RTRV-PORT-POWER.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

MAX_FRAME_CHARS = 1 << 20
"""A frame (or command) longer than this without a terminator is garbage (characters)."""

CTAG_RE = re.compile(r"^[A-Za-z0-9]{1,6}$")
"""A valid correlation tag: 1..6 letters or digits (GR-831)."""

_CODE_RE = re.compile(r"^[A-Za-z][A-Za-z0-9]*(?:-[A-Za-z0-9]+)*$")
_SAFE_VALUE_RE = re.compile(r"^[A-Za-z0-9_.@#$%+*!?=/-]*$")
_HEADER_RE = re.compile(
    r'^(?P<sid>"(?:[^"\\]|\\.)*"|\S+)\s+(?P<date>\d{2}(?:\d{2})?-\d{2}-\d{2})\s+'
    r"(?P<time>\d{2}:\d{2}:\d{2})$"
)
_RESPONSE_RE = re.compile(r"^M\s+(?P<ctag>\S+)\s+(?P<code>COMPLD|DENY|PRTL|DELAY|RTRV)$")
_AUTONOMOUS_RE = re.compile(
    r"^(?P<almcde>\*C|\*\*|\*|A)\s+(?P<atag>\d+(?:\.\d+)?)\s+(?P<message>[A-Z][A-Z0-9 -]*)$"
)
_ACK_RE = re.compile(r"^(?P<code>IP|PF|OK|NA|NG|RL)\s+(?P<ctag>\S+)$")
_ECHO_RE = re.compile(r"^[A-Za-z][A-Za-z0-9]*(?:-[A-Za-z0-9]+)*:")
_ERROR_CODE_RE = re.compile(r"^[A-Z]{4}$")
_ALARM_LINE_RE = re.compile(
    r"^(?P<aid>[^:]*):(?P<ntfcncde>[A-Z]{2}),(?P<condtype>[^,]*),(?P<srveff>[^,]*),"
    r"(?P<ocrdat>[^,]*),(?P<ocrtm>[^,:]*)(?:,[^:]*)?(?::(?P<desc>.*))?$"
)


class Tl1SyntaxError(ValueError):
    """Text that is not valid TL1 (a frame, a command or a port list); the message says what."""


# --- framing -------------------------------------------------------------------------------------


class Terminator(enum.Enum):
    """What ended a frame."""

    END = ";"
    """The end of a response, autonomous message or command."""
    CONTINUE = ">"
    """More of the same response follows in another frame."""
    ACK = "<"
    """The end of an acknowledgment (or a bare prompt)."""


@dataclass(frozen=True, slots=True)
class RawFrame:
    """The text of one frame, without its terminator."""

    text: str
    terminator: Terminator


class FrameSplitter:
    """Splits a byte stream into frames at top-level terminators.

    ``terminators`` are the characters that end a frame outside quotes and comments (devices
    send ``;``, ``>`` and ``<``; commands end at ``;`` only). ``comments`` enables ``/* */``.
    ``feed`` may be called with any split of the stream, down to single bytes.
    """

    def __init__(
        self,
        *,
        terminators: str = ";><",
        comments: bool = True,
        max_chars: int = MAX_FRAME_CHARS,
    ) -> None:
        self._terminators = terminators
        self._comments = comments
        self._max_chars = max_chars
        self._buf: list[str] = []
        self._in_quote = False
        self._escape = False
        self._in_comment = False
        self._prev = ""

    @property
    def pending(self) -> bool:
        """True when part of a frame (other than whitespace) is buffered."""
        return any(not ch.isspace() for ch in self._buf)

    def feed(self, data: bytes | str) -> list[RawFrame]:  # noqa: PLR0912  per-character lexer state machine (comment, quote, terminator, plain): one table reads best whole
        """Add ``data`` (bytes are decoded as Latin-1) and return the frames it completes, in
        order. Raises ``Tl1SyntaxError`` when a frame exceeds ``max_chars``."""
        text = data.decode("latin-1") if isinstance(data, bytes) else data
        out: list[RawFrame] = []
        buf = self._buf
        for ch in text:
            if self._in_comment:
                buf.append(ch)
                if self._prev == "*" and ch == "/":
                    self._in_comment = False
                    self._prev = ""
                else:
                    self._prev = ch
            elif self._in_quote:
                buf.append(ch)
                if self._escape:
                    self._escape = False
                elif ch == "\\":
                    self._escape = True
                elif ch == '"':
                    self._in_quote = False
            elif ch in self._terminators:
                out.append(RawFrame("".join(buf), Terminator(ch)))
                buf.clear()
                self._prev = ""
                continue
            else:
                buf.append(ch)
                if ch == '"':
                    self._in_quote = True
                    self._prev = ""
                elif self._comments and self._prev == "/" and ch == "*":
                    self._in_comment = True
                    self._prev = ""
                else:
                    self._prev = ch
            if len(buf) > self._max_chars:
                raise Tl1SyntaxError(f"no terminator within {self._max_chars} characters")
        return out


# --- decoded frames ------------------------------------------------------------------------------


class CompletionCode(enum.Enum):
    """The completion code of a response (GR-831)."""

    COMPLD = "COMPLD"
    DENY = "DENY"
    PRTL = "PRTL"
    DELAY = "DELAY"
    RTRV = "RTRV"


class AlarmCode(enum.Enum):
    """The alarm code (almcde) of an autonomous message; values as on the wire."""

    CRITICAL = "*C"
    MAJOR = "**"
    MINOR = "*"
    NON_ALARM = "A"


@dataclass(frozen=True, slots=True)
class Tl1Response:
    """A response to a command. ``lines`` are the quoted lines (unescaped), ``error_code`` the
    four-letter code of a DENY, ``comments`` the ``/* */`` texts (stripped). ``final`` is False
    for a ``>``-terminated part that more parts of the same ctag follow."""

    sid: str
    ctag: str
    completion: CompletionCode
    error_code: str | None = None
    lines: tuple[str, ...] = ()
    comments: tuple[str, ...] = ()
    final: bool = True

    @property
    def denied(self) -> bool:
        """True for a DENY."""
        return self.completion is CompletionCode.DENY


@dataclass(frozen=True, slots=True)
class Tl1Autonomous:
    """An autonomous message, e.g. ``message`` = ``"REPT ALM EQPT"``; ``lines`` unescaped."""

    sid: str
    alarm_code: AlarmCode
    atag: str
    message: str
    lines: tuple[str, ...] = ()
    comments: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Tl1Acknowledgment:
    """An acknowledgment such as ``IP <ctag>`` (command in progress)."""

    code: str
    ctag: str


Tl1Frame = Tl1Response | Tl1Autonomous | Tl1Acknowledgment
"""Anything a device sends."""


def decode_frame(raw: RawFrame) -> Tl1Frame | None:
    """Decode one frame. Returns None for frames to ignore: blank ones, a bare ``<`` prompt
    and an echo of a command. Raises ``Tl1SyntaxError`` for anything else that is not a
    response, an autonomous message or an acknowledgment."""
    text = raw.text.strip()
    if not text:
        return None
    head, _, rest = text.partition("\n")
    head = head.strip()
    if raw.terminator is Terminator.ACK:
        m = _ACK_RE.match(head)
        if m is None or rest.strip():
            raise Tl1SyntaxError(f"not a TL1 acknowledgment: {_preview(text)}")
        return Tl1Acknowledgment(m["code"], m["ctag"])
    header = _HEADER_RE.match(head)
    if header is None:
        if raw.terminator is Terminator.END and _ECHO_RE.match(head) and "\n" not in text:
            return None  # a command echoed back by a terminal-style port
        raise Tl1SyntaxError(f"no TL1 header line: {_preview(text)}")
    sid = _unquote(header["sid"])
    ident, _, body = rest.partition("\n")
    ident = ident.strip()
    quoted, comments, bare = _scan_body(body)
    response = _RESPONSE_RE.match(ident)
    if response is not None:
        completion = CompletionCode(response["code"])
        error_code: str | None = None
        if completion is CompletionCode.DENY:
            error_code = next((b for b in bare if _ERROR_CODE_RE.match(b)), None)
            if error_code is None:
                error_code = next((q for q in quoted if _ERROR_CODE_RE.match(q)), None)
                if error_code is not None:
                    quoted.remove(error_code)
            if error_code is None:
                raise Tl1SyntaxError(f"DENY without an error code: {_preview(text)}")
        return Tl1Response(
            sid,
            response["ctag"],
            completion,
            error_code,
            tuple(quoted),
            tuple(comments),
            final=raw.terminator is Terminator.END,
        )
    autonomous = _AUTONOMOUS_RE.match(ident)
    if autonomous is not None:
        return Tl1Autonomous(
            sid,
            AlarmCode(autonomous["almcde"]),
            autonomous["atag"],
            " ".join(autonomous["message"].split()),
            tuple(quoted),
            tuple(comments),
        )
    raise Tl1SyntaxError(f"no response or autonomous identification line: {_preview(text)}")


def _scan_body(body: str) -> tuple[list[str], list[str], list[str]]:
    """Quoted strings (unescaped), comments (stripped) and bare lines (stripped) of a body."""
    quoted: list[str] = []
    comments: list[str] = []
    bare: list[str] = []
    i, n = 0, len(body)
    while i < n:
        ch = body[i]
        if ch.isspace():
            i += 1
        elif ch == '"':
            value, i = _read_quoted(body, i)
            quoted.append(value)
        elif body.startswith("/*", i):
            end = body.find("*/", i + 2)
            if end < 0:
                raise Tl1SyntaxError("unterminated comment")
            comments.append(body[i + 2 : end].strip())
            i = end + 2
        else:
            end = body.find("\n", i)
            end = n if end < 0 else end
            line = body[i:end].strip()
            if line:
                bare.append(line)
            i = end
    return quoted, comments, bare


def _read_quoted(text: str, start: int) -> tuple[str, int]:
    """The unescaped value of the quoted string at ``start`` and the index after it."""
    out: list[str] = []
    i = start + 1
    n = len(text)
    while i < n:
        ch = text[i]
        if ch == "\\" and i + 1 < n:
            out.append(text[i + 1])
            i += 2
        elif ch == '"':
            return "".join(out), i + 1
        else:
            out.append(ch)
            i += 1
    raise Tl1SyntaxError("unterminated quoted string")


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == '"' and value[-1] == '"':
        return _read_quoted(value, 0)[0]
    return value


def _preview(text: str, limit: int = 60) -> str:
    flat = " ".join(text.split())
    return repr(flat if len(flat) <= limit else flat[:limit] + "...")


# --- commands ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Tl1Command:
    """One input command. ``code`` is upper case; ``ctag`` is None when the ctag block is
    missing; quoted blocks are unquoted."""

    code: str
    tid: str = ""
    aid: str = ""
    ctag: str | None = None
    general: str = ""
    params: tuple[str, ...] = ()


def tl1_value(text: str) -> str:
    """``text`` as a TL1 value: unchanged when it holds only safe characters, else quoted with
    ``\\"`` and ``\\\\`` escapes. Raises ``ValueError`` for a character outside printable
    ASCII."""
    if any(not (32 <= ord(ch) < 127) for ch in text):
        raise ValueError("TL1 values must be printable ASCII")
    if _SAFE_VALUE_RE.match(text):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def format_command(
    code: str, ctag: str, *, tid: str = "", aid: str = "", params: Sequence[str] = ()
) -> str:
    """The command text, e.g. ``format_command("RTRV-PATCH", "9")`` -> ``RTRV-PATCH:::9:;``
    and ``format_command("ACT-USER", "7", aid="admin", params=["root"])`` ->
    ``ACT-USER::admin:7::root;``. ``params`` are payload blocks after the (empty) general
    block, passed verbatim (quote values with ``tl1_value``). Raises ``ValueError`` for a bad
    code or ctag."""
    if not _CODE_RE.match(code):
        raise ValueError(f"bad TL1 command code {code!r}")
    if not CTAG_RE.match(ctag):
        raise ValueError(f"bad TL1 ctag {ctag!r}")
    blocks = [code, tid, aid, ctag, "", *params]
    return ":".join(blocks) + ";"


def parse_command(text: str) -> Tl1Command:
    """Parse one command (without its ``;``). Raises ``Tl1SyntaxError`` when the command code
    is missing or malformed, or a quoted string is unterminated."""
    blocks = _split_blocks(text.strip())
    code = blocks[0].strip()
    if not _CODE_RE.match(code):
        raise Tl1SyntaxError(f"bad command code {_preview(code)}")
    values = [_unquote(b.strip()) for b in blocks]
    return Tl1Command(
        code=code.upper(),
        tid=values[1] if len(values) > 1 else "",
        aid=values[2] if len(values) > 2 else "",
        ctag=values[3] if len(values) > 3 else None,
        general=values[4] if len(values) > 4 else "",
        params=tuple(values[5:]),
    )


def _split_blocks(text: str) -> list[str]:
    blocks: list[str] = []
    cur: list[str] = []
    in_quote = escape = False
    for ch in text:
        if in_quote:
            cur.append(ch)
            if escape:
                escape = False
            elif ch == "\\":
                escape = True
            elif ch == '"':
                in_quote = False
        elif ch == ":":
            blocks.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
            if ch == '"':
                in_quote = True
    if in_quote:
        raise Tl1SyntaxError("unterminated quoted string in command")
    blocks.append("".join(cur))
    return blocks


# --- port lists ----------------------------------------------------------------------------------


def parse_port_list(text: str) -> tuple[int, ...]:
    """Ports of a Polatis port list, in order: ``1&3&5&&8`` -> (1, 3, 5, 6, 7, 8).

    Raises ``Tl1SyntaxError`` for an empty list or element, a non-numeric port, a range whose
    end is below its start, or a chained range (``1&&3&&5``)."""
    text = text.strip()
    if not text:
        raise Tl1SyntaxError("empty port list")
    out: list[int] = []
    tokens = re.split(r"(&&|&)", text)  # port, separator, port, ...; "&&&" leaves an empty port
    i = 0
    while i < len(tokens):
        start = _port_token(tokens[i], text)
        sep = tokens[i + 1] if i + 1 < len(tokens) else None
        if sep == "&&":
            end = _port_token(tokens[i + 2], text)
            if end < start:
                raise Tl1SyntaxError(f"range {start}&&{end} runs backwards")
            out.extend(range(start, end + 1))
            if i + 3 < len(tokens) and tokens[i + 3] == "&&":
                raise Tl1SyntaxError(f"chained range in {_preview(text)}")
            i += 4
        else:
            out.append(start)
            i += 2
    return tuple(out)


def port_number(text: str) -> int | None:
    """The port an aid or port-list element names: ASCII digits only, else None.
    (``str.isdigit`` also accepts Latin-1 superscripts such as ``"\u00b2"``, which ``int``
    refuses: a device's garbage must not pass that check and raise ``ValueError``.)"""
    return int(text) if text.isascii() and text.isdigit() else None


def _port_token(token: str, text: str) -> int:
    port = port_number(token.strip())
    if port is None:
        raise Tl1SyntaxError(f"bad port {token.strip()!r} in {_preview(text)}")
    return port


def format_port_list(ports: Iterable[int]) -> str:
    """A Polatis port list for ``ports`` in the order given, runs of three or more consecutive
    ascending ports written as ranges: [1, 3, 5, 6, 7, 8] -> ``1&3&5&&8``. Raises
    ``ValueError`` for an empty list or a port below 1."""
    seq = list(ports)
    if not seq:
        raise ValueError("empty port list")
    if min(seq) < 1:
        raise ValueError(f"ports are 1-based, got {min(seq)}")
    parts: list[str] = []
    i = 0
    while i < len(seq):
        j = i
        while j + 1 < len(seq) and seq[j + 1] == seq[j] + 1:
            j += 1
        if j - i >= 2:
            parts.append(f"{seq[i]}&&{seq[j]}")
        else:
            parts.extend(str(p) for p in seq[i : j + 1])
        i = j + 1
    return "&".join(parts)


# --- output formatting (device side) -------------------------------------------------------------


def format_header(sid: str, when: datetime) -> str:
    """``<cr><lf><lf>^^^<sid>^<yy-mm-dd>^<hh:mm:ss><cr><lf>``."""
    return f"\r\n\n   {tl1_value(sid)} {when:%y-%m-%d %H:%M:%S}\r\n"


def format_response(
    sid: str,
    when: datetime,
    ctag: str,
    completion: CompletionCode,
    *,
    error_code: str | None = None,
    lines: Sequence[str] = (),
    comments: Sequence[str] = (),
    terminator: Terminator = Terminator.END,
) -> str:
    """A complete response frame ending in ``terminator`` with nothing after it."""
    parts = [format_header(sid, when), f"M  {ctag} {completion.value}\r\n"]
    if error_code is not None:
        parts.append(f"   {error_code}\r\n")
    parts.extend(_quoted_line(line) for line in lines)
    parts.extend(f"   /* {_comment_text(c)} */\r\n" for c in comments)
    parts.append(terminator.value)
    return "".join(parts)


def format_autonomous(
    sid: str,
    when: datetime,
    alarm_code: AlarmCode,
    atag: int,
    message: str,
    lines: Sequence[str] = (),
) -> str:
    """A complete autonomous message frame, e.g. ``** 12 REPT ALM EQPT``."""
    parts = [format_header(sid, when), f"{alarm_code.value:<2} {atag} {message}\r\n"]
    parts.extend(_quoted_line(line) for line in lines)
    parts.append(";")
    return "".join(parts)


def _quoted_line(text: str) -> str:
    return '   "' + text.replace("\\", "\\\\").replace('"', '\\"') + '"\r\n'


def _comment_text(text: str) -> str:
    return text.replace("*/", "* /").replace("\r", " ").replace("\n", " ")


# --- alarm lines ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AlarmLine:
    """One alarm line of REPT ALM or RTRV-ALM-ALL (GR-833 layout).

    ``notification`` is CR/MJ/MN/NA/CL, ``service_affecting`` is srveff SA, ``occurred_date``
    MM-DD and ``occurred_time`` HH-MM-SS as sent.
    """

    aid: str
    notification: str
    condition: str
    service_affecting: bool
    occurred_date: str
    occurred_time: str
    description: str = ""


def format_alarm_line(alarm: AlarmLine) -> str:
    """The unescaped text of an alarm line (``format_response`` quotes and escapes it)."""
    srveff = "SA" if alarm.service_affecting else "NSA"
    return (
        f"{alarm.aid}:{alarm.notification},{alarm.condition},{srveff},"
        f'{alarm.occurred_date},{alarm.occurred_time}:"{alarm.description}"'
    )


def parse_alarm_line(text: str) -> AlarmLine:
    """Parse the unescaped text of an alarm line. Raises ``Tl1SyntaxError``."""
    m = _ALARM_LINE_RE.match(text.strip())
    if m is None:
        raise Tl1SyntaxError(f"bad alarm line {_preview(text)}")
    desc = (m["desc"] or "").strip()
    if len(desc) >= 2 and desc[0] == '"' and desc[-1] == '"':
        desc = desc[1:-1]
    return AlarmLine(
        aid=m["aid"].strip(),
        notification=m["ntfcncde"],
        condition=m["condtype"].strip(),
        service_affecting=m["srveff"].strip() == "SA",
        occurred_date=m["ocrdat"].strip(),
        occurred_time=m["ocrtm"].strip(),
        description=desc,
    )
