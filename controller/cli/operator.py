"""Operator commands over OperatorService: status, switches, circuits, jobs, gpus, hosts,
failover, drain. Every command takes ``--tls-ca/--tls-cert/--tls-key``; the mutating ones
(failover, drain) also ``--token``/``--token-file`` (``$LIGHTRAIL_TOKEN``), sent as
``authorization: Bearer <token>`` (README "Security")."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import grpc
from google.protobuf.message import Message
from rich.table import Table
from rich.text import Text

from lightrail.agents.leader import LeaderTargets, NoLeader
from lightrail.controller.api.auth import AUTHORIZATION_KEY
from lightrail.controller.cli import jsonout
from lightrail.controller.cli.common import (
    CONTROLLER_HELP,
    DEFAULT_TARGET,
    CliUsageError,
    add_tls_arguments,
    add_token_arguments,
    address_hint,
    client_tls,
    controller_address,
    make_console,
    operator_token,
    run_async,
)
from lightrail.v1 import operator_pb2, operator_pb2_grpc


async def operator_call(
    targets: LeaderTargets, call: Callable[[operator_pb2_grpc.OperatorServiceStub], Any]
) -> Message:
    """``call`` on the leader's OperatorService: one pass over ``targets``, following a
    standby's redirect (``LeaderTargets.call``). Raises ``NoLeader`` listing the addresses
    tried, or the leader's ``grpc.aio.AioRpcError``."""

    async def attempt(address: str) -> Message:
        async with targets.channel(address) as ch:
            result: Message = await call(operator_pb2_grpc.OperatorServiceStub(ch))
            return result

    return await targets.call(attempt)


def token_metadata(args: argparse.Namespace) -> tuple[tuple[str, str], ...]:
    """The call metadata carrying the operator's bearer token (``operator_token``), empty
    without one. Raises ``CliUsageError``."""
    token = operator_token(args)
    return () if token is None else ((AUTHORIZATION_KEY, f"Bearer {token}"),)


Metadata = tuple[tuple[str, str], ...]


def operator_mutation(args: argparse.Namespace, call: Callable[[Any, Metadata], Any],
                      render: Callable[[Any], Table | Text | str],
                      exit_code: Callable[[Any], int] | None = None) -> int:
    """A mutating operator call (failover, drain, reload, ...): ``call(stub, metadata)`` with
    the operator's bearer token (``token_metadata``), then as ``_operator``. A bad
    ``--token``/``--token-file`` is exit 2 naming the command."""
    try:
        md = token_metadata(args)
    except CliUsageError as exc:
        verb = " ".join(v for v in (args.cmd, getattr(args, "jobs_action", None)) if v)
        print(f"lightrail {verb}: {exc}", file=sys.stderr)
        return 2
    return _operator(args, lambda stub: call(stub, md), render, exit_code)


def _operator(args: argparse.Namespace, call: Callable[[Any], Any],
              render: Callable[[Any], Table | Text | str],
              exit_code: Callable[[Any], int] | None = None) -> int:
    try:
        tls = client_tls(args)
    except CliUsageError as exc:
        print(f"lightrail {args.cmd}: {exc}", file=sys.stderr)
        return 2
    try:
        where = controller_address(args.controller)
        targets = LeaderTargets(where.address, tls=tls)
    except CliUsageError as exc:
        print(f"lightrail {args.cmd}: {exc}", file=sys.stderr)
        return 2
    except ValueError as exc:
        print(f"lightrail {args.cmd}: --{exc} {address_hint(where)}", file=sys.stderr)
        return 2

    async def main() -> int:
        try:
            resp = await operator_call(targets, call)
        except NoLeader as exc:
            print(f"lightrail {args.cmd}: {exc} {address_hint(where)}", file=sys.stderr)
            return 1
        except grpc.aio.AioRpcError as exc:
            print(f"lightrail {args.cmd}: {targets.current}: {exc.code().name}: "
                  f"{exc.details()}", file=sys.stderr)
            return 1
        if args.json:
            print(jsonout.dumps(resp))
        else:
            make_console().print(render(resp))
        return 0 if exit_code is None else exit_code(resp)

    return run_async(main())


