"""The torch gate's configuration, read from the environment of a training process.

torchrun gives every worker the same environment, so each value may contain the placeholders
``{rank}``, ``{local_rank}``, ``{group_rank}`` (the node's rank) and ``{world_size}`` (filled
from the rank, ``LOCAL_RANK``, ``GROUP_RANK`` and the world size): ``LIGHTRAIL_HOST=host{rank}``
makes four processes on one machine four hosts of an emulated fabric. Pure: no torch, no I/O
but ``os.environ`` and the host name.

Variables (default in brackets):

- ``LIGHTRAIL_AGENT``: the host agent's local endpoint, ``unix:///path``
  [``unix:///run/lightrail/agent.sock``];
- ``LIGHTRAIL_NCCL_SOCKET``: the host agent's frame socket (``lightrail agent --nccl-socket``):
  when set, phase calls go there instead of ``LIGHTRAIL_AGENT`` (ordered frames: a release
  costs no round trip) [unset];
- ``LIGHTRAIL_CONTROLLER``: controller address(es) ``host:port[,host:port]``, when no host
  agent runs (set one of the two) [unset];
- ``LIGHTRAIL_JOB_ID``: the job's id at the controller [``TORCHELASTIC_RUN_ID``, else
  ``torch-<MASTER_PORT>``];
- ``LIGHTRAIL_HOST``: this rank's host as the fabric names it [the host name];
- ``LIGHTRAIL_GPU``: this rank's GPU index on its host [``LOCAL_RANK`` through
  ``CUDA_VISIBLE_DEVICES``];
- ``LIGHTRAIL_REGISTER``: ``1``: rank 0 registers the job with every rank's placement (and
  unregisters it at exit); ``0``: attach to a registration the operator made [``1``];
- ``LIGHTRAIL_TENANT``: tenant of a job the gate registers [``default``];
- ``LIGHTRAIL_TIMEOUT_S``: admission timeout of one phase, s, > 0 [``60``];
- ``LIGHTRAIL_LINGER_MS``: a run whose works completed is released after this idle time, ms,
  >= 0 [``2``];
- ``LIGHTRAIL_SUMMARY``: where this rank writes its per-phase summary (JSON) at exit [unset];
- ``LIGHTRAIL_GATE``: ``1``: ``init_process_group("gloo" | "nccl" | None)`` uses the lightrail
  backend, for scripts left as they are [``0``].
"""

from __future__ import annotations

import math
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass

DEFAULT_AGENT = "unix:///run/lightrail/agent.sock"


class GateConfigError(ValueError):
    """An environment variable of the gate has a bad value; the message names it and the value."""


@dataclass(frozen=True, slots=True)
class GateConfig:
    """What one rank's gate needs. ``target``: where phase calls go (``unix:///...`` for the
    host agent, ``host:port[,...]`` for the controller); ``via_agent``: whether that is a host
    agent; ``timeout_s`` and ``linger_s`` in seconds."""

    target: str
    via_agent: bool
    job_id: str
    host: str
    gpu: int
    register: bool
    tenant: str
    timeout_s: float
    linger_s: float
    summary_path: str | None
    frame_socket: str | None = None
    """The agent's frame socket (``LIGHTRAIL_NCCL_SOCKET``), when phase calls go there."""


def _fill(name: str, value: str, fields: Mapping[str, str]) -> str:
    try:
        return value.format_map(fields)
    except (KeyError, ValueError, IndexError) as exc:
        raise GateConfigError(
            f"{name}: {value!r} has a bad placeholder ({exc}); use {{rank}}, {{local_rank}}, "
            "{group_rank} or {world_size}") from None


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    if not raw.isdecimal():
        raise GateConfigError(f"{name}: expected a non-negative integer, got {raw!r}")
    return int(raw)


def _float(name: str, raw: str, *, positive: bool) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise GateConfigError(f"{name}: expected a number, got {raw!r}") from None
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        bound = "> 0" if positive else ">= 0"
        raise GateConfigError(f"{name}: must be finite and {bound}, got {raw!r}")
    return value


