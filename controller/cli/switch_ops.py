"""Operator commands about switches: ``maintenance on|off SWITCH``, ``ports [--switch S]`` and
``switch show S [--dot]`` (README "Operating the fabric"). Like the other operator commands
(``lightrail.controller.cli.operator``) they ask the leader, print a table or ``--json``."""

from __future__ import annotations

import argparse
import json

from rich.table import Table
from rich.text import Text

from lightrail.controller.cli import jsonout
from lightrail.controller.cli.common import (
    CONTROLLER_HELP,
    DEFAULT_TARGET,
    add_tls_arguments,
    add_token_arguments,
)
from lightrail.controller.cli.operator import JSON_HELP, operator_command, operator_mutation, table
from lightrail.controller.cli.switchview import Link, PortLabel, SwitchDrawing, dot, text_matrix
from lightrail.v1 import operator_pb2, operator_pb2_grpc


def cmd_maintenance(args: argparse.Namespace) -> int:
    """``lightrail maintenance on|off SWITCH``: exit 0 once the controller stored it."""
    req = operator_pb2.SetMaintenanceRequest(switch_id=args.switch_id, on=args.state == "on",
                                             reason=args.reason)

    def render(r: operator_pb2.SetMaintenanceResponse) -> str:
        if r.maintenance:
            return (f"{r.switch_id}: in maintenance ({args.reason or 'operator'}); it is sent "
                    "no reconfiguration, phases that need one there are refused")
        return f"{r.switch_id}: in service"
    return operator_mutation(args, lambda s, md: s.SetMaintenance(req, timeout=30,
                                                                     metadata=md),
                            render)


def _power(p: operator_pb2.PortInfo) -> str:
    return f"{p.power_dbm:.2f}" if p.HasField("power_dbm") else "-"


def cmd_ports(args: argparse.Namespace) -> int:
    """``lightrail ports``: every port's states and optical power, read from the devices."""
    def render(r: operator_pb2.ListPortsResponse) -> Table:
        return table(
            "ports", ["switch", "port", "admin", "oper", "power dBm", "connected to",
                      "endpoint", "job"],
            [[p.switch_id, p.port, p.admin_state or "-", p.oper_state or "-", _power(p),
              p.connected_to if p.HasField("connected_to") else "-", p.endpoint or "-",
              p.job_id or "-"] for p in r.ports],
            caption="admin, oper and power as the device reports them (- : it does not "
                    "report it); connected to: the port of the confirmed cross-connect")
    req = operator_pb2.ListPortsRequest(switch_id=args.switch or "")
    return operator_command(args, lambda s: s.ListPorts(req, timeout=30), render)


def drawing(switch: operator_pb2.SwitchInfo,
            circuits: operator_pb2.ListCircuitsResponse) -> SwitchDrawing:
    """The picture of ``switch`` from ``ListSwitches`` and ``ListCircuits`` answers."""
    links: list[Link] = []
    labels: dict[int, str] = {}
    for c in circuits.cross_connects:
        if c.switch_id != switch.switch_id:
            continue
        links.append(Link(c.ingress, c.egress, c.job_id or None))
        if c.from_endpoint:
            labels[c.ingress] = c.from_endpoint
        if c.to_endpoint:
            labels[c.egress] = c.to_endpoint
    return SwitchDrawing(switch.switch_id, switch.kind, switch.port_count, links,
                         [PortLabel(p, e) for p, e in sorted(labels.items())])


def cmd_switch_show(args: argparse.Namespace) -> int:
    """``lightrail switch show S``: the cross-connects of one switch as a matrix (``--dot``:
    Graphviz DOT; ``--json``: the switch and its cross-connects). An unknown switch is the
    controller's NOT_FOUND naming it (exit 1)."""
    found: list[operator_pb2.SwitchInfo] = []

    async def call(stub: operator_pb2_grpc.OperatorServiceAsyncStub
                   ) -> operator_pb2.ListCircuitsResponse:
        circuits = await stub.ListCircuits(
            operator_pb2.ListCircuitsRequest(switch_id=args.switch_id), timeout=10)
        switches = await stub.ListSwitches(operator_pb2.ListSwitchesRequest(), timeout=10)
        found[:] = [s for s in switches.switches if s.switch_id == args.switch_id]
        return circuits

    def render(r: operator_pb2.ListCircuitsResponse) -> Text:
        if not found:  # gone between the two calls (a reload)
            return Text(f"switch {args.switch_id!r} is no longer in the fabric")
        if args.json:
            text = json.dumps({"switch": jsonout.to_plain(found[0]),
                               "cross_connects": [jsonout.to_plain(c)
                                                  for c in r.cross_connects]}, indent=2)
        else:
            picture = drawing(found[0], r)
            text = dot(picture).rstrip("\n") if args.dot else text_matrix(picture)
        return Text(text, no_wrap=True, overflow="ignore")

    # --json is rendered here (the switch and its cross-connects together), not as one reply
    plain = argparse.Namespace(**{**vars(args), "json": False})
    return operator_command(plain, call, render, lambda r: 0 if found else 1)


def add_parsers(subcommands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``maintenance``, ``ports`` and ``switch show``."""
    c = subcommands.add_parser(
        "maintenance", help="put a switch in maintenance (no reconfiguration of it; phases "
                            "that need one there get an explicit error) or back in service")
    c.add_argument("state", choices=["on", "off"], help="on: in maintenance; off: in service")
    c.add_argument("switch_id", metavar="SWITCH", help="the switch's id (lightrail switches)")
    c.add_argument("--reason", default="",
                   help="why, shown by lightrail switches and in the MAINTENANCE event "
                        "(default: operator)")
    c.add_argument("--controller", default=DEFAULT_TARGET, help=CONTROLLER_HELP)
    add_tls_arguments(c)
    add_token_arguments(c)
    c.add_argument("--json", action="store_true", help=JSON_HELP)
    c.set_defaults(func=cmd_maintenance)

    c = subcommands.add_parser(
        "ports", help="every port: admin and oper state, optical power (dBm), cross-connect, "
                      "endpoint and job")
    c.add_argument("--switch", help="only this switch's ports (switch id)")
    c.add_argument("--controller", default=DEFAULT_TARGET, help=CONTROLLER_HELP)
    add_tls_arguments(c)
    c.add_argument("--json", action="store_true", help=JSON_HELP)
    c.set_defaults(func=cmd_ports)

    c = subcommands.add_parser("switch", help="one switch: lightrail switch show SWITCH")
    actions = c.add_subparsers(dest="switch_action", metavar="{show}", required=True,
                               help="what to do with the switch")
    s = actions.add_parser(
        "show", help="draw the switch's cross-connects: ingress x egress matrix (N x N) or "
                     "port x port (duplex); switches of 128+ ports show only ports in use")
    s.add_argument("switch_id", metavar="SWITCH", help="the switch's id (lightrail switches)")
    s.add_argument("--dot", action="store_true",
                   help="print Graphviz DOT instead (lightrail switch show S --dot | dot -Tsvg)")
    s.add_argument("--controller", default=DEFAULT_TARGET, help=CONTROLLER_HELP)
    add_tls_arguments(s)
    s.add_argument("--json", action="store_true",
                   help="print the switch and its cross-connects as JSON")
    s.set_defaults(func=cmd_switch_show)