operator_command = _operator
"""Run one operator call and print its answer (``render``: a table or text; ``--json``: the
reply); the exit code from ``exit_code`` (default 0), 1 on a refused call or no leader, 2 on
bad usage. The public name for the other operator command modules."""


def table(title: str, cols: Sequence[str], rows: Sequence[Sequence[object]],
          caption: str | None = None) -> Table:
    """A rich table of ``rows`` under ``cols``, with ``caption`` (what the columns mean)."""
    t = Table(title=title, caption=caption, caption_justify="left")
    for c in cols:
        t.add_column(c)
    for r in rows:
        t.add_row(*(str(x) for x in r))
    return t


def cmd_status(args: argparse.Namespace) -> int:
    def render(r: operator_pb2.GetStatusResponse) -> Table:
        return table("controller", ["replica", "leader", "fabric", "jobs", "switches",
                                     "not up", "cross-connects", "reconfigurations",
                                     "uptime s"],
                      [[r.replica_id, r.leader, r.fabric, r.jobs, r.switches,
                        ", ".join(r.switches_not_up) or "-", r.cross_connects,
                        r.reconfigurations, f"{r.uptime_s:.0f}"]])
    return _operator(args, lambda s: s.GetStatus(operator_pb2.GetStatusRequest(), timeout=10),
                     render)


def cmd_switches(args: argparse.Namespace) -> int:
    def render(r: operator_pb2.ListSwitchesResponse) -> Table:
        now = time.time()
        return table("switches", ["switch", "model", "kind", "ports", "rail", "delay ms",
                                   "state", "cross-connects", "reconfigurations",
                                   "last contact s ago", "last error", "maintenance"],
                      [[s.switch_id, s.model, s.kind, s.port_count,
                        s.rail if s.has_rail else "-", f"{s.reconfiguration_delay_s * 1e3:g}",
                        _state_text(s),
                        s.cross_connects if s.HasField("cross_connects") else "unknown",
                        s.reconfigurations,
                        f"{now - s.last_contact_unix_s:.0f}"
                        if s.HasField("last_contact_unix_s") else "-",
                        s.last_error or "-",
                        f"yes: {s.maintenance_reason}" if s.maintenance else "-"]
                       for s in r.switches],
                      caption="state: up; unreachable (phases that need it are refused after "
                              "controller.device_wait_s; its confirmed circuits still carry "
                              "traffic); degraded (its last command failed, or ports await a "
                              "read-back); maintenance. cross-connects: unknown while the "
                              "controller cannot tell")
    return _operator(args, lambda s: s.ListSwitches(operator_pb2.ListSwitchesRequest(),
                                                    timeout=10), render)


def _state_text(s: operator_pb2.SwitchInfo) -> str:
    if s.HasField("unreachable_for_s"):
        return f"{s.state} for {s.unreachable_for_s:.0f} s"
    return s.state or "-"


def cmd_circuits(args: argparse.Namespace) -> int:
    def render(r: operator_pb2.ListCircuitsResponse) -> Table:
        return table("cross-connects", ["switch", "ingress", "egress", "from", "to", "job"],
                      [[c.switch_id, c.ingress, c.egress, c.from_endpoint or "-",
                        c.to_endpoint or "-", c.job_id or "-"] for c in r.cross_connects])
    req = operator_pb2.ListCircuitsRequest(switch_id=args.switch or "", job_id=args.job or "")
    return _operator(args, lambda s: s.ListCircuits(req, timeout=10), render)


