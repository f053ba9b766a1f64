"""TL1 wire parsing without sockets: frame splitting at any byte, the terminator without a
newline, ctag matching and read timeouts in a session fed by hand, Polatis port lists, commands,
alarm lines and the DENY-code mapping (lightrail.drivers.tl1.wire, lightrail.drivers.tl1)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from lightrail.drivers.base import (
    AuthenticationFailed,
    CrossConnect,
    CrossConnectConflict,
    DeviceTimeout,
    DeviceUnreachable,
    DriverError,
    HardwareFault,
    InvalidPort,
    ProtocolError,
)
from lightrail.drivers.tl1.errors import (
    DENY_CODES,
    DenyCategory,
    Tl1CommandRejected,
    UnsupportedOperation,
    deny_error,
)
from lightrail.drivers.tl1.session import ConnectionLost, Tl1Session
from lightrail.drivers.tl1.wire import (
    AlarmCode,
    AlarmLine,
    CompletionCode,
    FrameSplitter,
    RawFrame,
    Terminator,
    Tl1Acknowledgment,
    Tl1Autonomous,
    Tl1Response,
    Tl1SyntaxError,
    decode_frame,
    format_alarm_line,
    format_command,
    format_port_list,
    format_response,
    parse_alarm_line,
    parse_command,
    parse_port_list,
    tl1_value,
)

HEADER = "\r\n\n   OCS-A 26-01-15 10:20:30\r\n"


def reply(ctag: str, code: str = "COMPLD", body: str = "", end: str = ";") -> str:
    return f"{HEADER}M  {ctag} {code}\r\n{body}{end}"


def frames(*chunks: bytes | str) -> list[RawFrame]:
    splitter = FrameSplitter()
    out: list[RawFrame] = []
    for chunk in chunks:
        out += splitter.feed(chunk)
    return out


# --- framing -------------------------------------------------------------------------------------


def test_reply_split_inside_a_keyword_ends_at_the_terminator_without_newline() -> None:
    splitter = FrameSplitter()
    text = reply("17", body='   "1,41"\r\n   "3,51"\r\n')
    cut = text.index("COMPLD") + 3  # "COM" | "PLD"
    assert splitter.feed(text[:cut].encode()) == []
    assert splitter.feed(text[cut : cut + 5].encode()) == []
    assert splitter.pending
    # the final ';' arrives with the first bytes of the next frame and no newline between
    done = splitter.feed((text[cut + 5 :] + "\r\n\n   OCS-A 26-01").encode())
    assert len(done) == 1
    assert done[0].terminator is Terminator.END
    frame = decode_frame(done[0])
    assert frame == Tl1Response(
        sid="OCS-A", ctag="17", completion=CompletionCode.COMPLD, lines=("1,41", "3,51")
    )
    assert splitter.pending  # the start of the next frame stays buffered, not in the reply


@pytest.mark.parametrize("size", [1, 2, 3, 7])
def test_any_split_gives_the_same_frames(size: int) -> None:
    text = (
        reply("1", body='   "1,9"\r\n')
        + reply("2", "DENY", "   IDNV\r\n   /* Invalid OXC port: 99 */\r\n")
        + f'{HEADER}** 5 REPT ALM EQPT\r\n   "7:MJ,LOS,SA,01-15,10-20-30:\\"port 7 failed\\""\r\n;'
    ).encode()
    whole = [decode_frame(f) for f in frames(text)]
    chunks = [text[i : i + size] for i in range(0, len(text), size)]
    pieces = [decode_frame(f) for f in frames(*chunks)]
    assert pieces == whole
    assert [type(f) for f in whole] == [Tl1Response, Tl1Response, Tl1Autonomous]


def test_semicolons_inside_quotes_and_comments_do_not_end_a_frame() -> None:
    text = reply("4", body='   "a;b\\";c"\r\n   /* x; y > z < */\r\n')
    (raw,) = frames(text)
    frame = decode_frame(raw)
    assert isinstance(frame, Tl1Response)
    assert frame.lines == ('a;b";c',)
    assert frame.comments == ("x; y > z <",)


def test_deny_carries_the_error_code_and_comments() -> None:
    (raw,) = frames(reply("9", "DENY", "   IDNV\r\n   /* Invalid OXC port: 1000 */\r\n"))
    frame = decode_frame(raw)
    assert isinstance(frame, Tl1Response)
    assert frame.denied
    assert frame.error_code == "IDNV"
    assert frame.comments == ("Invalid OXC port: 1000",)


def test_continuation_prompt_echo_and_acknowledgment() -> None:
    raws = frames(
        reply("3", body='   "1,9"\r\n', end=">"),
        "\r\n<",  # a bare prompt
        "RTRV-PATCH:::3:;",  # an echoed command
        "IP 3\r\n<",
        reply("3", body='   "2,10"\r\n'),
    )
    decoded = [decode_frame(r) for r in raws]
    assert decoded[1] is None
    assert decoded[2] is None
    assert decoded[3] == Tl1Acknowledgment("IP", "3")
    first, last = decoded[0], decoded[4]
    assert isinstance(first, Tl1Response) and not first.final
    assert isinstance(last, Tl1Response) and last.final


@pytest.mark.parametrize(
    "text",
    [
        "\x00\xff\xfeGARBAGE\r\n;",
        f"{HEADER}X  12 COMPLD\r\n;",
        f"{HEADER}M  12 DENY\r\n   /* no code */\r\n;",
        "HELLO WORLD;",
    ],
)
def test_garbage_is_a_syntax_error(text: str) -> None:
    (raw,) = frames(text.encode("latin-1"))
    with pytest.raises(Tl1SyntaxError):
        decode_frame(raw)


def test_a_frame_without_terminator_is_bounded() -> None:
    splitter = FrameSplitter(max_chars=100)
    with pytest.raises(Tl1SyntaxError):
        splitter.feed(b"x" * 101)


# --- commands, values, port lists ----------------------------------------------------------------


def test_format_and_parse_commands() -> None:
    assert format_command("RTRV-PATCH", "9") == "RTRV-PATCH:::9:;"
    assert format_command("ENT-PATCH", "8", aid="1&2,50&49") == "ENT-PATCH::1&2,50&49:8:;"
    login = format_command("ACT-USER", "7", aid="admin", params=[tl1_value('p;w"x')])
    assert login == 'ACT-USER::admin:7::"p;w\\"x";'
    (raw,) = FrameSplitter(terminators=";", comments=False).feed(login)
    cmd = parse_command(raw.text)
    assert (cmd.code, cmd.aid, cmd.ctag, cmd.params) == ("ACT-USER", "admin", "7", ('p;w"x',))
    assert parse_command("rtrv-patch::1&3").ctag is None
    with pytest.raises(ValueError):
        format_command("RTRV-PATCH", "1234567")  # ctag: at most 6 characters
    with pytest.raises(ValueError):
        tl1_value("pässword")


@pytest.mark.parametrize(
    ("text", "ports"),
    [
        ("7", (7,)),
        ("1&3&5&&8", (1, 3, 5, 6, 7, 8)),
        ("10&&12&1", (10, 11, 12, 1)),
        ("50&49&51", (50, 49, 51)),
        ("1&&1", (1,)),
    ],
)
def test_port_list_syntax(text: str, ports: tuple[int, ...]) -> None:
    assert parse_port_list(text) == ports


@pytest.mark.parametrize("text", ["", "1&", "&1", "1&&&3", "1&&3&&5", "5&&3", "a", "-1", "1,2"])
def test_bad_port_lists(text: str) -> None:
    with pytest.raises(Tl1SyntaxError):
        parse_port_list(text)


def test_port_list_formatting_keeps_order_and_compresses_runs() -> None:
    assert format_port_list([1, 3, 5, 6, 7, 8]) == "1&3&5&&8"
    assert format_port_list([1, 2]) == "1&2"
    assert format_port_list([50, 49, 51]) == "50&49&51"
    assert format_port_list(range(1, 97)) == "1&&96"
    for ports in ([4, 5, 6, 9, 2, 3], [96], [1, 2, 3, 5, 6, 7]):
        assert parse_port_list(format_port_list(ports)) == tuple(ports)
    with pytest.raises(ValueError):
        format_port_list([])


def test_alarm_line_round_trip() -> None:
    line = AlarmLine("41", "MJ", "LOS", True, "01-15", "10-20-30", 'port 41 "failed"')
    text = format_alarm_line(line)
    assert parse_alarm_line(text) == line
    frame = decode_frame(frames(format_autonomous_text(text))[0])
    assert isinstance(frame, Tl1Autonomous)
    assert frame.alarm_code is AlarmCode.MAJOR
    assert frame.message == "REPT ALM EQPT"
    assert parse_alarm_line(frame.lines[0]) == line


def format_autonomous_text(line: str) -> str:
    escaped = line.replace("\\", "\\\\").replace('"', '\\"')
    return f'{HEADER}** 12 REPT ALM EQPT\r\n   "{escaped}"\r\n;'


def test_response_formatting_round_trip() -> None:
    from datetime import datetime

    text = format_response(
        "OCS-A",
        datetime(2026, 1, 15, 10, 20, 30),
        "5",
        CompletionCode.DENY,
        error_code="SROF",
        lines=['a "q"'],
        comments=["1,9: mirror */ stuck"],
    )
    assert text.startswith("\r\n\n   OCS-A 26-01-15 10:20:30\r\nM  5 DENY\r\n   SROF\r\n")
    assert text.endswith(";")
    (raw,) = frames(text)
    assert decode_frame(raw) == Tl1Response(
        "OCS-A", "5", CompletionCode.DENY, "SROF", ('a "q"',), ("1,9: mirror * / stuck",)
    )


# --- DENY mapping --------------------------------------------------------------------------------


def deny(code: str, *comments: str) -> Tl1Response:
    return Tl1Response("S", "1", CompletionCode.DENY, code, (), comments)


@pytest.mark.parametrize(
    ("code", "error_type"),
    [
        ("PICC", AuthenticationFailed),
        ("PLNA", AuthenticationFailed),
        ("IDNV", InvalidPort),
        ("IIAC", InvalidPort),
        ("SROF", HardwareFault),
        ("SDNR", DeviceTimeout),
        ("ICNV", UnsupportedOperation),
        ("IICM", UnsupportedOperation),
        ("IICT", Tl1CommandRejected),
        ("IPNV", Tl1CommandRejected),
        ("ZZZZ", Tl1CommandRejected),
    ],
)
def test_deny_codes_map_to_the_error_hierarchy(code: str, error_type: type[DriverError]) -> None:
    error = deny_error("sw", deny(code, "Invalid OXC port: 12"), ports=[3])
    assert type(error) is error_type
    assert code in str(error)
    if isinstance(error, InvalidPort):
        assert error.port == 12  # from the comment, not the first port sent


def test_deny_mapping_fallbacks_and_retryability() -> None:
    error = deny_error("sw", deny("IDNV"), ports=[3, 4])
    assert isinstance(error, InvalidPort) and error.port == 3
    assert isinstance(deny_error("sw", deny("IDNV")), Tl1CommandRejected)
    conflict = deny_error(
        "sw",
        deny("SAAS", "1,9: port in use by patch 2,9"),
        wanted=[CrossConnect(1, 9)],
        current=[CrossConnect(2, 9), CrossConnect(3, 10)],
    )
    assert isinstance(conflict, CrossConnectConflict)
    assert (conflict.wanted, conflict.existing) == (CrossConnect(1, 9), CrossConnect(2, 9))
    assert isinstance(deny_error("sw", deny("SAAS")), Tl1CommandRejected)
    assert deny_error("sw", deny("SDNR")).retryable
    assert not deny_error("sw", deny("PICC")).retryable
    assert not deny_error("sw", deny("ICNV")).retryable
    assert set(DENY_CODES.values()) == set(DenyCategory)


# --- a session fed by hand -----------------------------------------------------------------------


class FakeWriter:
    """Records what the session writes; ``written`` is set on each write."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.written = asyncio.Event()
        self.closed = False

    def write(self, data: bytes) -> None:
        self.data += data
        self.written.set()

    async def drain(self) -> None:
        return None

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    async def wait_closed(self) -> None:
        return None

    async def next_ctag(self) -> str:
        """The ctag of the next command written (waits for it)."""
        async with asyncio.timeout(2.0):
            while b";" not in self.data:
                self.written.clear()
                await self.written.wait()
        text, _, rest = bytes(self.data).partition(b";")
        self.data = bytearray(rest)
        ctag = parse_command(text.decode()).ctag
        assert ctag is not None
        return ctag


