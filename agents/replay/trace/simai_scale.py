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

With ``pp > 1`` the file holds one stage's layers, as AICB writes it (``utils/utils.py``
``get_params``: ``num_layers //= pipeline_model_parallel``; the reader's side is
``lightrail.agents.replay.trace.simai_pipeline``): of each microbatch's transformer layers
(the lines between ``embedding_layer`` and ``embedding_norm``, a repeating run of layer names,
e.g. ``attention_layer``, ``mlp_layer``) the first ``1/pp`` are kept; the lines before and
after (gradient norms, cross entropy, optimizer) stay, the parameter-sized ones
(``grad_norm``, ``layernorm``) sized for one stage's parameters as AICB sizes them.
Megatron-LM refuses a pipeline degree that does not divide the layers (``num_layers`` must be
a multiple of the pipeline size), and so does :func:`scale_simai`; AICB would silently drop
the remainder.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

__all__ = ["scale_simai", "scaled_simai_header", "stage_layers"]

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
    With ``pp > 1`` only one stage's layers are written (:func:`stage_layers`), the layer count
    line updated. Returns ``dest``.

    Raises ``ValueError`` as :func:`scaled_simai_header` and :func:`stage_layers` do or when
    ``source`` has no layer count line, ``OSError`` when a file cannot be read or written.
    """
    lines = Path(source).read_text(encoding="utf-8").splitlines()
    if len(lines) < 2:
        raise ValueError(f"source: {source} has no layer count line")
    if pp_comm_bytes is None:
        pp_comm_bytes = _activation_bytes(lines[2:]) if pp > 1 else 0
    header = scaled_simai_header(lines[0], world_size=world_size, pp=pp, tp=tp, ep=ep,
                                 pp_comm_bytes=pp_comm_bytes)
    layer_lines = [text for text in lines[2:] if text.split()]
    if pp > 1:
        tp_degree = tp if tp is not None else int(
            _header_fields(lines[0])[1].get("model_parallel_NPU_group", "1"))
        layer_lines = stage_layers(layer_lines, pp, tp=tp_degree, source=str(source))
        body = [str(len(layer_lines)), *layer_lines]
    else:
        body = lines[1:]
    Path(dest).write_text("\n".join([header, *body]) + "\n", encoding="utf-8")
    return Path(dest)


def _period(names: list[str]) -> int:
    """The shortest run of names that ``names`` repeats (its length when none)."""
    for period in range(1, len(names) + 1):
        if len(names) % period == 0 and all(n == names[i % period] for i, n in enumerate(names)):
            return period
    return len(names)


def stage_layers(
    layer_lines: list[str], pp: int, *, tp: int = 1, source: str = "source"
) -> list[str]:
    """One pipeline stage's share of ``layer_lines`` (a whole model's SimAI layer lines) for
    ``pp`` stages: in each microbatch (``embedding_layer`` ... ``embedding_norm``) the
    transformer layers between the two, ``n`` repetitions of one run of layer names, are cut
    to the first ``n / pp``; every other line is kept, the sizes of the parameter-sized ones
    (gradient norms, layernorm) cut to one stage's parameters (``_stage_parameters``; ``tp``
    is the TP degree).

    Raises ``ValueError`` naming the value: ``pp`` < 1, no microbatch (no ``embedding_layer``
    ... ``embedding_norm``: the transformer layers cannot be told apart), or ``pp`` not
    dividing a microbatch's ``n`` transformer layers."""
    if pp < 1:
        raise ValueError(f"pp: must be >= 1, got {pp}")
    names = [text.split()[0] for text in layer_lines]
    out: list[str] = []
    i = 0
    found = False
    while i < len(layer_lines):
        if names[i] != "embedding_layer":
            out.append(layer_lines[i])
            i += 1
            continue
        try:
            end = names.index("embedding_norm", i + 1)
        except ValueError:
            raise ValueError(f"source: {source}: embedding_layer at layer {i} has no "
                             "embedding_norm after it") from None
        found = True
        transformer = names[i + 1:end]
        period = _period(transformer)
        count = len(transformer) // period if transformer else 0
        if count % pp:
            raise ValueError(f"pp: {pp} does not divide the {count} transformer layers "
                             f"({' + '.join(transformer[:period])}) of {source}; Megatron-LM "
                             "needs num_layers to be a multiple of the pipeline size")
        keep = period * (count // pp)
        out.extend(layer_lines[i:i + 1 + keep])
        out.append(layer_lines[end])
        i = end + 1
    if not found:
        raise ValueError(f"source: {source} has no embedding_layer ... embedding_norm "
                         f"microbatch: its transformer layers cannot be split over pp {pp} "
                         "stages")
    return _stage_parameters(out, layer_lines, pp, tp)


_PARAMETER_LINES = frozenset({"grad_norm", "layernorm", "moe_grad_norm1", "moe_grad_norm2"})
"""AICB's lines sized by the parameters of the model (of one stage with ``pp > 1``)."""


def _comm_size(fields: list[str], at: int) -> int:
    return int(fields[at]) if len(fields) > at and fields[at].isdecimal() else 0


def _stage_parameters(kept: list[str], whole: list[str], pp: int, tp: int) -> list[str]:
    """``kept`` with the sizes of the parameter-sized lines (``_PARAMETER_LINES``: AICB writes
    2 or 4 bytes per parameter of a TP rank, ``_get_total_params``) cut to one stage's
    parameters. The parameters are ``grad_norm``'s forward all-gather size / 2; the embedding's
    share, which every AICB stage holds, stays whole: AICB's ``MockedMegatron.MegatronEmbedding``
    has ``4 x vocab / tp x hidden`` parameters, and ``embedding_norm``'s forward size is ``vocab
    x hidden x 2`` B, so the embedding is ``2 x that size / tp`` (the position embedding and the
    vocabulary padding are left out); the rest is divided by ``pp``. Without a ``grad_norm``
    line nothing changes."""
    names = [text.split()[0] for text in whole]
    if "grad_norm" not in names:
        return kept
    total = _comm_size(whole[names.index("grad_norm")].split(), 4) / 2
    if total <= 0:
        return kept
    embedding = 0.0
    if "embedding_norm" in names:
        embedding = 2 * _comm_size(whole[names.index("embedding_norm")].split(), 4) / tp
    embedding = min(embedding, total)
    fraction = (embedding + (total - embedding) / pp) / total
    out: list[str] = []
    for text in kept:
        fields = text.split()
        if fields[0] not in _PARAMETER_LINES:
            out.append(text)
            continue
        for at in (4, 7, 10):
            if len(fields) > at and fields[at].isdecimal():
                fields[at] = str(round(int(fields[at]) * fraction))
        out.append("\t".join(fields))
    return out