def cmd_jobs(args: argparse.Namespace) -> int:
    if args.jobs_action == "unregister":
        return _cmd_jobs_unregister(args)

    def render(r: operator_pb2.ListJobsResponse) -> Table:
        return table(
            "jobs", ["job", "tenant", "ranks", "hosts", "rank admissions", "reconfigurations",
                     "schedule", "ahead", "late", "on demand", "last phase", "idle s"],
            [[j.job_id, j.tenant, j.world_size, len(j.hosts), j.phases_admitted,
              j.reconfigurations, "learned" if j.schedule_learned else "learning",
              j.provisioning_hits, j.provisioning_late, j.provisioning_misses,
              j.current_phase or "-", f"{j.idle_s:.0f}" if j.HasField("idle_s") else "-"]
             for j in r.jobs],
            caption="rank admissions: ranks admitted into phases; reconfigurations: applies "
                    "that changed the job's cross-connects; schedule: whether provisioning "
                    "has learned (or was declared) the job's order of phases; ahead / late / "
                    "on demand: phases needing new circuits that found them switched ahead "
                    "and ready / still switching / switched when their ranks came; idle s: "
                    "seconds with no phase stream, waiting call or watch (- while it has "
                    "one); at controller.job_idle_expiry_s the job is unregistered")
    return _operator(args, lambda s: s.ListJobs(operator_pb2.ListJobsRequest(), timeout=10),
                     render)


def _cmd_jobs_unregister(args: argparse.Namespace) -> int:
    req = operator_pb2.RemoveJobRequest(job_id=args.job_id, reason=args.reason)
    return operator_mutation(args, lambda s, md: s.RemoveJob(req, timeout=30, metadata=md),
                     lambda r: f"job {r.job_id} unregistered")


def cmd_gpus(args: argparse.Namespace) -> int:
    if args.clear:
        return _cmd_gpus_clear(args)

    def render(r: operator_pb2.ListGpusResponse) -> Table:
        return table("GPUs", ["host", "gpu", "domain", "spare host", "health", "reason",
                               "job", "rank", "heartbeat age s"],
                      [[g.host, g.gpu, g.failure_domain, g.spare_host, g.state, g.reason or "-",
                        g.job_id or "-", g.rank if g.has_rank else "-",
                        f"{g.heartbeat_age_s:.1f}" if g.HasField("heartbeat_age_s") else "-"]
                       for g in r.gpus])
    return _operator(args, lambda s: s.ListGpus(operator_pb2.ListGpusRequest(), timeout=10),
                     render)


def _cmd_gpus_clear(args: argparse.Namespace) -> int:
    """``lightrail gpus --clear HOST[:GPU]``: forget failed/degraded records (operator)."""
    host, sep, gpu = args.clear.rpartition(":")
    if not sep:
        host, gpu = args.clear, ""
    if not host or (gpu and not gpu.isdecimal()):
        print(f"lightrail gpus: --clear: expected HOST or HOST:GPU, got {args.clear!r}",
              file=sys.stderr)
        return 2
    req = operator_pb2.ClearGpuRequest(host=host, gpu=int(gpu) if gpu else None)

    def render(r: operator_pb2.ClearGpuResponse) -> Table:
        return table(f"cleared {args.clear}", ["host", "gpu", "health", "reason"],
                     [[g.host, g.gpu, g.state, g.reason or "-"] for g in r.gpus],
                     caption="a cleared GPU is unknown until its agent reports it")
    return operator_mutation(args, lambda s, md: s.ClearGpu(req, timeout=30, metadata=md), render)


def _timeline_table(title: str, fos: Sequence[operator_pb2.FailoverResponse]) -> Table:
    return table(title, ["job", "rank", "from", "to", "planned ms", "confirmed ms",
                          "notified ms"],
                  [[f.job_id, f.rank, f"{f.from_host}/gpu{f.from_gpu}",
                    f"{f.to_host}/gpu{f.to_gpu}", f"{f.planned_s * 1e3:.1f}",
                    f"{f.device_confirmed_s * 1e3:.1f}", f"{f.job_notified_s * 1e3:.1f}"]
                   for f in fos])


def cmd_failover(args: argparse.Namespace) -> int:
    spare_host, spare_gpu = "", 0
    if args.to:
        host, _, gpu = args.to.rpartition(":")
        if not host or not gpu.isdecimal():
            print(f"lightrail failover: --to: expected HOST:GPU, got {args.to!r}",
                  file=sys.stderr)
            return 2
        spare_host, spare_gpu = host, int(gpu)
    req = operator_pb2.FailoverRequest(job_id=args.job, rank=args.rank, spare_host=spare_host,
                                       spare_gpu=spare_gpu, reason=args.reason)
    return operator_mutation(args, lambda s, md: s.Failover(req, timeout=60, metadata=md),
                     lambda r: _timeline_table("failover", [r]))