def _flag(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env.get(name, "").strip().lower()
    if not raw:
        return default
    if raw in ("1", "true", "yes", "on"):
        return True
    if raw in ("0", "false", "no", "off"):
        return False
    raise GateConfigError(f"{name}: expected 1 or 0, got {raw!r}")


def gate_requested(env: Mapping[str, str] | None = None) -> bool:
    """``LIGHTRAIL_GATE``: whether plain ``init_process_group`` calls are to be gated.
    Raises ``GateConfigError`` for a value that is not a flag."""
    return _flag(os.environ if env is None else env, "LIGHTRAIL_GATE", False)


def local_gpu(env: Mapping[str, str], local_rank: int) -> int:
    """The GPU index of local rank ``local_rank``: the ``local_rank``-th entry of
    ``CUDA_VISIBLE_DEVICES`` when that lists indices, else ``local_rank``. Raises
    ``GateConfigError`` when the list is shorter than ``local_rank``."""
    visible = [v.strip() for v in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if not visible:
        return local_rank
    if local_rank >= len(visible):
        raise GateConfigError(
            f"CUDA_VISIBLE_DEVICES: {env['CUDA_VISIBLE_DEVICES']!r} lists {len(visible)} "
            f"device(s), LOCAL_RANK is {local_rank}")
    entry = visible[local_rank]
    return int(entry) if entry.isdecimal() else local_rank  # UUIDs: the position


def load(rank: int, world_size: int, env: Mapping[str, str] | None = None) -> GateConfig:
    """The configuration of global rank ``rank`` of ``world_size`` from ``env`` (default
    ``os.environ``). Raises ``GateConfigError`` naming the variable and its value."""
    env = os.environ if env is None else env
    local_rank = _int(env, "LOCAL_RANK", 0)
    fields = {"rank": str(rank), "local_rank": str(local_rank), "world_size": str(world_size),
              "group_rank": str(_int(env, "GROUP_RANK", 0))}

    def get(name: str, default: str) -> str:
        raw = env.get(name, "").strip()
        return _fill(name, raw, fields) if raw else default

    controller = get("LIGHTRAIL_CONTROLLER", "")
    agent = get("LIGHTRAIL_AGENT", "")
    if controller and agent:
        raise GateConfigError(
            f"LIGHTRAIL_AGENT ({agent!r}) and LIGHTRAIL_CONTROLLER ({controller!r}) are both "
            "set; set one")
    if agent and not agent.startswith("unix://"):
        raise GateConfigError(f"LIGHTRAIL_AGENT: expected unix:///path, got {agent!r}")
    target = controller or agent or DEFAULT_AGENT
    job_id = get("LIGHTRAIL_JOB_ID", "")
    if not job_id:
        run_id = env.get("TORCHELASTIC_RUN_ID", "").strip()
        job_id = run_id if run_id and run_id != "none" else (
            f"torch-{env.get('MASTER_PORT', '').strip() or 'job'}")
    host = get("LIGHTRAIL_HOST", "") or socket.gethostname()
    gpu_raw = get("LIGHTRAIL_GPU", "")
    if gpu_raw:
        if not gpu_raw.isdecimal():
            raise GateConfigError(f"LIGHTRAIL_GPU: expected a GPU index, got {gpu_raw!r}")
        gpu = int(gpu_raw)
    else:
        gpu = local_gpu(env, local_rank)
    timeout_raw = env.get("LIGHTRAIL_TIMEOUT_S", "").strip()
    linger_raw = env.get("LIGHTRAIL_LINGER_MS", "").strip()
    summary = get("LIGHTRAIL_SUMMARY", "")
    return GateConfig(
        target=target,
        via_agent=not controller,
        job_id=job_id,
        host=host,
        gpu=gpu,
        register=_flag(env, "LIGHTRAIL_REGISTER", True),
        tenant=get("LIGHTRAIL_TENANT", "default"),
        timeout_s=_float("LIGHTRAIL_TIMEOUT_S", timeout_raw, positive=True)
        if timeout_raw else 60.0,
        linger_s=(_float("LIGHTRAIL_LINGER_MS", linger_raw, positive=False)
                  if linger_raw else 2.0) / 1000.0,
        summary_path=summary or None,
        frame_socket=(get("LIGHTRAIL_NCCL_SOCKET", "") or None) if not controller else None,
    )
