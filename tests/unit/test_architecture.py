"""The structure the import contracts and docs/ARCHITECTURE.md describe, checked on the real tree.

- docs/ARCHITECTURE.md's layer list is the ``controller-layers`` contract of pyproject.toml;
- no module-level import cycle anywhere in ``lightrail`` (import-linter checks packages);
- nothing imports the old top-level names (``controller``, ``agents``...): one namespace;
- every module over the size limit is named in docs/ARCHITECTURE.md with its reason;
- lint-imports really fails when a driver imports the controller's runtime (on a copy).
"""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[2]
ARCHITECTURE = ROOT / "docs" / "ARCHITECTURE.md"
PACKAGES = ("controller", "agents", "drivers", "emulator")
SIZE_LIMIT_LINES = 600


def _contracts() -> dict[str, dict[str, object]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    contracts = config["tool"]["importlinter"]["contracts"]
    return {c["id"]: c for c in contracts}


def _doc_block(heading: str) -> list[str]:
    """The lines of the first fenced block after ``heading`` in docs/ARCHITECTURE.md."""
    text = ARCHITECTURE.read_text(encoding="utf-8")
    at = text.index(heading)
    block = re.search(r"```[a-z]*\n(.*?)```", text[at:], re.S)
    assert block is not None, f"no fenced block after {heading!r}"
    return [line.strip() for line in block.group(1).splitlines() if line.strip()]


def _modules() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


def test_documented_layers_are_the_contract() -> None:
    layers = _contracts()["controller-layers"]["layers"]
    assert isinstance(layers, list)
    documented = [line.split("#")[0].strip() for line in _doc_block("## Layers")]
    assert documented == layers


def test_no_module_level_import_cycle() -> None:
    graph = grimp.build_graph("lightrail")
    modules = sorted(m for m in graph.modules if m.startswith("lightrail."))
    edges = {m: sorted(i for i in graph.find_modules_directly_imported_by(m)
                       if i.startswith("lightrail.")) for m in modules}
    # Tarjan's strongly connected components, iteratively
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    cycles: list[list[str]] = []
    counter = 0
    for root in modules:
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            node, child_at = work.pop()
            if child_at == 0:
                index[node] = low[node] = counter
                counter += 1
                stack.append(node)
                on_stack.add(node)
            children = edges.get(node, [])
            if child_at < len(children):
                work.append((node, child_at + 1))
                child = children[child_at]
                if child not in index:
                    work.append((child, 0))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            if low[node] == index[node]:
                component = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    component.append(top)
                    if top == node:
                        break
                if len(component) > 1:
                    cycles.append(sorted(component))
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
    assert cycles == []


def test_no_import_of_the_old_top_level_names() -> None:
    offenders = []
    for path in [*_modules(), *(ROOT / "tests").rglob("*.py"), *(ROOT / "bench").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module] if isinstance(node, ast.ImportFrom) and node.module
                     and node.level == 0 else [])
            offenders += [f"{path.relative_to(ROOT)}: {n}" for n in names
                          if n.split(".")[0] in PACKAGES]
    assert offenders == []


def test_long_modules_carry_a_reason() -> None:
    documented = _doc_block("## Long modules")
    reasons = {line.split()[0].strip("`"): line for line in documented}
    long = [str(p.relative_to(ROOT)) for p in _modules()
            if len(p.read_text(encoding="utf-8").splitlines()) > SIZE_LIMIT_LINES]
    missing = [m for m in long if m not in reasons]
    assert missing == []
    stale = [m for m in reasons if m not in long]
    assert stale == [], "docs/ARCHITECTURE.md lists modules that are no longer long"


def test_lint_imports_fails_when_a_driver_imports_the_runtime(tmp_path: Path) -> None:
    lint = Path(sys.executable).with_name("lint-imports")
    if not lint.exists():
        pytest.skip("lint-imports is not installed beside this interpreter")
    for name in (*PACKAGES, "proto"):
        shutil.copytree(ROOT / name, tmp_path / name, symlinks=True,
                        ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    env = {"PYTHONPATH": str(tmp_path / "proto"), "PATH": "/usr/bin:/bin"}
    args = [str(lint), "--no-cache", "--no-logo", "--contract", "drivers-standalone"]
    kept = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
                          check=False)
    driver = tmp_path / "drivers" / "tl1" / "driver.py"
    driver.write_text(driver.read_text(encoding="utf-8")
                      + "\nimport lightrail.controller.runtime  # noqa\n", encoding="utf-8")
    broken = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=60, check=False)
    assert kept.returncode == 0, kept.stdout + kept.stderr
    assert broken.returncode != 0
    assert "lightrail.drivers.tl1.driver -> lightrail.controller.runtime" in broken.stdout
