"""The ``lightrail`` process-group backend of torch.distributed: the real backend (gloo for CPU
tensors, NCCL for CUDA tensors), every collective and point-to-point call first through the
rank's gate (``lightrail.agents.torch.gate.RankGate``).

Registered with ``torch.distributed.Backend.register_backend("lightrail", ..., extended_api=True,
devices=["cpu", "cuda"])``; a job opts in with ``init_process_group("cpu:lightrail")`` (or
``"cpu:lightrail,cuda:lightrail"``), or with ``LIGHTRAIL_GATE=1`` and its usual backend string.
Sub-groups (``new_group``, ``DeviceMesh``) get the same backend and are gated with their global
ranks (``_DistributedBackendOptions.global_ranks_in_group``). The backend never creates groups
itself (creating one eagerly on non-members hangs: pytorch issue 134314).

The returned object is a ``torch.distributed.ProcessGroup`` subclass (torch 2.13's way for a
Python backend: the creator's result replaces the group). It also registers the real backends
on itself, so calls it does not override (coalescing, ``monitored_barrier``) reach the real
backend directly, ungated. Phase kinds: all_reduce (allreduce, reduce, barrier), all_gather
(allgather*, gather), reduce_scatter (reduce_scatter*), all_to_all (alltoall*; gated as the
controller's first permutation: one torch call cannot be stepped), broadcast (broadcast,
scatter), send_recv (send, recv; the phase's group is the pair of global ranks).
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import grpc
import torch
import torch.distributed as dist
from torch._C._distributed_c10d import PrefixStore, ProcessGroup, ProcessGroupGloo, Store

from lightrail.agents.client import BlockingPhaseClient, ControllerClient, JobRegistrationError
from lightrail.agents.errors import PhaseError
from lightrail.agents.nccl.client import FramePhaseClient
from lightrail.agents.torch import config as gate_config
from lightrail.agents.torch.gate import (
    GateLoop,
    GateTransport,
    LoopTransport,
    RankGate,
    phase_key,
    placements_of,
)
from lightrail.controller.domain.events import JobEventKind
from lightrail.controller.domain.model import Collective, PhaseKey
from lightrail.controller.domain.model import ProcessGroup as RankGroup

log = logging.getLogger(__name__)

BACKEND = "lightrail"
_KEY_PREFIX = "lightrail/"
_REGISTERED = "registered"
_STORE_TIMEOUT = datetime.timedelta(seconds=120)

_state_lock = threading.Lock()
_gate: RankGate | None = None
_close_hooks: list[Callable[[], None]] = []


def current_gate() -> RankGate | None:
    """The gate of this process, once the default group was made with the lightrail backend."""
    return _gate


def _nbytes(tensors: Sequence[Any]) -> int:
    total = 0
    for t in tensors:
        if isinstance(t, torch.Tensor):
            total += t.numel() * t.element_size()
        elif isinstance(t, (list, tuple)):
            total += _nbytes(t)
    return total


def _listed(tensors: Any) -> Sequence[Any]:
    return tensors if isinstance(tensors, (list, tuple)) else (tensors,)


def _on_done(work: Any, callback: Callable[[], None]) -> None:
    work.get_future().add_done_callback(lambda _fut: callback())


def _wait(work: Any) -> None:
    # Never wait twice: a second wait() on a completed gloo send/recv blocks for good.
    if not work.is_completed():
        work.wait()


def _on_gpu(tensors: Sequence[Any]) -> bool:
    for t in tensors:
        if isinstance(t, torch.Tensor):
            if t.is_cuda:
                return True
        elif isinstance(t, (list, tuple)) and _on_gpu(t):
            return True
    return False


def _no_completion_future(work: Any, callback: Callable[[], None]) -> None:
    """NCCL: a work's future completes when the kernel is enqueued, not when the GPU is done
    with the circuits, so it cannot release a run; the run is released at the next call
    elsewhere, after ``_wait_gpu``."""
    raise NotImplementedError("NCCL works complete on the GPU stream")


def _wait_gpu(work: Any) -> None:
    """Block the CPU until the GPU finished ``work`` (``wait()`` would only order the current
    stream after it): the circuits may change only then."""
    while not work.is_completed():
        time.sleep(20e-6)


class GatedProcessGroup(ProcessGroup):
    """One process group: ``inner`` (a real ``ProcessGroup`` with gloo and, on a GPU machine,
    NCCL registered) behind ``gate``. ``global_ranks``: the group's ranks in the world."""

    def __init__(self, rank: int, size: int, global_ranks: Sequence[int],
                 inner: ProcessGroup, gate: RankGate,
                 backends: Sequence[tuple[torch.device, Any, Any]]) -> None:
        # (rank, size): the store overload cannot make a Python subclass (pybind alias)
        super().__init__(rank, size)  # type: ignore[call-arg]
        self._inner = inner
        self._gate = gate
        self.global_ranks = tuple(global_ranks)
        self._group = RankGroup.of(self.global_ranks)
        self._keys: dict[Collective, PhaseKey] = {c: phase_key(self._group, c)
                                                  for c in Collective}
        self._pairs: dict[int, PhaseKey] = {}
        for device, kind, backend in backends:
            self._register_backend(device, kind, backend)
        if backends:
            self._set_default_backend(backends[0][1])

    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        """``lightrail``."""
        return BACKEND

    def _gated(self, collective: Collective, name: str, input_at: int | None,
               args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Call ``name`` of the real group with ``args``/``kwargs`` (any of torch's overloads)
        through the gate, as a ``collective`` phase of this group; ``input_at``: where the
        input tensors are in ``args`` (the byte hint; None: no payload)."""
        tensors = _listed(args[input_at]) if input_at is not None and len(args) > input_at \
            else ()
        return self._call(self._keys[collective], tensors, getattr(self._inner, name), args,
                          kwargs)

    def _call(self, key: PhaseKey, tensors: Sequence[Any], real: Callable[..., Any],
              args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if _on_gpu(tensors):
            return self._gate.call(key, _nbytes(tensors), lambda: real(*args, **kwargs),
                                   _no_completion_future, _wait_gpu)
        return self._gate.call(key, _nbytes(tensors), lambda: real(*args, **kwargs),
                               _on_done, _wait)

    def _p2p(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """``send``/``recv`` (tensors, peer group rank, tag): a send_recv phase of this rank and
        the peer (their global ranks)."""
        peer = int(args[1]) if len(args) > 1 else int(kwargs.get("dstRank", kwargs.get(
            "srcRank", -1)))
        key = self._pairs.get(peer)
        if key is None:
            me = self.global_ranks[self.rank()]
            key = self._pairs[peer] = phase_key(
                RankGroup.of(sorted((me, self.global_ranks[peer]))), Collective.SEND_RECV)
        return self._call(key, _listed(args[0] if args else ()), getattr(self._inner, name),
                          args, kwargs)

    def allreduce(self, *args: Any, **kwargs: Any) -> Any:
        """Gated ``allreduce`` (all_reduce)."""
        return self._gated(Collective.ALL_REDUCE, "allreduce", 0, args, kwargs)

    def allreduce_coalesced(self, *args: Any, **kwargs: Any) -> Any:
        """Gated ``allreduce_coalesced`` (all_reduce)."""
        return self._gated(Collective.ALL_REDUCE, "allreduce_coalesced", 0, args, kwargs)

    def reduce(self, *args: Any, **kwargs: Any) -> Any:
        """Gated ``reduce`` (all_reduce: the same ring)."""
        return self._gated(Collective.ALL_REDUCE, "reduce", 0, args, kwargs)

    def barrier(self, *args: Any, **kwargs: Any) -> Any:
        """Gated ``barrier`` (all_reduce of nothing)."""
        return self._gated(Collective.ALL_REDUCE, "barrier", None, args, kwargs)

    def allgather(self, *args: Any, **kwargs: Any) -> Any:
        """Gated ``allgather`` (all_gather)."""
        return self._gated(Collective.ALL_GATHER, "allgather", 1, args, kwargs)

    def _allgather_base(self, *args: Any, **kwargs: Any) -> Any:
        """Gated ``_allgather_base`` (all_gather_into_tensor)."""
        return self._gated(Collective.ALL_GATHER, "_allgather_base", 1, args, kwargs)

    def all_gather_single(self, *args: Any, **kwargs: Any) -> Any:
        """Gated ``all_gather_single`` (all_gather)."""
        return self._gated(Collective.ALL_GATHER, "all_gather_single", 1, args, kwargs)

    def allgather_coalesced(self, *args: Any, **kwargs: Any) -> Any:
        """Gated ``allgather_coalesced`` (all_gather)."""
        return self._gated(Collective.ALL_GATHER, "allgather_coalesced", 1, args, kwargs)

    def allgather_into_tensor_coalesced(self, *args: Any, **kwargs: Any) -> Any:
        """Gated ``allgather_into_tensor_coalesced`` (all_gather)."""
        return self._gated(Collective.ALL_GATHER, "allgather_into_tensor_coalesced", 1,
                           args, kwargs)

    def all_gather_single_coalesced(self, *args: Any, **kwargs: Any) -> Any:
        """Gated ``all_gather_single_coalesced`` (all_gather)."""
        return self._gated(Collective.ALL_GATHER, "all_gather_single_coalesced", 1, args, kwargs)

    def gather(self, *args: Any, **kwargs: Any) -> Any:
        """Gated ``gather`` (all_gather circuits)."""
        return self._gated(Collective.ALL_GATHER, "gather", 1, args, kwargs)

    def reduce_scatter(self, *args: Any, **kwargs: Any) -> Any:
        """Gated ``reduce_scatter`` (reduce_scatter)."""
        return self._gated(Collective.REDUCE_SCATTER, "reduce_scatter", 1, args, kwargs)

    def _reduce_scatter_base(self, *args: Any, **kwargs: Any) -> Any:
        """Gated ``_reduce_scatter_base`` (reduce_scatter_tensor)."""
        return self._gated(Collective.REDUCE_SCATTER, "_reduce_scatter_base", 1, args, kwargs)

    def reduce_scatter_single(self, *args: Any, **kwargs: Any) -> Any:
        """Gated ``reduce_scatter_single`` (reduce_scatter)."""
        return self._gated(Collective.REDUCE_SCATTER, "reduce_scatter_single", 1, args, kwargs)

    def reduce_scatter_tensor_coalesced(self, *args: Any, **kwargs: Any) -> Any:
        """Gated ``reduce_scatter_tensor_coalesced`` (reduce_scatter)."""
        return self._gated(Collective.REDUCE_SCATTER, "reduce_scatter_tensor_coalesced", 1,
                           args, kwargs)

    def reduce_scatter_single_coalesced(self, *args: Any, **kwargs: Any) -> Any:
        """Gated ``reduce_scatter_single_coalesced`` (reduce_scatter)."""
        return self._gated(Collective.REDUCE_SCATTER, "reduce_scatter_single_coalesced", 1,
                           args, kwargs)

    def alltoall(self, *args: Any, **kwargs: Any) -> Any:
        """Gated ``alltoall`` (all_to_all)."""
        return self._gated(Collective.ALL_TO_ALL, "alltoall", 1, args, kwargs)

    def alltoall_base(self, *args: Any, **kwargs: Any) -> Any:
        """Gated ``alltoall_base`` (all_to_all_single)."""
        return self._gated(Collective.ALL_TO_ALL, "alltoall_base", 1, args, kwargs)

    def all_to_all_single(self, *args: Any, **kwargs: Any) -> Any:
        """Gated ``all_to_all_single`` (all_to_all)."""
        return self._gated(Collective.ALL_TO_ALL, "all_to_all_single", 1, args, kwargs)

    def broadcast(self, *args: Any, **kwargs: Any) -> Any:
        """Gated ``broadcast`` (broadcast)."""
        return self._gated(Collective.BROADCAST, "broadcast", 0, args, kwargs)

    def scatter(self, *args: Any, **kwargs: Any) -> Any:
        """Gated ``scatter`` (broadcast circuits)."""
        return self._gated(Collective.BROADCAST, "scatter", 1, args, kwargs)

    def send(self, *args: Any, **kwargs: Any) -> Any:
        """Gated ``send`` (send_recv of the pair)."""
        return self._p2p("send", args, kwargs)

    def recv(self, *args: Any, **kwargs: Any) -> Any:
        """Gated ``recv`` (send_recv of the pair)."""
        return self._p2p("recv", args, kwargs)


def _real_backends(store: Store, rank: int, size: int, timeout: datetime.timedelta,
                   global_ranks: Sequence[int], group_id: str
                   ) -> tuple[ProcessGroup, list[tuple[torch.device, Any, Any]]]:
    """The real process group this one wraps: gloo for CPU tensors, and NCCL for CUDA tensors
    where torch has CUDA and NCCL (its communicators are made at first use)."""
    inner = ProcessGroup(store, rank, size)
    gloo = ProcessGroupGloo(PrefixStore("gloo/", store), rank, size, timeout)
    backends: list[tuple[torch.device, Any, Any]] = [
        (torch.device("cpu"), ProcessGroup.BackendType.GLOO, gloo)]
    if torch.cuda.is_available() and dist.is_nccl_available():
        from torch._C._distributed_c10d import ProcessGroupNCCL
        from torch.distributed.distributed_c10d import GroupName

        options = ProcessGroupNCCL.Options()
        options._timeout = timeout
        options.global_ranks_in_group = list(global_ranks)
        options.group_name = GroupName(group_id)
        nccl = ProcessGroupNCCL(PrefixStore("nccl/", store), rank, size, options)
        backends.append((torch.device("cuda"), ProcessGroup.BackendType.NCCL, nccl))
    for device, kind, backend in backends:
        inner._register_backend(device, kind, backend)
    inner._set_default_backend(backends[-1][1])
    return inner, backends


def _exchange_placements(store: Store, rank: int, world: int, cfg: gate_config.GateConfig
                         ) -> tuple[list[str], list[int]]:
    """Every rank writes ``host/gpu`` to torch's rendezvous store and reads everyone's."""
    s = PrefixStore(_KEY_PREFIX, store)
    s.set(f"placement/{rank}", f"{cfg.host}\n{cfg.gpu}")
    keys = [f"placement/{r}" for r in range(world)]
    s.wait(keys, _STORE_TIMEOUT)
    hosts, gpus = [], []
    for raw in s.multi_get(keys):
        host, _, gpu = bytes(raw).decode().partition("\n")
        hosts.append(host)
        gpus.append(int(gpu))
    return hosts, gpus


def _register(gate: RankGate, store: Store, rank: int, world: int,
              hosts: list[str], gpus: list[int], cfg: gate_config.GateConfig) -> None:
    """Rank 0 registers the job (a registration left by an earlier run of the same job id is
    replaced); every rank waits for the outcome. Raises RuntimeError with the controller's
    message."""
    s = PrefixStore(_KEY_PREFIX, store)
    if rank == 0:
        transport = _clients[gate]
        placements = placements_of(hosts, gpus)

        async def register() -> str:
            try:
                await transport.register_job(cfg.job_id, placements, tenant=cfg.tenant)
            except JobRegistrationError as exc:
                if exc.status is not grpc.StatusCode.ALREADY_EXISTS:
                    return str(exc)
                log.warning("lightrail: job %r is registered already (an earlier run?): "
                            "registering it again", cfg.job_id)
                try:
                    await transport.unregister_job(cfg.job_id)
                    await transport.register_job(cfg.job_id, placements, tenant=cfg.tenant)
                except (JobRegistrationError, PhaseError) as again:
                    return str(again)
            except PhaseError as exc:
                return str(exc)
            return ""

        outcome = gate.loop.run(register())
        s.set(_REGISTERED, outcome or "ok")
    else:
        s.wait([_REGISTERED], _STORE_TIMEOUT)
        outcome = bytes(s.get(_REGISTERED)).decode()
        outcome = "" if outcome == "ok" else outcome
    if outcome:
        raise RuntimeError(f"lightrail: registering job {cfg.job_id!r} at {cfg.target} failed: "
                           f"{outcome}")


def _watch(gate: RankGate, job_id: str) -> None:
    """Follow the job's events: PLACEMENT_CHANGED makes the next gated call raise."""
    transport = _clients[gate]

    async def follow() -> None:
        try:
            async for ev in transport.watch(job_id):
                if ev.kind is JobEventKind.PLACEMENT_CHANGED:
                    gate.placement_changed(
                        f"job {job_id!r}: placement changed ({ev.message}); restart from the "
                        "last checkpoint (torchrun --max-restarts)")
        except PhaseError as exc:
            log.info("lightrail: watching job %r ended: %s", job_id, exc)

    gate.loop.spawn(follow())


async def _controller_client(target: str) -> ControllerClient:
    return ControllerClient(target)  # made in the gate's loop: its channels belong to it


_clients: dict[RankGate, ControllerClient] = {}
"""Each gate's async client (registration, the event watch, unregistration)."""


def _make_gate(store: Store, rank: int, world: int) -> RankGate:
    cfg = gate_config.load(rank, world)
    hosts, gpus = _exchange_placements(store, rank, world, cfg)
    loop = GateLoop(f"lightrail-gate-{rank}")
    client: ControllerClient = loop.run(_controller_client(cfg.target))
    transport: GateTransport
    if cfg.frame_socket is not None:
        transport = FramePhaseClient(cfg.frame_socket, cfg.job_id, rank)
    elif cfg.via_agent:
        transport = BlockingPhaseClient(cfg.target)
    else:
        transport = LoopTransport(loop, client)
    gate = RankGate(cfg.job_id, rank, transport, loop, hosts=hosts, timeout_s=cfg.timeout_s,
                    linger_s=cfg.linger_s)
    _clients[gate] = client
    if cfg.register:
        _register(gate, store, rank, world, hosts, gpus, cfg)
    _watch(gate, cfg.job_id)
    atexit.register(_close, gate, store, rank, world, cfg)
    return gate


def _close(gate: RankGate, store: Store, rank: int, world: int,
           cfg: gate_config.GateConfig) -> None:
    """At exit: release, write the summary, (rank 0, once every rank closed) unregister the
    job it registered, then close the gate and its clients."""
    gate.drain()
    try:
        if cfg.summary_path:
            try:
                gate.write_summary(cfg.summary_path)
            except OSError as exc:
                log.warning("lightrail: LIGHTRAIL_SUMMARY %s: %s", cfg.summary_path, exc)
        if cfg.register:
            _unregister_when_all_closed(gate, store, rank, world, cfg)
    finally:
        client = _clients.pop(gate, None)
        if client is not None:
            with contextlib.suppress(Exception):
                gate.loop.run(client.close(), timeout_s=5.0)
        gate.close()
        if isinstance(gate.transport, BlockingPhaseClient | FramePhaseClient):
            gate.transport.close()


def _unregister_when_all_closed(gate: RankGate, store: Store, rank: int, world: int,
                                cfg: gate_config.GateConfig) -> None:
    try:
        s = PrefixStore(_KEY_PREFIX, store)
        s.set(f"closed/{rank}", "1")
        if rank == 0:
            s.wait([f"closed/{r}" for r in range(world)], datetime.timedelta(seconds=10))
    except Exception as exc:  # the store may be gone at exit
        log.info("lightrail: closing without every rank: %s", exc)
    if rank == 0:
        try:
            gate.loop.run(_clients[gate].unregister_job(cfg.job_id), timeout_s=15.0)
        except (JobRegistrationError, PhaseError, TimeoutError) as exc:
            log.warning("lightrail: unregistering job %r failed: %s", cfg.job_id, exc)


def create(opts: Any, backend_options: Any = None) -> GatedProcessGroup:
    """torch's creator for the ``lightrail`` backend (``extended_api``): ``opts`` is a
    ``_DistributedBackendOptions`` (store, group_rank, group_size, timeout, group_id,
    global_ranks_in_group). The default group (no global ranks) makes the process's gate:
    placements exchanged over the store, the job registered (``LIGHTRAIL_REGISTER``). Raises
    ``GateConfigError`` for a bad environment, RuntimeError when registration fails or a
    sub-group is made before a lightrail default group."""
    global _gate
    rank, size = int(opts.group_rank), int(opts.group_size)
    global_ranks = list(opts.global_ranks_in_group) or list(range(size))
    with _state_lock:
        if not opts.global_ranks_in_group:
            if _gate is not None:
                _gate.close()
            _gate = _make_gate(opts.store, rank, size)
        gate = _gate
    if gate is None:
        raise RuntimeError(
            "lightrail: a lightrail sub-group needs a lightrail default group: "
            "init_process_group('cpu:lightrail') (or LIGHTRAIL_GATE=1)")
    inner, backends = _real_backends(opts.store, rank, size, opts.timeout, global_ranks,
                                     str(opts.group_id))
    return GatedProcessGroup(rank, size, global_ranks, inner, gate, backends)


_REAL = {"gloo": "cpu:lightrail", "nccl": "cpu:lightrail,cuda:lightrail",
         "cpu:gloo,cuda:nccl": "cpu:lightrail,cuda:lightrail",
         "cuda:nccl,cpu:gloo": "cpu:lightrail,cuda:lightrail"}


def gated_backend(backend: str | None) -> str | None:
    """The lightrail backend string that replaces ``backend`` under ``LIGHTRAIL_GATE=1``
    (``None``/``gloo``/``nccl``/``cpu:gloo,cuda:nccl``); other strings are returned as they
    are."""
    if backend is None:
        return "cpu:lightrail,cuda:lightrail" if torch.cuda.is_available() else "cpu:lightrail"
    return _REAL.get(str(backend).lower().replace(" ", ""), backend)
