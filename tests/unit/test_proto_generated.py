"""The checked-in generated protobuf/gRPC code and stubs match proto/ (run `make proto`)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _load_generator() -> object:
    spec = importlib.util.spec_from_file_location("gen_proto", ROOT / "scripts" / "gen_proto.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generated_code_is_up_to_date(tmp_path: Path) -> None:
    gen = _load_generator()
    gen.generate(tmp_path)  # type: ignore[attr-defined]
    fresh = {p.relative_to(tmp_path): p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    assert fresh, "the generator wrote nothing"
    stale = []
    for rel, content in sorted(fresh.items()):
        checked_in = ROOT / "proto" / rel
        if not checked_in.exists() or checked_in.read_bytes() != content:
            stale.append(str(rel))
    assert not stale, f"generated files differ from proto/ (run `make proto`): {stale}"