class Wire:
    def __init__(self) -> None:
        self.reader = asyncio.StreamReader()
        self.writer = FakeWriter()
        self.alarms: list[Tl1Autonomous] = []
        self.lost: list[DriverError] = []
        self.session = Tl1Session(
            "sw",
            self.reader,
            self.writer,
            timeout_s=2.0,
            on_autonomous=self.alarms.append,
            on_lost=self.lost.append,
        )

    def feed(self, text: str) -> None:
        self.reader.feed_data(text.encode("latin-1"))


@pytest_asyncio.fixture
async def wire() -> AsyncIterator[Wire]:
    w = Wire()
    w.session.start()
    yield w
    await w.session.close()


async def test_session_reply_in_pieces_matched_by_ctag(wire: Wire) -> None:
    call = asyncio.create_task(wire.session.command("RTRV-PATCH"))
    ctag = await wire.writer.next_ctag()
    other = str(int(ctag) + 100)
    wire.feed(reply(other, body='   "8,16"\r\n'))  # a stray reply for another ctag
    text = reply(ctag, body='   "1,41"\r\n')
    cut = text.index("COMPLD") + 2
    wire.feed(text[:cut])  # "CO" | "MPLD"
    wire.feed(text[cut:-1])
    assert not call.done()
    wire.feed(";")  # the terminator alone, no newline after it
    resp = await asyncio.wait_for(call, 2.0)
    assert resp.ctag == ctag
    assert resp.lines == ("1,41",)
    assert wire.session.alive


