"""A SimAI workload file for another job size: the same layer lines under a header that states
the parallel degrees and the world size.

SimAI (``astra-sim/workload/Workload.cc``) reads the degrees from the first line's ``key: value``
fields, in the order AICB writes them (``workload_generator/SimAI_training_workload_generator.py``,
``SIMAI_workload.dump_file``)::

    HYBRID_TRANSFORMER_FWD_IN_BCKWD model_parallel_NPU_group: 2 ep: 1 pp: 12 vpp: 32 ga: 1 \
all_gpus: 9216 checkpoints: 0 checkpoint_initiates: 0 pp_comm: 16777216

The layer lines stay valid at any world size: their collective sizes depend on the model and
the tensor-parallel degree only (AICB writes the same lines for every data-parallel degree), so
a file generated for TP 2 on a few GPUs describes TP 2 on 9,216. :func:`scale_simai` writes such
a file (tests and ``bench/evaluate_scale.py`` make the 9,216-GPU workload from the shared
Llama-7B one this way; no large generated file is kept).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

__all__ = ["scale_simai", "scaled_simai_header"]

_HEADER_KEYS = ("model_parallel_NPU_group", "ep", "pp", "vpp", "ga", "all_gpus", "checkpoints",
                "checkpoint_initiates")


def _header_fields(line: str) -> tuple[str, dict[str, str]]:
    """The workload type and the ``key: value`` fields of a SimAI header line (``pp_comm``
    is written with or without its colon)."""
    tokens = line.split()
    if not tokens:
        raise ValueError("source: empty header line")
    fields: dict[str, str] = {}
    i = 1
    while i < len(tokens):
        key = tokens[i].rstrip(":")
        if (tokens[i].endswith(":") or key == "pp_comm") and i + 1 < len(tokens):
            fields[key] = tokens[i + 1]
            i += 2
        else:
            i += 1
    return tokens[0], fields


def _activation_bytes(layer_lines: list[str]) -> int:
    """The most frequent forward ALLREDUCE size of the layer lines: the TP all-reduce of one
    micro-batch's activations, 2 x mbs x seq x hidden bytes, which is also the pipeline message
    AICB writes as ``pp_comm`` (without sequence parallelism). 0 when there is none."""
    sizes: Counter[int] = Counter()
    for text in layer_lines:
        fields = text.split()
        if len(fields) >= 5 and fields[3] == "ALLREDUCE" and fields[4].isdecimal():
            sizes[int(fields[4])] += 1
    return sizes.most_common(1)[0][0] if sizes else 0


def scaled_simai_header(
    header: str,
    *,
    world_size: int,
    pp: int = 1,
    tp: int | None = None,
    ep: int = 1,
    pp_comm_bytes: int = 0,
) -> str:
    """``header`` (a SimAI first line) rewritten for ``world_size`` GPUs in ``pp`` pipeline
    stages: every AICB field in AICB's order, TP (``model_parallel_NPU_group``) kept from the
    header unless ``tp`` is given, ``vpp``, ``ga``, ``checkpoints`` and
    ``checkpoint_initiates`` kept from the header (defaults 1, 1, 0, 0), ``pp_comm`` set to
    ``pp_comm_bytes`` (bytes per pipeline send, 0 without a pipeline).

    Raises ``ValueError`` naming the parameter: a degree < 1, ``tp * pp`` not dividing the world
    size, an ``ep`` that does not divide the data-parallel degree, a negative ``pp_comm_bytes``.
    """
    policy, old = _header_fields(header)
    tp_degree = tp if tp is not None else int(old.get("model_parallel_NPU_group", "1"))
    for name, value in (("world_size", world_size), ("pp", pp), ("tp", tp_degree), ("ep", ep)):
        if value < 1:
            raise ValueError(f"{name}: must be >= 1, got {value}")
    if world_size % (tp_degree * pp):
        raise ValueError(f"world_size: {world_size} is not a multiple of tp {tp_degree} x "
                         f"pp {pp}")
    dp = world_size // (tp_degree * pp)
    if dp % ep:
        raise ValueError(f"ep: {ep} does not divide the data-parallel degree {dp}")
    if pp_comm_bytes < 0:
        raise ValueError(f"pp_comm_bytes: must be >= 0, got {pp_comm_bytes}")
    values = {
        "model_parallel_NPU_group": str(tp_degree), "ep": str(ep), "pp": str(pp),
        "vpp": old.get("vpp", "1"), "ga": old.get("ga", "1"), "all_gpus": str(world_size),
        "checkpoints": old.get("checkpoints", "0"),
        "checkpoint_initiates": old.get("checkpoint_initiates", "0"),
    }
    fields = " ".join(f"{key}: {values[key]}" for key in _HEADER_KEYS)
    return f"{policy}\t{fields} pp_comm: {pp_comm_bytes}"


def scale_simai(
    source: Path,
    dest: Path,
    *,
    world_size: int,
    pp: int = 1,
    tp: int | None = None,
    ep: int = 1,
    pp_comm_bytes: int | None = None,
) -> Path:
    """Write ``dest``: ``source``'s SimAI workload (its layer count and layer lines unchanged)
    under the header of :func:`scaled_simai_header`. ``pp_comm_bytes`` defaults to the layer
    lines' activation size (the most frequent forward ALLREDUCE) when ``pp > 1``, else 0.
    Returns ``dest``.

    Raises ``ValueError`` as :func:`scaled_simai_header` does or when ``source`` has no layer
    count line, ``OSError`` when a file cannot be read or written.
    """
    lines = Path(source).read_text(encoding="utf-8").splitlines()
    if len(lines) < 2:
        raise ValueError(f"source: {source} has no layer count line")
    if pp_comm_bytes is None:
        pp_comm_bytes = _activation_bytes(lines[2:]) if pp > 1 else 0
    header = scaled_simai_header(lines[0], world_size=world_size, pp=pp, tp=tp, ep=ep,
                                 pp_comm_bytes=pp_comm_bytes)
    Path(dest).write_text("\n".join([header, *lines[1:]]) + "\n", encoding="utf-8")
    return Path(dest)
