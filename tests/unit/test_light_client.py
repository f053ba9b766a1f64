"""The job-side library is light (issue 8 §1): a training process that imports
``lightrail.agents.client`` (or only its errors) loads neither the controller's core, runtime or
store, nor plotting, console or NVML modules, nor the host agent or the replay tools.

Each case imports the module in a fresh interpreter (this one has loaded everything already)
and reads back its ``sys.modules``. The import-linter contracts "agents-light" and
"job-library-light" check the same statically; this checks what really gets loaded, including
through package ``__init__`` modules and third-party imports. The same check shows that the
host agent (production) loads no emulator module: the composition root picks emulated GPUs.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

FORBIDDEN = (
    "lightrail.controller.core",
    "lightrail.controller.runtime",
    "lightrail.controller.store",
    "lightrail.controller.torus",
    "lightrail.controller.app",
    "lightrail.controller.cli",
    "lightrail.controller.api.agent_service",
    "lightrail.controller.api.operator_service",
    "lightrail.controller.api.replies",
    "lightrail.agents.host",
    "lightrail.agents.replay",
    "lightrail.emulator",
    "matplotlib",
    "rich",
    "pynvml",
)
"""Packages (and everything under them) that must stay out of a job's interpreter."""


def _loaded_after_import(module: str) -> list[str]:
    """The sorted ``sys.modules`` names of a fresh interpreter after ``import module``."""
    code = f"import json, sys, {module}; print(json.dumps(sorted(sys.modules)))"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    names: list[str] = json.loads(done.stdout.strip().splitlines()[-1])
    return names


def _heavy(names: list[str]) -> list[str]:
    return [n for n in names if any(n == p or n.startswith(p + ".") for p in FORBIDDEN)]


@pytest.mark.parametrize("module", ["lightrail.agents.client", "lightrail.agents.errors",
                                    "lightrail.agents.nccl.registration"])
def test_job_side_import_loads_no_heavy_module(module: str) -> None:
    names = _loaded_after_import(module)
    assert module in names
    assert _heavy(names) == []


@pytest.mark.parametrize("module", ["lightrail.agents.torch", "lightrail.agents.torch.gate"])
def test_torch_backend_loads_nothing_heavy_beyond_torch(module: str) -> None:
    pytest.importorskip("torch", reason="the optional extra lightrail[torch] is not installed")
    names = _loaded_after_import(module)
    assert module in names
    # torch itself may load pynvml (torch.cuda); the backend adds nothing heavy of its own
    assert set(_heavy(names)) <= set(_heavy(_loaded_after_import("torch.distributed")))
    assert "grpc" not in names  # the backend module (gRPC, clients) loads with the first group


def test_client_loads_the_codec_and_stubs() -> None:
    names = _loaded_after_import("lightrail.agents.client")
    assert "lightrail.controller.api.codec" in names
    assert "lightrail.v1.agent_pb2_grpc" in names


def test_heavy_filter_matches_submodules_not_lookalikes() -> None:
    assert _heavy(["lightrail.controller.core.planner", "rich", "richer", "pynvml_utils",
                   "lightrail.controller.domain.model"]) == ["lightrail.controller.core.planner",
                                                            "rich"]


@pytest.mark.parametrize("module", [
    "lightrail.agents.host.agent", "lightrail.agents.host.reporter",
    "lightrail.agents.host.local_endpoint", "lightrail.agents.host.state",
    "lightrail.agents.host.nvml", "lightrail.agents.host.nccl_endpoint",
])
def test_host_agent_loads_no_emulator(module: str) -> None:
    names = _loaded_after_import(module)
    assert module in names
    assert [n for n in names if n == "lightrail.emulator" or n.startswith("lightrail.emulator.")
            ] == []