def cmd_drain(args: argparse.Namespace) -> int:
    if args.undo:
        return cmd_uncordon(args)
    req = operator_pb2.DrainRequest(host=args.host, reason=args.reason)
    return operator_mutation(args, lambda s, md: s.Drain(req, timeout=120, metadata=md),
                     lambda r: _timeline_table(f"drained {args.host}", list(r.failovers)))


def cmd_uncordon(args: argparse.Namespace) -> int:
    """``lightrail uncordon HOST`` (``drain --undo HOST``): the drained host's GPUs return to
    service, unknown until its agent reports (a spare host is a spare again)."""
    req = operator_pb2.UndrainRequest(host=args.host)
    return operator_mutation(args, lambda s, md: s.Undrain(req, timeout=30, metadata=md),
                     lambda r: f"{r.host}: GPUs {', '.join(map(str, r.gpus))} back in service "
                               "(unknown until its agent reports)")


def cmd_leader(args: argparse.Namespace) -> int:
    """``lightrail leader``: the election as the replica at ``--controller`` sees it (the
    first that answers; every replica answers for itself)."""
    def render(r: operator_pb2.GetLeaderResponse) -> Table:
        return table("leader", ["leader", "address", "leading for s", "answered by",
                                "transitions seen"],
                     [[r.leader_id or "(none)", r.address or "-",
                       f"{r.leading_for_s:.0f}" if r.HasField("leading_for_s") else "-",
                       r.replica_id, r.transitions]],
                     caption="transitions seen: leader changes this replica observed since "
                             "it started; leading for: since this replica saw it take over")
    return _operator(args, lambda s: s.GetLeader(operator_pb2.GetLeaderRequest(), timeout=10),
                     render)


def cmd_hosts(args: argparse.Namespace) -> int:
    def render(r: operator_pb2.ListHostsResponse) -> Table:
        return table("hosts", ["host", "failure domain", "gpus", "spare"],
                      [[h.name, h.failure_domain, h.gpus, h.spare] for h in r.hosts])
    return _operator(args, lambda s: s.ListHosts(operator_pb2.ListHostsRequest(), timeout=10),
                     render)


def cmd_reload(args: argparse.Namespace) -> int:
    """``lightrail reload``: the replica at ``--controller`` (the first that answers; each
    replica answers for itself, none redirects) reads its config file again. Exit 0 when
    applied, 1 when refused (the running configuration kept; the error names the field)."""
    def render(r: operator_pb2.ReloadResponse) -> str:
        if r.applied:
            return (f"applied: {r.path}: changed {', '.join(r.changed)}" if r.changed
                    else f"applied: {r.path}: nothing changed")
        return f"not applied, running configuration kept: {r.error}"
    return operator_mutation(args, lambda s, md: s.Reload(operator_pb2.ReloadRequest(),
                                                          timeout=30, metadata=md),
                     render, lambda r: 0 if r.applied else 1)


JSON_HELP = "print the controller's answer as JSON instead of a table"


def _add_jobs_actions(jobs: argparse.ArgumentParser) -> None:
    """``lightrail jobs`` lists; ``lightrail jobs unregister JOB`` removes one (operator)."""
    actions = jobs.add_subparsers(dest="jobs_action", metavar="{unregister}",
                                  help="without an action: list the jobs")
    u = actions.add_parser(
        "unregister", help="unregister a job now, e.g. one whose clients are gone (its holds "
                           "are released, its circuits stay; operator)")
    u.add_argument("job_id", help="the job's id")
    u.add_argument("--reason", default="",
                   help="why, for its UNREGISTERED event (default: unregistered by operator "
                        "NAME)")
    u.add_argument("--controller", default=DEFAULT_TARGET, help=CONTROLLER_HELP)
    add_tls_arguments(u)
    add_token_arguments(u)
    u.add_argument("--json", action="store_true", help=JSON_HELP)


