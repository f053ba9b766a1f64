"""Bad input, fuzzed (issue 10, section 5): the TL1 and RESTCONF drivers against loopback
servers that answer every command with a random or mutated reply (wrong lines, wrong types,
wrong status codes, cut or corrupted bytes, a wrong ctag). Each driver call ends with its
result or a ``DriverError`` (the family of ``lightrail.drivers.base``) whose message says what
was wrong: never another exception, and never a hang (each call is bounded by the driver's own
timeouts; the test allows a few of them).

The servers log in (TL1 ``ACT-USER``) and identify the device (RESTCONF
``product-information``) properly, so the driver opens and the fuzzed answers reach every
read and write path. Property-based (hypothesis), derandomized and bounded for CI
(``tests/fuzz.py``); one server per test, the examples in the test's event loop."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime

import pytest
import pytest_asyncio
from hypothesis import example, given
from hypothesis import strategies as st

from lightrail.drivers.base import (
    CrossConnect,
    DriverError,
    PortAdmin,
    ProtocolError,
    SwitchCapabilities,
    SwitchKind,
    SwitchSpec,
)
from lightrail.drivers.restconf.driver import RestconfDriver
from lightrail.drivers.restconf.options import RestconfCredentials, RestconfOptions
from lightrail.drivers.tl1.driver import Tl1Driver
from lightrail.drivers.tl1.options import Tl1Options
from lightrail.drivers.tl1.wire import (
    AlarmCode,
    CompletionCode,
    format_autonomous,
    format_response,
    parse_command,
)
from tests.fuzz import fuzz_settings

FUZZ = fuzz_settings(80)
NXN8 = SwitchCapabilities(kind=SwitchKind.NXN, port_count=8, atomic_bulk=False,
                          settle_time_s=0.0)
WHEN = datetime(2026, 1, 2, 3, 4, 5)
BOUND_S = 5.0
"""No driver call may take longer (its own deadlines are 50 ms per TL1 command, 0.5 s per
HTTP exchange; a call sends a few commands)."""


def xc(ingress: int, egress: int) -> CrossConnect:
    return CrossConnect(ingress, egress)


async def bounded(call: Awaitable[object]) -> object | DriverError:
    """The call's result or its ``DriverError``; any other exception fails the test, and so
    does a call still running after ``BOUND_S``."""
    try:
        async with asyncio.timeout(BOUND_S):
            return await call
    except DriverError as exc:
        assert str(exc).startswith("switch 'sw': ") and len(str(exc)) > len("switch 'sw': ")
        return exc


@st.composite
def mutated(draw: st.DrawFn, raw: bytes) -> bytes:
    """``raw`` with a few bytes replaced, inserted or cut."""
    out = bytearray(raw)
    for _ in range(draw(st.integers(0, 3))):
        op = draw(st.sampled_from(["replace", "insert", "cut"]))
        at = draw(st.integers(0, max(len(out) - 1, 0)))
        if op == "replace" and out:
            out[at] = draw(st.integers(0, 255))
        elif op == "insert":
            out[at:at] = draw(st.binary(min_size=1, max_size=8))
        else:
            del out[at:at + draw(st.integers(1, 16))]
    return bytes(out)


# --- TL1 ---------------------------------------------------------------------------------------

TL1_LINE = st.one_of(
    st.sampled_from(["1,9", "2,10", "9,1", "1,1", "1,99", "99999999999999999999,9", "1:-3.0",
                     "9:-3.0", "1:nan", "1:1e999", "1:OPEN", "1:CLOSED", "1:AJAR", "1:", ":",
                     "\u00b2,9", "9:\u00b2", "POLATIS,OST,OCS,7.1", "POLATIS", "SYSTEM:SIZE=8x8",
                     "SYSTEM:SIZE=4x4", '1:CR,LOS,SA,01-02,03-04-05:"no light"',
                     '\u00b2:CR,LOS,SA,01-02,03-04-05:"x"', "ALL:MJ,X,NSA,,", ""]),
    st.text(alphabet=st.characters(codec="latin-1"), max_size=30),
)


@dataclass(frozen=True)
class Tl1Reply:
    """A reply to render for a command's ctag: a (maybe wrong) response, then byte
    mutations; or bytes of any kind."""

    completion: CompletionCode
    error_code: str | None
    lines: tuple[str, ...]
    comments: tuple[str, ...]
    ctag: str | None  # None: the command's own
    final: bool
    garbage: bytes | None
    cuts: Callable[[bytes], bytes] = field(compare=False)

    def render(self, ctag: str) -> bytes:
        if self.garbage is not None:
            return self.garbage
        text = format_response("OST", WHEN, self.ctag or ctag, self.completion,
                               error_code=self.error_code, lines=self.lines,
                               comments=self.comments)
        if not self.final:
            text = text[:-1] + ">"
        return self.cuts(text.encode("latin-1"))


@st.composite
def tl1_replies(draw: st.DrawFn) -> Tl1Reply:
    seed = draw(st.randoms(use_true_random=False))

    def cuts(raw: bytes) -> bytes:  # the same mutations for every command of the example
        if not mutate:
            return raw
        out = bytearray(raw)
        for _ in range(seed.randint(1, 3)):
            at = seed.randrange(max(len(out), 1))
            out[at:at + seed.randint(0, 4)] = bytes([seed.randrange(256)])
        return bytes(out)

    mutate = draw(st.sampled_from([False, False, True]))
    return Tl1Reply(
        completion=draw(st.sampled_from([CompletionCode.COMPLD, CompletionCode.COMPLD,
                                         *CompletionCode])),
        error_code=draw(st.one_of(st.none(), st.sampled_from(
            ["IIAC", "SAAS", "PLNA", "PICC", "SROF", "SDNR", "ICNV", "ZZZZ"]))),
        lines=tuple(draw(st.lists(TL1_LINE, max_size=4))),
        comments=tuple(draw(st.lists(st.sampled_from(
            ["Invalid OXC port: 3", "port 99", "1,9: busy", "x"]), max_size=2))),
        ctag=draw(st.sampled_from([None, None, None, "999"])),
        final=draw(st.sampled_from([True, True, True, False])),
        garbage=draw(st.one_of(st.none(), st.none(), st.binary(max_size=120))),
        cuts=cuts)


@dataclass
class Tl1Fuzzer:
    """A TL1 device on 127.0.0.1 that logs users in and answers every other command with
    ``reply``, then hangs up (so a reply that never completes ends the call at once, as a
    dropped connection). Without ``reply`` it answers COMPLD with no lines, after sending the
    autonomous message ``alarm`` when there is one."""

    reply: Tl1Reply | None = None
    alarm: bytes | None = None
    port: int = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        buf = b""
        try:
            while data := await reader.read(4096):
                buf += data
                while b";" in buf:
                    raw, _, buf = buf.partition(b";")
                    cmd = parse_command(raw.decode("ascii"))
                    ctag = cmd.ctag or "0"
                    if cmd.code in ("ACT-USER", "CANC-USER") or self.reply is None:
                        if self.alarm is not None and cmd.code not in ("ACT-USER", "CANC-USER"):
                            writer.write(self.alarm)  # while the driver is logged in
                        writer.write(format_response("OST", WHEN, ctag, CompletionCode.COMPLD)
                                     .encode())
                        continue
                    writer.write(self.reply.render(ctag))
                    await writer.drain()
                    return
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()


@pytest_asyncio.fixture
async def tl1() -> AsyncIterator[Tl1Fuzzer]:
    fuzzer = Tl1Fuzzer()
    server = await asyncio.start_server(fuzzer.handle, "127.0.0.1", 0)
    fuzzer.port = server.sockets[0].getsockname()[1]
    async with server:
        yield fuzzer


async def tl1_driver(fuzzer: Tl1Fuzzer) -> Tl1Driver:
    spec = SwitchSpec("sw", "tl1", NXN8)
    opts = Tl1Options.model_validate({
        "host": "127.0.0.1", "port": fuzzer.port, "username": "admin", "password": "root",
        "timeout_s": 0.05, "connect_timeout_s": 1.0, "reconnect_interval_s": 0.01})
    driver = Tl1Driver(spec, opts)
    await driver.open()
    return driver


TL1_CALLS: dict[str, Callable[[Tl1Driver], Awaitable[object]]] = {
    "get_cross_connects": lambda d: d.get_cross_connects(),
    "info": lambda d: d.info(),
    "get_power": lambda d: d.get_power([1, 9]),
    "get_port_status": lambda d: d.get_port_status([1, 9]),
    "set_port_admin": lambda d: d.set_port_admin(1, PortAdmin.DISABLED),
    "apply": lambda d: d.apply(frozenset({xc(1, 9)}), frozenset({1, 9})),
    "apply_from_current": lambda d: d.apply(frozenset({xc(1, 9)}), frozenset({1, 2, 9, 10}),
                                            current=frozenset({xc(2, 10)})),
}


@FUZZ
@given(call=st.sampled_from(sorted(TL1_CALLS)), reply=tl1_replies())
async def test_tl1_driver_answers_any_reply_with_a_result_or_a_driver_error(
    tl1: Tl1Fuzzer, call: str, reply: Tl1Reply
) -> None:
    tl1.reply, tl1.alarm = reply, None
    driver = await tl1_driver(tl1)
    try:
        await bounded(TL1_CALLS[call](driver))
        tl1.reply = None  # the device answers properly again: the driver recovers
        assert await bounded(driver.get_cross_connects()) == frozenset()
    finally:
        await driver.close()


TL1_ALARM_LINE = st.one_of(TL1_LINE, st.sampled_from(
    ['\u00b2:CR,LOS,SA,01-02,03-04-05:"x"', '1:CR,LOS,SA,01-02,03-04-05:"no light"']))


@FUZZ
@given(lines=st.lists(TL1_ALARM_LINE, max_size=3),
       code=st.sampled_from(AlarmCode), message=st.sampled_from(["REPT ALM EQPT", "REPT EVT"]))
@example(lines=['\u00b2:CR,LOS,SA,01-02,03-04-05:"x"'], code=AlarmCode.CRITICAL,
         message="REPT ALM EQPT")
async def test_tl1_autonomous_messages_of_any_content_leave_the_session_working(
    tl1: Tl1Fuzzer, lines: list[str], code: AlarmCode, message: str
) -> None:
    """An alarm the driver cannot use is dropped (logged); the session goes on."""
    tl1.reply = None
    tl1.alarm = format_autonomous("OST", WHEN, code, 1, message, lines).encode("latin-1")
    driver = await tl1_driver(tl1)
    try:
        events = driver.events()
        assert await bounded(driver.get_cross_connects()) == frozenset()
        await events.aclose()  # type: ignore[attr-defined]
    finally:
        await driver.close()


# --- RESTCONF ----------------------------------------------------------------------------------

GOOD: dict[str, object] = {
    "optical-switch:cross-connects": {"optical-switch:cross-connects": {
        "pair": [{"ingress": 1, "egress": 9}]}},
    "optical-switch:opm-power": {"optical-switch:opm-power": {
        "port": [{"port-id": 1, "power": "-3.00"}, {"port-id": 9, "power": "-3.00"}]}},
    "optical-switch:port-config": {"optical-switch:port-config": {
        "port": [{"port-id": 1, "status": "ENABLED"}, {"port-id": 9, "status": "ENABLED"}]}},
    "polatis-switch:system-alarms": {"polatis-switch:system-alarms": {"alarm": [{
        "alarm-time": "2026-01-01T00:00:00Z", "alarm-type": "NOTIF_PORT_POWER",
        "alarm-message": "port 9: LOS: port 9 failed"}]}},
    "ietf-restconf:errors": {"ietf-restconf:errors": {"error": [{
        "error-type": "application", "error-tag": "in-use", "error-path": "pair[ingress='1']",
        "error-message": "1->9 conflicts with 1->10"}]}},
}
PRODUCT = {"optical-switch:product-information": {
    "manufacturer": "Polatis", "model-name": "6000", "software-version": "7", "serial-number": "1"}}
JSON_LEAF = st.one_of(
    st.none(), st.booleans(), st.integers(-(10**30), 10**30), st.just(10**400), st.floats(),
    st.text(max_size=10), st.sampled_from(["9", "\u00b2", "-3.00", "nan", "DISABLED", "FAILED",
                                           "0001-01-01T00:00:00", "port 9: LOS: x"]))
JSON = st.recursive(JSON_LEAF, lambda kids: st.one_of(
    st.lists(kids, max_size=3), st.dictionaries(st.text(max_size=8), kids, max_size=3)),
    max_leaves=8)


def _paths(doc: object, prefix: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
    out: list[tuple[object, ...]] = []
    items: list[tuple[object, object]] = (
        list(doc.items()) if isinstance(doc, dict)
        else list(enumerate(doc)) if isinstance(doc, list) else [])
    for k, v in items:
        out.append((*prefix, k))
        out.extend(_paths(v, (*prefix, k)))
    return out


@dataclass(frozen=True)
class HttpReply:
    """An answer to render for a request path: status, ETag and a body (the good document
    for the path with values replaced, or bytes of any kind), then byte mutations of the
    whole answer."""

    status: int
    etag: str | None
    replace: tuple[tuple[int, object], ...]  # (path choice, value) pairs
    body: bytes | None
    length_delta: int
    cuts: Callable[[bytes], bytes] = field(compare=False)

    def __repr__(self) -> str:  # a body of 100,000 brackets is shown by its length
        body = None if self.body is None else (
            self.body if len(self.body) <= 80
            else f"<{len(self.body)} bytes: {self.body[:20]!r}...>")
        return (f"HttpReply(status={self.status}, etag={self.etag!r}, replace={self.replace!r}, "
                f"body={body!r}, length_delta={self.length_delta})")

    def render(self, container: str) -> bytes:
        if self.body is not None:
            body = self.body
        else:
            doc = json.loads(json.dumps(GOOD.get(container, GOOD["ietf-restconf:errors"])))
            for choice, value in self.replace:
                paths = _paths(doc)
                if not paths:
                    break
                path = paths[choice % len(paths)]
                node = doc
                for key in path[:-1]:
                    node = node[key]
                node[path[-1]] = value
            body = json.dumps(doc).encode()
        etag = f"ETag: {self.etag}\r\n" if self.etag is not None else ""
        head = (f"HTTP/1.1 {self.status} X\r\nContent-Type: application/yang-data+json\r\n"
                f"Content-Length: {max(len(body) + self.length_delta, 0)}\r\n{etag}"
                "Connection: close\r\n\r\n")
        return self.cuts(head.encode("latin-1") + body)


@st.composite
def http_replies(draw: st.DrawFn) -> HttpReply:
    seed = draw(st.randoms(use_true_random=False))
    mutate = draw(st.sampled_from([False, False, False, True]))

    def cuts(raw: bytes) -> bytes:
        if not mutate:
            return raw
        out = bytearray(raw)
        for _ in range(seed.randint(1, 3)):
            at = seed.randrange(max(len(out), 1))
            out[at:at + seed.randint(0, 4)] = bytes([seed.randrange(256)])
        return bytes(out)

    return HttpReply(
        status=draw(st.one_of(st.sampled_from([200, 200, 204, 400, 401, 404, 409, 412, 413,
                                               500, 503, 504]), st.integers(200, 599))),
        etag=draw(st.one_of(st.none(), st.just('"1"'), st.text(
            alphabet=st.characters(codec="ascii", min_codepoint=32), max_size=8))),
        replace=tuple(draw(st.lists(st.tuples(st.integers(0, 50), JSON), max_size=3))),
        body=draw(st.one_of(st.none(), st.none(), st.none(), st.binary(max_size=80),
                            st.just(b"[" * 100_000))),
        length_delta=draw(st.sampled_from([0, 0, 0, -3, 5])),
        cuts=cuts)


@dataclass
class RestconfFuzzer:
    """An HTTP server on 127.0.0.1 that answers ``product-information`` properly and every
    other request with ``reply`` (rendered for the path's container), one request per
    connection."""

    reply: HttpReply | None = None
    port: int = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            request_line, *headers = head.decode("latin-1").split("\r\n")
            length = next((int(h.split(":", 1)[1]) for h in headers
                           if h.lower().startswith("content-length:")), 0)
            await reader.readexactly(length)
            path = request_line.split()[1]
            container = path.split("/data/", 1)[-1].split("/", 1)[0]
            if "product-information" in path or self.reply is None:
                body = json.dumps(PRODUCT if "product-information" in path
                                  else GOOD.get(container, {})).encode()
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/yang-data+json\r\n"
                             b'ETag: "0"\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s'
                             % (len(body), body))
            else:
                writer.write(self.reply.render(container))
            await writer.drain()
        except (ConnectionError, OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()


@pytest_asyncio.fixture
async def restconf() -> AsyncIterator[RestconfFuzzer]:
    fuzzer = RestconfFuzzer()
    server = await asyncio.start_server(fuzzer.handle, "127.0.0.1", 0)
    fuzzer.port = server.sockets[0].getsockname()[1]
    async with server:
        yield fuzzer


async def restconf_driver(fuzzer: RestconfFuzzer) -> RestconfDriver:
    opts = RestconfOptions.model_validate({
        "host": "127.0.0.1", "port": fuzzer.port, "username": "admin", "password": "pw",
        "timeout_s": 0.5, "alarm_poll_interval_s": 0.01})
    driver = RestconfDriver("sw", NXN8, opts, RestconfCredentials("admin", "pw"))
    await driver.open()
    return driver


async def _first_alarm(driver: RestconfDriver) -> object:
    """The first alarm ``events()`` delivers, or None when none comes within 50 ms (a poll
    that fails with a ``DriverError`` is logged and polling goes on)."""
    events = driver.events()
    try:
        async with asyncio.timeout(0.05):
            return await anext(events)
    except TimeoutError:
        return None
    finally:
        await events.aclose()  # type: ignore[attr-defined]


RESTCONF_CALLS: dict[str, Callable[[RestconfDriver], Awaitable[object]]] = {
    "get_cross_connects": lambda d: d.get_cross_connects(),
    "get_power": lambda d: d.get_power([1, 9]),
    "get_all_power": lambda d: d.get_power(),
    "get_port_status": lambda d: d.get_port_status([1, 9]),
    "set_port_admin": lambda d: d.set_port_admin(1, PortAdmin.DISABLED),
    "apply": lambda d: d.apply(frozenset({xc(2, 10)}), frozenset({2, 10})),
    "apply_from_current": lambda d: d.apply(frozenset({xc(2, 10)}), frozenset({1, 2, 9, 10}),
                                            current=frozenset({xc(1, 9)})),
    "events": _first_alarm,
}


@FUZZ
@given(call=st.sampled_from(sorted(RESTCONF_CALLS)), reply=http_replies())
async def test_restconf_driver_answers_any_reply_with_a_result_or_a_driver_error(
    restconf: RestconfFuzzer, call: str, reply: HttpReply
) -> None:
    restconf.reply = None
    driver = await restconf_driver(restconf)
    restconf.reply = reply
    try:
        await bounded(RESTCONF_CALLS[call](driver))
        restconf.reply = None  # the device answers properly again: the driver recovers
        assert await bounded(driver.get_cross_connects()) == frozenset({xc(1, 9)})
    finally:
        await driver.close()


# --- found by fuzzing --------------------------------------------------------------------------


async def test_found_by_fuzzing_a_superscript_port_in_an_alarm_killed_the_tl1_session(
    tl1: Tl1Fuzzer,
) -> None:
    """``REPT ALM`` with the aid ``"\u00b2"`` raised ``ValueError`` in the session's reader
    (``str.isdigit`` accepts it, ``int`` does not): the session died and the next command
    failed as unreachable. Now the alarm is delivered without a port and the session goes
    on."""
    tl1.alarm = format_autonomous("OST", WHEN, AlarmCode.CRITICAL, 1, "REPT ALM EQPT",
                                  ['\u00b2:CR,LOS,SA,01-02,03-04-05:"x"']).encode("latin-1")
    driver = await tl1_driver(tl1)
    try:
        events = driver.events()
        assert await driver.get_cross_connects() == frozenset()  # the alarm came first
        alarm = await asyncio.wait_for(anext(events), BOUND_S)
        assert (alarm.port, alarm.condition) == (None, "LOS")
        assert await driver.get_cross_connects() == frozenset()
        await events.aclose()  # type: ignore[attr-defined]
    finally:
        await driver.close()


async def test_found_by_fuzzing_a_tl1_power_reading_of_nan(tl1: Tl1Fuzzer) -> None:
    """``"1:nan"`` (and ``"1:1e999"``) parsed as a power of NaN (infinity) dBm and came back
    as a reading. Now a ``ProtocolError`` naming the port and the value."""
    tl1.reply = Tl1Reply(CompletionCode.COMPLD, None, ("1:nan", "9:-3.0"), (), None, True,
                         None, cuts=lambda raw: raw)
    driver = await tl1_driver(tl1)
    try:
        with pytest.raises(ProtocolError, match="bad value 'nan' for port 1"):
            await driver.get_power([1, 9])
    finally:
        await driver.close()


def _power(value: object) -> bytes:
    return json.dumps({"optical-switch:opm-power": {"port": [{"port-id": 1, "power": value}]}}
                      ).encode()


@pytest.mark.parametrize(("body", "match"), [
    (b"[" * 100_000, "answer is not JSON"),
    (_power(10**400), "port 1 power: an integer of 401 digits is not a finite number"),
    (_power("nan"), "port 1 power: 'nan' is not a finite number"),
])
async def test_found_by_fuzzing_restconf_answers_that_escaped_as_other_errors(
    restconf: RestconfFuzzer, body: bytes, match: str
) -> None:
    """A body of 100,000 ``[`` raised ``RecursionError`` from ``json.loads`` and a power of
    10^400 ``OverflowError`` from ``float()``, both past the driver's ``except ValueError``; a
    power of ``"nan"`` came back as a reading. Each is now a ``ProtocolError`` saying what was
    wrong."""
    driver = await restconf_driver(restconf)
    restconf.reply = HttpReply(200, None, (), body, 0, cuts=lambda raw: raw)
    try:
        with pytest.raises(ProtocolError, match=match):
            await driver.get_power([1])
    finally:
        await driver.close()
