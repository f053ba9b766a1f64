"""The daemon's gRPC environment (``lightrail.controller.cli.GRPC_ENVIRONMENT``): what it sets,
that a caller's own value wins, and that with it a ``grpc.aio`` server and client really run
off EventEngine's thread pool (a grpcio that drops the iomgr endpoints fails here, not silently
in the benchmarks).

The last test runs a real server and client over loopback in a fresh interpreter (the variables
take effect only before ``grpc`` is imported) and counts the context switches of gRPC's
``event_engine`` threads (``/proc/self/task/*/status``) over 300 unary calls: on EventEngine a
server's read and write each pass through them (thousands here), with this environment they
idle (tens). The reference run has only the server on EventEngine (its client on iomgr), so
that the threads it counts are the server's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from lightrail.controller.cli import GRPC_ENVIRONMENT, grpc_environment

CALLS = 300

_PROBE = textwrap.dedent("""
    import asyncio, json, os, sys
    import grpc

    def event_engine_switches():
        n = 0
        for tid in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{tid}/comm") as f:
                    if f.read().strip() != "event_engine":
                        continue
                with open(f"/proc/self/task/{tid}/status") as f:
                    n += sum(int(line.split()[1]) for line in f if "ctxt_switches" in line)
            except FileNotFoundError:  # a thread that ended meanwhile
                pass
        return n

    async def main():
        server = grpc.aio.server()
        echo = grpc.unary_unary_rpc_method_handler(lambda request, context: request)
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("probe.Echo", {"Call": echo}),))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = channel.unary_unary("/probe.Echo/Call")
            await call(b"x")  # connected and warm
            before = event_engine_switches()
            for _ in range(int(sys.argv[1])):
                await call(b"x")
            after = event_engine_switches()
        await server.stop(0)
        print(json.dumps({"switches": after - before,
                          "experiments": os.environ.get("GRPC_EXPERIMENTS")}))

    asyncio.run(main())
""")


def _probe(experiments: str) -> dict[str, object]:
    env = dict(os.environ, GRPC_EXPERIMENTS=experiments)
    out = subprocess.run([sys.executable, "-c", _PROBE, str(CALLS)], env=env, check=True,
                         capture_output=True, text=True, timeout=60)
    result: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def test_environment_names_the_iomgr_server_and_no_fork_handlers() -> None:
    env = grpc_environment({})
    assert env == GRPC_ENVIRONMENT
    assert env["GRPC_ENABLE_FORK_SUPPORT"] == "false"
    assert set(env["GRPC_EXPERIMENTS"].split(",")) == {
        "-event_engine_listener", "-event_engine_for_all_other_endpoints", "-event_engine_client"}


def test_a_callers_own_value_wins_whole() -> None:
    env = grpc_environment({"GRPC_EXPERIMENTS": "", "PATH": "/bin"})
    assert env["GRPC_EXPERIMENTS"] == ""  # empty: gRPC's own defaults
    assert env["GRPC_ENABLE_FORK_SUPPORT"] == "false"
    assert "PATH" not in env  # only gRPC's variables


def test_importing_the_cli_sets_it_for_the_daemon() -> None:
    env = {k: v for k, v in os.environ.items() if k not in GRPC_ENVIRONMENT}
    code = ("import os, sys; import lightrail.controller.cli.main; "
            "print(os.environ['GRPC_EXPERIMENTS'], 'grpc' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], env=env, check=True,
                         capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == [GRPC_ENVIRONMENT["GRPC_EXPERIMENTS"], "True"]


def test_with_it_grpc_does_not_pass_through_event_engine_threads() -> None:
    ours = GRPC_ENVIRONMENT["GRPC_EXPERIMENTS"]
    off = _probe(ours)
    on = _probe("-event_engine_client")  # the same client, the server on EventEngine
    assert off["experiments"] == ours
    switches_off, switches_on = off["switches"], on["switches"]
    assert isinstance(switches_off, int) and isinstance(switches_on, int)
    assert switches_on >= CALLS, f"EventEngine server: only {switches_on} switches"
    assert switches_off < CALLS, (
        f"{switches_off} context switches of event_engine threads over {CALLS} calls with "
        f"GRPC_EXPERIMENTS={ours!r} (against {switches_on} with the server on EventEngine): "
        "server or client still runs on EventEngine (has this grpcio dropped the iomgr "
        "endpoints?)")