def add_parsers(subcommands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register the operator commands: ``status``, ``switches``, ``circuits``, ``jobs``,
    ``hosts``, ``gpus`` (read-only listings), ``failover`` and ``drain``."""
    for name, func, doc in (
        ("status", cmd_status, "controller status"),
        ("switches", cmd_switches, "switches and their cross-connect counts"),
        ("circuits", cmd_circuits, "confirmed cross-connects"),
        ("jobs", cmd_jobs, "registered jobs"),
        ("hosts", cmd_hosts, "hosts of the fabric"),
        ("gpus", cmd_gpus, "GPU health and which job rank runs where"),
    ):
        c = subcommands.add_parser(name, help=doc)
        c.add_argument("--controller", default=DEFAULT_TARGET, help=CONTROLLER_HELP)
        add_tls_arguments(c)
        c.add_argument("--json", action="store_true", help=JSON_HELP)
        if name == "circuits":
            c.add_argument("--switch", help="only this switch's cross-connects (switch id)")
            c.add_argument("--job", help="only the cross-connects of this job (job id)")
        if name == "jobs":
            _add_jobs_actions(c)
        if name == "gpus":
            c.add_argument("--clear", metavar="HOST[:GPU]", default="",
                           help="forget the failed/degraded state of a host's GPUs (or one "
                                "GPU), e.g. after a repair (operator)")
            add_token_arguments(c)
        c.set_defaults(func=func)
    _add_leader_parser(subcommands)

    c = subcommands.add_parser("failover", help="move a job rank to a spare GPU now")
    c.add_argument("--controller", default=DEFAULT_TARGET, help=CONTROLLER_HELP)
    add_tls_arguments(c)
    add_token_arguments(c)
    c.add_argument("--json", action="store_true", help=JSON_HELP)
    c.add_argument("--job", required=True, help="job id")
    c.add_argument("--rank", required=True, type=int, help="rank to move")
    c.add_argument("--to", default="", help="spare as HOST:GPU (default: the controller picks "
                                             "a healthy one in the same failure domain and "
                                             "on the same switch)")
    c.add_argument("--reason", default="manual failover",
                   help="why, for the event and the log (default: manual failover)")
    c.set_defaults(func=cmd_failover)

    c = subcommands.add_parser("reload", help="reload a replica's config file (as SIGHUP does)")
    c.add_argument("--controller", default=DEFAULT_TARGET, help=CONTROLLER_HELP + "; the first "
                   "replica that answers reloads its own file")
    add_tls_arguments(c)
    add_token_arguments(c)
    c.add_argument("--json", action="store_true", help=JSON_HELP)
    c.set_defaults(func=cmd_reload)

    c = subcommands.add_parser("drain", help="take a host out of service (its ranks fail over)")
    c.add_argument("host", help="the host's inventory name")
    c.add_argument("--controller", default=DEFAULT_TARGET, help=CONTROLLER_HELP)
    add_tls_arguments(c)
    add_token_arguments(c)
    c.add_argument("--json", action="store_true", help=JSON_HELP)
    c.add_argument("--reason", default="operator drain",
                   help="why, for the event and the log (default: operator drain)")
    c.add_argument("--undo", action="store_true",
                   help="return the drained host to service instead (as uncordon)")
    c.set_defaults(func=cmd_drain)
    _add_uncordon_parser(subcommands)


def _add_leader_parser(subcommands: argparse._SubParsersAction[argparse.ArgumentParser]
                       ) -> None:
    c = subcommands.add_parser("leader", help="which replica leads, as the answering replica "
                                              "sees it")
    c.add_argument("--controller", default=DEFAULT_TARGET, help=CONTROLLER_HELP + "; the "
                   "first replica that answers reports its own view")
    add_tls_arguments(c)
    c.add_argument("--json", action="store_true", help=JSON_HELP)
    c.set_defaults(func=cmd_leader)


def _add_uncordon_parser(subcommands: argparse._SubParsersAction[argparse.ArgumentParser]
                         ) -> None:
    c = subcommands.add_parser("uncordon", help="return a drained host to service (drain "
                                                "--undo)")
    c.add_argument("host", help="the host's inventory name")
    c.add_argument("--controller", default=DEFAULT_TARGET, help=CONTROLLER_HELP)
    add_tls_arguments(c)
    add_token_arguments(c)
    c.add_argument("--json", action="store_true", help=JSON_HELP)
    c.set_defaults(func=cmd_uncordon)
