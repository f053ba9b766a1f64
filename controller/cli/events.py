"""``lightrail events`` and ``lightrail alarms``: the controller's event stream and alarm log
over OperatorService (no MQTT needed; README "Events and alarms (MQTT)").

``events`` prints the recent events the controller keeps (a bounded ring of the last 1,000),
oldest first, and ends; ``--follow`` prints them and then every new event until interrupted,
moving to the new leader when the one it follows goes away (events are printed once, by
``event_id``). One line per event; ``--json``: one JSON object per line (JSON Lines), the fields
MQTT carries. ``alarms`` lists the active device alarms (``--all``: also the recently cleared).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import sys
from collections import deque
from typing import Any

import grpc

from lightrail.agents.leader import LeaderTargets, NoLeader
from lightrail.controller.cli import jsonout
from lightrail.controller.cli.common import (
    CONTROLLER_HELP,
    DEFAULT_TARGET,
    CliUsageError,
    add_tls_arguments,
    address_hint,
    client_tls,
    controller_address,
    make_console,
    run_async,
)
from lightrail.controller.cli.operator import operator_call, table
from lightrail.v1 import operator_pb2, operator_pb2_grpc

FOLLOW_RETRY_S = 1.0
"""Wait before ``events --follow`` looks for a leader again after losing its stream, s."""

_SEEN_IDS = 10_000
"""Event ids ``events --follow`` remembers to print each event once across reconnects."""


def _targets(args: argparse.Namespace) -> LeaderTargets | None:
    """The controller replicas of ``--controller`` with ``--tls-*``; None (message printed)
    when they are malformed."""
    try:
        where = controller_address(args.controller)
        return LeaderTargets(where.address, tls=client_tls(args))
    except CliUsageError as exc:
        print(f"lightrail {args.cmd}: {exc}", file=sys.stderr)
    except ValueError as exc:
        print(f"lightrail {args.cmd}: --{exc} {address_hint(where)}", file=sys.stderr)
    return None


def _hint(args: argparse.Namespace) -> str:
    """Where the address came from and how to set it (``common.address_hint``)."""
    return address_hint(controller_address(args.controller))


def event_line(ev: operator_pb2.FabricEvent) -> str:
    """One event as a line: UTC time, kind, job and switch (when given), the message, the
    fields (``key=value``) and the event id in brackets."""
    at = datetime.datetime.fromtimestamp(ev.at_unix_s, datetime.UTC)
    who = " ".join(x for x in (f"job={ev.job_id}" if ev.job_id else "",
                               f"switch={ev.switch_id}" if ev.switch_id else "") if x)
    fields = " ".join(f"{k}={ev.fields[k]}" for k in sorted(ev.fields))
    parts = [at.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z", f"{ev.kind:<20}", who,
             ev.message, fields, f"[{ev.event_id}]"]
    return "  ".join(p for p in parts if p)


def cmd_events(args: argparse.Namespace) -> int:
    targets = _targets(args)
    if targets is None:
        return 2
    request = operator_pb2.StreamEventsRequest(job_id=args.job or "", kinds=args.kind or [],
                                               follow=args.follow)
    seen: set[str] = set()
    order: deque[str] = deque()

    def show(ev: operator_pb2.FabricEvent) -> None:
        if ev.event_id in seen:
            return
        seen.add(ev.event_id)
        order.append(ev.event_id)
        if len(order) > _SEEN_IDS:
            seen.discard(order.popleft())
        line = json.dumps(jsonout.to_plain(ev)) if args.json else event_line(ev)
        print(line, flush=args.follow)

    async def stream(address: str) -> None:
        async with targets.channel(address) as ch:
            call = operator_pb2_grpc.OperatorServiceStub(ch).StreamEvents(request)
            async for ev in call:
                show(ev)

    async def main() -> int:
        while True:
            try:
                await targets.call(stream)
                if not args.follow:
                    return 0
                problem = "the stream ended"
            except NoLeader as exc:
                problem = f"{exc} {_hint(args)}"
            except grpc.aio.AioRpcError as exc:
                problem = f"{targets.current}: {exc.code().name}: {exc.details()}"
                if exc.code() is not grpc.StatusCode.UNAVAILABLE:
                    print(f"lightrail events: {problem}", file=sys.stderr)
                    return 1
            if not args.follow:
                print(f"lightrail events: {problem}", file=sys.stderr)
                return 1
            print(f"lightrail events: {problem}; retrying in {FOLLOW_RETRY_S:g} s",
                  file=sys.stderr)
            await asyncio.sleep(FOLLOW_RETRY_S)

    try:
        return run_async(main())
    except KeyboardInterrupt:
        return 130


def cmd_alarms(args: argparse.Namespace) -> int:
    targets = _targets(args)
    if targets is None:
        return 2
    request = operator_pb2.ListAlarmsRequest(switch_id=args.switch or "",
                                             include_cleared=args.all)

    async def main() -> int:
        try:
            resp: Any = await operator_call(targets, lambda s: s.ListAlarms(request, timeout=10))
        except NoLeader as exc:
            print(f"lightrail alarms: {exc} {_hint(args)}", file=sys.stderr)
            return 1
        except grpc.aio.AioRpcError as exc:
            print(f"lightrail alarms: {targets.current}: {exc.code().name}: {exc.details()}",
                  file=sys.stderr)
            return 1
        if args.json:
            print(jsonout.dumps(resp))
            return 0
        rows = [[a.switch_id, a.port if a.HasField("port") else "-", a.condition, a.severity,
                 datetime.datetime.fromtimestamp(a.raised_unix_s, datetime.UTC)
                 .strftime("%Y-%m-%d %H:%M:%S"), a.source, "cleared" if a.cleared else "active",
                 a.description or "-"] for a in resp.alarms]
        make_console().print(table(
            "alarms", ["switch", "port", "condition", "severity", "raised (UTC)", "source",
                       "state", "description"], rows,
            caption="active alarms, oldest first" + (", then the recently cleared" if args.all
                                                     else "; --all adds the recently cleared")
            + "; source: driver (the device's own channel) or mqtt (the alarms topic)"))
        return 0

    return run_async(main())


def add_parsers(subcommands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``lightrail events`` and ``lightrail alarms``."""
    c = subcommands.add_parser(
        "events", help="the controller's recent events; --follow streams new ones",
        description="Print the recent job and fabric events the controller keeps (the last "
                    "1,000), oldest first; with --follow keep printing new ones until "
                    "interrupted. Needs no MQTT.")
    c.add_argument("--controller", default=DEFAULT_TARGET, help=CONTROLLER_HELP)
    add_tls_arguments(c)
    c.add_argument("--json", action="store_true",
                   help="one JSON object per event and line (the fields MQTT carries)")
    c.add_argument("--follow", "-f", action="store_true",
                   help="after the recent events, print new ones as they happen")
    c.add_argument("--job", help="only this job's events (job id)")
    c.add_argument("--kind", action="append", metavar="KIND",
                   help="only events of this kind (repeatable): reconfigured, phase_error, "
                        "registered, unregistered, placement_changed, reconfigure_decision, "
                        "failover, device_alarm, leadership, maintenance, config_reload")
    c.set_defaults(func=cmd_events)

    c = subcommands.add_parser("alarms", help="device alarms the controller knows")
    c.add_argument("--controller", default=DEFAULT_TARGET, help=CONTROLLER_HELP)
    add_tls_arguments(c)
    c.add_argument("--json", action="store_true",
                   help="print the controller's answer as JSON instead of a table")
    c.add_argument("--switch", help="only this switch's alarms (switch id)")
    c.add_argument("--all", action="store_true", help="also the recently cleared alarms")
    c.set_defaults(func=cmd_alarms)
