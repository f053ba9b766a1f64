"""Lightrail for PyTorch jobs: the ``lightrail`` process-group backend (torch is an optional
extra: ``pip install 'lightrail[torch]'``, tested with torch 2.13.0).

A job opts in with one backend string, ``init_process_group("cpu:lightrail")`` (gloo) or
``"cpu:lightrail,cuda:lightrail"`` (gloo + NCCL), or leaves its script alone and sets
``LIGHTRAIL_GATE=1``. The backend is registered at ``import torch`` through torch's backend
autoload entry point (group ``torch.backends``; ``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` turns it
off), or by importing this package. Importing it loads neither torch.distributed's backends nor
gRPC: the backend module loads when the first lightrail group is made.

What is gated and how: ``lightrail.agents.torch.gate`` (phases = runs of one kind on one
group) and ``lightrail.agents.torch.backend`` (the process group). The environment variables:
``lightrail.agents.torch.config``. A ``PLACEMENT_CHANGED`` (a rank moved to a spare GPU)
raises ``PlacementChanged`` from the next collective: the worker exits non-zero and torchrun's
elastic agent restarts the job (``--max-restarts``), which resumes from its checkpoint.
"""

from __future__ import annotations

import threading
from typing import Any

from lightrail.agents.errors import PhaseError, PhaseTimeout, PlacementChanged
from lightrail.agents.torch.config import GateConfigError, gate_requested

BACKEND = "lightrail"
_lock = threading.Lock()
_registered = False


def _create(opts: Any, backend_options: Any = None) -> Any:
    from lightrail.agents.torch import backend

    return backend.create(opts, backend_options)


def register() -> None:
    """Register the ``lightrail`` backend with torch.distributed (idempotent); under
    ``LIGHTRAIL_GATE=1`` also make ``init_process_group`` with gloo, nccl or no backend use it.
    Raises ``GateConfigError`` for a bad ``LIGHTRAIL_GATE``."""
    global _registered
    with _lock:
        if _registered:
            return
        _registered = True
    import torch.distributed as dist

    dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["cpu", "cuda"])
    if gate_requested():
        real_init = dist.init_process_group

        def init_process_group(backend: str | None = None, *args: Any, **kwargs: Any) -> None:
            from lightrail.agents.torch.backend import gated_backend

            real_init(gated_backend(backend), *args, **kwargs)

        init_process_group.__doc__ = real_init.__doc__
        dist.init_process_group = init_process_group


def autoload() -> None:
    """torch's ``torch.backends`` entry point: ``register()``; never raises into ``import
    torch`` (a bad environment is reported when a group is made)."""
    try:
        register()
    except Exception as exc:
        import logging

        logging.getLogger(__name__).warning("lightrail: backend not registered: %s", exc)



__all__ = ["BACKEND", "GateConfigError", "PhaseError", "PhaseTimeout", "PlacementChanged",
           "autoload", "register"]

register()  # importing the package is the "one import" way to opt in
