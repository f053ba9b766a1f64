"""Regenerate the checked-in protobuf/gRPC code and typed stubs from proto/.

Usage: ``python scripts/gen_proto.py [--out DIR]`` (default: proto/, in place). The staleness
test runs it into a temporary directory and compares the results with the checked-in files.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parents[1]
PROTO_ROOT = ROOT / "proto"


def proto_files() -> list[Path]:
    """Every .proto under proto/, sorted, relative to proto/."""
    return sorted(p.relative_to(PROTO_ROOT) for p in PROTO_ROOT.rglob("*.proto"))


def generate(out: Path) -> None:
    """Write ``*_pb2.py``, ``*_pb2_grpc.py``, ``*.pyi`` and ``*_pb2_grpc.pyi`` under ``out``.

    Raises ``RuntimeError`` when protoc fails.
    """
    import grpc_tools

    include = Path(grpc_tools.__file__).parent / "_proto"
    bindir = Path(sys.executable).parent  # mypy-protobuf's plugins live beside the interpreter
    args = [
        "grpc_tools.protoc",
        f"--plugin=protoc-gen-mypy={bindir / 'protoc-gen-mypy'}",
        f"--plugin=protoc-gen-mypy_grpc={bindir / 'protoc-gen-mypy_grpc'}",
        f"-I{PROTO_ROOT}",
        f"-I{include}",
        f"--python_out={out}",
        f"--grpc_python_out={out}",
        f"--mypy_out={out}",
        f"--mypy_grpc_out={out}",
        *(str(p) for p in proto_files()),
    ]
    rc = protoc.main(args)
    if rc != 0:
        raise RuntimeError(f"protoc failed with exit code {rc}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=PROTO_ROOT)
    ns = parser.parse_args()
    ns.out.mkdir(parents=True, exist_ok=True)
    generate(ns.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