async def test_session_pipelines_and_merges_continuations(wire: Wire) -> None:
    first = asyncio.create_task(wire.session.command("RTRV-PATCH"))
    ctag1 = await wire.writer.next_ctag()
    second = asyncio.create_task(wire.session.command("RTRV-PORT-POWER", aid="1&2"))
    ctag2 = await wire.writer.next_ctag()
    assert ctag1 != ctag2
    assert wire.session.in_flight == 2
    wire.feed(reply(ctag2, body='   "1:-3.00"\r\n', end=">"))
    wire.feed(reply(ctag2, body='   "2:-40.00"\r\n'))
    wire.feed(reply(ctag1, body='   "1,9"\r\n'))
    assert (await second).lines == ("1:-3.00", "2:-40.00")
    assert (await first).lines == ("1,9",)


async def test_session_read_timeout_raises_and_the_late_reply_is_dropped(wire: Wire) -> None:
    call = asyncio.create_task(wire.session.command("RTRV-PATCH", timeout_s=0.05))
    ctag = await wire.writer.next_ctag()
    wire.feed(reply(ctag, body='   "1,9"\r\n')[:-1])  # all but the terminator
    with pytest.raises(DeviceTimeout, match=f"ctag {ctag}"):
        await call
    wire.feed(";")  # the late terminator: nobody waits for it any more
    again = asyncio.create_task(wire.session.command("RTRV-PATCH"))
    ctag2 = await wire.writer.next_ctag()
    wire.feed(reply(ctag2, body='   "2,10"\r\n'))
    assert (await again).lines == ("2,10",)
    assert wire.session.alive


