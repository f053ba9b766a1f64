"""``lightrail emulate``: a fabric's switches as emulated devices in their own process.

Every switch of the fabric is served on its own TCP port in the protocol of its driver model
(``lightrail.emulator.servers.fabric.serve_switches``: TL1, RESTCONF or the SiPh mesh's DAC
protocol; ``model: emulated`` switches speak ``--protocol``), with the fault-control API
(``lightrail.emulator.control``) over all of them. A controller reaches them as it reaches
hardware, through its drivers and a config that points at their addresses, and they outlive
the controller: kill it, start another, and the new one reads back what the devices hold.

Once serving, the command prints one JSON line to stdout::

    {"control": "http://127.0.0.1:PORT", "protocol": "tl1",
     "switches": {"<id>": {"model": "tl1", "host": "127.0.0.1", "port": PORT}, ...},
     "fabric": {<the fabric section pointing at the served devices>}}

and a table of the addresses to stderr; ``--write-config PATH`` writes a controller config (the
input config's other sections kept) whose fabric points at them. It runs until SIGTERM or
SIGINT. Exit codes: 0 after a signal, 2 for an invalid fabric or option, 1 when a port cannot
be bound.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from pathlib import Path
from typing import Any

import structlog
import yaml

from lightrail.controller.cli.common import delay_ms, non_negative_int, run_async
from lightrail.controller.config import ConfigError, FabricSection, build_fabric, parse_config
from lightrail.controller.logs import configure_logging

_log = structlog.get_logger(__name__)

BUILTIN_NAMES = ("demo-4x2", "rail-16x8")


class FabricSourceError(ValueError):
    """``--fabric`` names neither a built-in fabric nor a valid file; the message says which
    and why."""


def load_fabric_source(source: str, *, delay_ms: float | None, spares: int
                       ) -> tuple[FabricSection, dict[str, Any]]:
    """The fabric section ``--fabric`` names and the rest of the config document it came from.

    ``source`` is a built-in name (``demo-4x2``, ``rail-16x8``: generated with ``spares`` spare
    hosts and ``delay_ms`` reconfiguration delay, default 10 ms) or a YAML file: a controller
    config (its ``fabric:`` section; the other sections are returned to be written back) or a
    bare fabric section. ``delay_ms`` given with a file is refused (the file states its delays).
    Raises ``FabricSourceError`` naming the source, the field and the value."""
    from lightrail.emulator.servers.fabric import rail_section

    path = Path(source)
    if source in BUILTIN_NAMES and not path.exists():
        section = rail_section(source, spares=spares,
                               delay_ms=10.0 if delay_ms is None else delay_ms)
        return section, {}
    if not path.is_file():
        raise FabricSourceError(
            f"--fabric: {source!r} is neither a built-in fabric ({', '.join(BUILTIN_NAMES)}) "
            "nor a readable file")
    if delay_ms is not None or spares:
        raise FabricSourceError(
            f"--fabric {source}: --delay-ms and --spares apply to built-in fabrics only; the "
            "file states its own")
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise FabricSourceError(f"--fabric {source}: cannot read: {e}") from None
    if not isinstance(doc, dict):
        raise FabricSourceError(
            f"--fabric {source}: expected a mapping (a controller config or a fabric section), "
            f"got {type(doc).__name__}")
    if "fabric" in doc:  # a controller config
        rest: dict[str, Any] = {k: v for k, v in doc.items() if k != "fabric"}
        fabric_doc = doc["fabric"]
    else:  # a bare fabric section
        rest, fabric_doc = {}, doc
    try:
        cfg = parse_config({**rest, "fabric": fabric_doc}, source)
    except ConfigError as e:
        raise FabricSourceError(str(e)) from None
    return cfg.fabric, rest


def _account(text: str) -> tuple[str, str]:
    """argparse type of ``--account USER:PASSWORD``."""
    user, sep, password = text.partition(":")
    if not sep or not user or not password:
        raise argparse.ArgumentTypeError("expected USER:PASSWORD, both non-empty")
    return user, password


def cmd_emulate(args: argparse.Namespace) -> int:
    configure_logging(args.log_level, "console")
    try:
        section, rest = load_fabric_source(args.fabric, delay_ms=args.delay_ms,
                                           spares=args.spares)
    except FabricSourceError as e:
        print(f"lightrail emulate: {e}", file=sys.stderr)
        return 2
    return run_async(_serve(args, section, rest))


async def _serve(args: argparse.Namespace, section: FabricSection, rest: dict[str, Any]) -> int:
    from lightrail.emulator.control import ControlServer
    from lightrail.emulator.ocs import EmulatedFabricDevices
    from lightrail.emulator.servers.fabric import serve_switches, served_section

    if args.listen not in ("127.0.0.1", "localhost", "::1"):
        _log.warning("emulated devices listen beyond loopback, without TLS and with the "
                     "emulator's built-in account", listen=args.listen)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    fabric = build_fabric(section)
    devices = EmulatedFabricDevices()
    try:
        async with serve_switches(fabric, devices, protocol=args.protocol, host=args.listen,
                                  accounts=dict(args.account)) as served, \
                ControlServer(devices, host=args.listen, port=args.control_port,
                              command_logs={sid: s.commands for sid, s in served.items()
                                            if s.commands is not None}) as control:
            out = served_section(section, served)
            fabric_doc = out.model_dump(mode="json", exclude_defaults=True)
            if args.write_config:  # before serving is announced; a small local file
                try:
                    Path(args.write_config).write_text(  # noqa: ASYNC240
                        yaml.safe_dump({**rest, "fabric": fabric_doc}, sort_keys=False),
                        encoding="utf-8")
                except OSError as e:
                    print(f"lightrail emulate: --write-config {args.write_config}: cannot "
                          f"write: {e.strerror or e}", file=sys.stderr)
                    return 2
            print(json.dumps({
                "control": control.url, "protocol": args.protocol,
                "switches": {sid: {"model": s.model, "host": s.host, "port": s.port}
                             for sid, s in served.items()},
                "fabric": fabric_doc,
            }), flush=True)
            lines = [f"  {sid:<16} {s.model:<9} {s.host}:{s.port}" for sid, s in served.items()]
            print(f"lightrail emulate: fabric {fabric.name!r}, {len(served)} switches "
                  f"(control API {control.url}):\n" + "\n".join(lines)
                  + (f"\n  controller config written to {args.write_config}"
                     if args.write_config else ""), file=sys.stderr, flush=True)
            await stop.wait()
    except ValueError as e:  # a model no emulator speaks, SiPh options that do not validate
        print(f"lightrail emulate: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"lightrail emulate: cannot listen on {args.listen}: {e.strerror or e}",
              file=sys.stderr)
        return 1
    return 0


def add_parsers(subcommands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``lightrail emulate``."""
    c = subcommands.add_parser(
        "emulate", help="serve a fabric's switches as emulated devices (TL1, RESTCONF, SiPh) "
                        "in their own process")
    c.add_argument("--fabric", default="demo-4x2",
                   help="a built-in fabric (demo-4x2, rail-16x8) or a YAML file: a controller "
                        "config or a fabric section (default demo-4x2)")
    c.add_argument("--protocol", choices=["tl1", "restconf"], default="tl1",
                   help="protocol of switches whose model is 'emulated' (default tl1); tl1, "
                        "restconf and siph switches speak their own")
    c.add_argument("--listen", default="127.0.0.1",
                   help="address the devices and the control API listen on (default 127.0.0.1)")
    c.add_argument("--control-port", type=int, default=0,
                   help="TCP port of the fault-control API (default: any free port)")
    c.add_argument("--delay-ms", type=delay_ms, default=None,
                   help="reconfiguration delay of a built-in fabric's switches (default 10)")
    c.add_argument("--spares", type=non_negative_int, default=0,
                   help="spare hosts added to a built-in fabric (default 0)")
    c.add_argument("--account", type=_account, action="append", default=[],
                   metavar="USER:PASSWORD",
                   help="an extra login the TL1 devices accept (repeatable; e.g. one per "
                        "controller replica, so each device's command log names the sender)")
    c.add_argument("--write-config", default=None, metavar="PATH",
                   help="write a controller config whose fabric points at the served devices")
    c.add_argument("--log-level", default="warning",
                   choices=["debug", "info", "warning", "error"],
                   help="log level (default warning)")
    c.set_defaults(func=cmd_emulate)
