"""A picture of one switch's cross-connects (``lightrail switch show``): a text matrix for the
terminal and Graphviz DOT. Pure: input in, text out.

N x N switches draw ingress ports as rows and egress ports as columns (a cross-connect is
directed, ingress -> egress); duplex switches draw ports against ports, each cross-connect
marked in both of its cells (DESIGN.md "Ports and circuits"). A cell holds the letter of the job
owning the cross-connect (legend below the matrix), ``X`` for one no job owns, ``.`` for no
cross-connect. Switches of ``LARGE_PORTS`` ports or more draw only the ports in use, and say so.
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from dataclasses import dataclass

LARGE_PORTS = 128
"""From this many ports (both sides of an N x N switch together) only the ports in use are
drawn: a full 128 x 128 matrix does not fit a terminal."""

NO_JOB = "X"
"""The mark of a cross-connect that no job owns."""
EMPTY = "."
"""The mark of a cell without a cross-connect."""


@dataclass(frozen=True, slots=True)
class Link:
    """One cross-connect ``ingress`` -> ``egress`` (duplex: ``ingress`` < ``egress``), the job
    owning it (None: none)."""

    ingress: int
    egress: int
    job_id: str | None = None


@dataclass(frozen=True, slots=True)
class PortLabel:
    """The endpoint (``host/nicN``) wired to ``port``."""

    port: int
    endpoint: str


@dataclass(frozen=True, slots=True)
class SwitchDrawing:
    """What is drawn: the switch's id, kind (``nxn`` or ``duplex``), ``port_count`` (per side
    for N x N, as ``SwitchInfo.port_count``), its cross-connects and the endpoints known on its
    ports."""

    switch_id: str
    kind: str
    port_count: int
    links: Sequence[Link]
    labels: Sequence[PortLabel] = ()

    @property
    def nxn(self) -> bool:
        """True for an N x N switch (ingress 1..N, egress N+1..2N)."""
        return self.kind == "nxn"

    @property
    def total_ports(self) -> int:
        """Every port of the switch (2N for N x N)."""
        return 2 * self.port_count if self.nxn else self.port_count

    @property
    def large(self) -> bool:
        """True when only the ports in use are drawn (``LARGE_PORTS``)."""
        return self.total_ports >= LARGE_PORTS


def _job_marks(links: Sequence[Link]) -> dict[str, str]:
    """Job id -> its mark: A, B, ... in order of job id (then a, b, ..., digits)."""
    alphabet = string.ascii_uppercase + string.ascii_lowercase.replace("x", "") + string.digits
    jobs = sorted({lk.job_id for lk in links if lk.job_id})
    return {j: alphabet[i] if i < len(alphabet) else "?" for i, j in enumerate(jobs)}


def _axes(d: SwitchDrawing) -> tuple[list[int], list[int]]:
    """The row and column ports drawn."""
    if d.nxn:
        rows = list(range(1, d.port_count + 1))
        cols = list(range(d.port_count + 1, 2 * d.port_count + 1))
    else:
        rows = cols = list(range(1, d.port_count + 1))
    if d.large:
        used_rows = {lk.ingress for lk in d.links}
        used_cols = {lk.egress for lk in d.links}
        if not d.nxn:
            used_rows = used_cols = used_rows | used_cols
        rows = [p for p in rows if p in used_rows]
        cols = [p for p in cols if p in used_cols]
    return rows, cols


def text_matrix(d: SwitchDrawing) -> str:
    """The matrix of ``d`` as lines of text (see the module doc), with a header line, the
    endpoint of each column port and the job legend below."""
    marks = _job_marks(d.links)
    cells: dict[tuple[int, int], str] = {}
    for lk in d.links:
        mark = marks[lk.job_id] if lk.job_id else NO_JOB
        cells[(lk.ingress, lk.egress)] = mark
        if not d.nxn:
            cells[(lk.egress, lk.ingress)] = mark
    rows, cols = _axes(d)
    label = {pl.port: pl.endpoint for pl in d.labels}
    shape = (f"{d.port_count}x{d.port_count} N x N" if d.nxn
             else f"{d.port_count} ports, duplex")
    out = [f"{d.switch_id} ({shape}): {len(d.links)} cross-connect(s)"]
    if d.large:
        out.append(f"large switch ({d.total_ports} ports): only the {len(rows)} row and "
                   f"{len(cols)} column ports in use are drawn")
    if not d.links and d.large:
        return "\n".join(out)
    width = max((len(str(p)) for p in cols), default=1)
    row_head = [f"{p:>{len(str(max(rows, default=1)))}} {label.get(p, '')}".rstrip()
                for p in rows]
    corner = "ingress \\ egress" if d.nxn else "port \\ port"
    head_w = max([len(corner), *(len(h) for h in row_head)])
    out.append(f"{corner:<{head_w}} | " + " ".join(f"{p:>{width}}" for p in cols))
    out.append("-" * head_w + "-+-" + "-" * max(0, (width + 1) * len(cols) - 1))
    for p, h in zip(rows, row_head, strict=True):
        out.append(f"{h:<{head_w}} | "
                   + " ".join(f"{cells.get((p, c), EMPTY):>{width}}" for c in cols))
    col_labels = [f"{c} {label[c]}" for c in cols if c in label]
    if d.nxn and col_labels:
        out.append("egress: " + ", ".join(col_labels))
    legend = [f"{m} = {j}" for j, m in marks.items()]
    if any(not lk.job_id for lk in d.links):
        legend.append(f"{NO_JOB} = no job")
    if legend:
        out.append("cross-connects: " + ", ".join(legend) + f"; {EMPTY} = none")
    return "\n".join(out)


def _q(text: str) -> str:
    """``text`` as a DOT quoted string."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def dot(d: SwitchDrawing) -> str:
    """``d`` as a Graphviz graph: a ``digraph`` of ingress -> egress nodes (clusters left and
    right) for N x N, an undirected ``graph`` of ports for duplex; a node per port drawn (every
    port, or those in use on a large switch), labelled with its endpoint; an edge per
    cross-connect, labelled with its job."""
    label = {pl.port: pl.endpoint for pl in d.labels}
    rows, cols = _axes(d)
    arrow = "->" if d.nxn else "--"
    out = [f"{'digraph' if d.nxn else 'graph'} {_q(d.switch_id)} {{",
           "  rankdir=LR;",
           f"  label={_q(f'{d.switch_id}: {len(d.links)} cross-connect(s)')};",
           "  node [shape=box, fontsize=10];"]

    def node(p: int) -> str:
        text = f"{p}\n{label[p]}" if p in label else str(p)
        return f"    p{p} [label={_q(text)}];"

    if d.nxn:
        for name, ports in (("ingress", rows), ("egress", cols)):
            out.append(f"  subgraph cluster_{name} {{")
            out.append(f"    label={_q(name)};")
            out.extend(node(p) for p in ports)
            out.append("  }")
    else:
        out.extend(node(p)[2:] for p in sorted(set(rows) | set(cols)))
    for lk in sorted(d.links, key=lambda x: (x.ingress, x.egress)):
        attrs = f" [label={_q(lk.job_id)}]" if lk.job_id else ""
        out.append(f"  p{lk.ingress} {arrow} p{lk.egress}{attrs};")
    out.append("}")
    return "\n".join(out) + "\n"