async def test_session_routes_autonomous_messages(wire: Wire) -> None:
    wire.feed(format_autonomous_text('7:MJ,LOS,SA,01-15,10-20-30:"port 7 failed"'))
    call = asyncio.create_task(wire.session.command("RTRV-HDR"))
    wire.feed(reply(await wire.writer.next_ctag()))
    await call
    assert [a.message for a in wire.alarms] == ["REPT ALM EQPT"]


async def test_session_eof_mid_reply_fails_pending_commands(wire: Wire) -> None:
    call = asyncio.create_task(wire.session.command("RTRV-PATCH"))
    ctag = await wire.writer.next_ctag()
    wire.feed(reply(ctag)[:20])
    wire.reader.feed_eof()
    with pytest.raises(ConnectionLost, match="mid-reply") as info:
        await call
    assert info.value.mid_reply
    assert not wire.session.alive
    assert isinstance(wire.lost[0], DeviceUnreachable)
    with pytest.raises(DeviceUnreachable):
        await wire.session.command("RTRV-PATCH")


async def test_session_garbage_is_a_protocol_error_and_drops_the_connection(wire: Wire) -> None:
    call = asyncio.create_task(wire.session.command("RTRV-PATCH"))
    await wire.writer.next_ctag()
    wire.feed("\r\n\n\x00\xffGARBAGE\r\n;")
    with pytest.raises(ProtocolError, match="unparseable"):
        await call
    assert not wire.session.alive
    assert wire.writer.closed
