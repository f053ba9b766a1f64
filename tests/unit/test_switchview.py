"""The picture of a switch's cross-connects (``lightrail switch show``): text matrix and DOT."""

from __future__ import annotations

import re

from lightrail.controller.cli.switchview import (
    EMPTY,
    NO_JOB,
    Link,
    PortLabel,
    SwitchDrawing,
    dot,
    text_matrix,
)


def _cells(text: str) -> dict[int, list[str]]:
    """Row port -> its cells, from the matrix lines ("P ... | c c c")."""
    out: dict[int, list[str]] = {}
    for line in text.splitlines():
        m = re.match(r"^\s*(\d+)\b[^|]*\|(.*)$", line)
        if m:
            out[int(m.group(1))] = m.group(2).split()
    return out


def test_nxn_rows_are_ingress_columns_egress_and_jobs_get_letters() -> None:
    d = SwitchDrawing("sw", "nxn", 3, [Link(1, 5, "b-job"), Link(2, 4, "a-job"), Link(3, 6)],
                      [PortLabel(1, "h0/nic0"), PortLabel(4, "h0/nic0")])
    text = text_matrix(d)
    assert text.splitlines()[0] == "sw (3x3 N x N): 3 cross-connect(s)"
    header = next(ln for ln in text.splitlines() if ln.startswith("ingress \\ egress"))
    assert header.split("|")[1].split() == ["4", "5", "6"]
    assert _cells(text) == {1: [EMPTY, "B", EMPTY], 2: ["A", EMPTY, EMPTY],
                            3: [EMPTY, EMPTY, NO_JOB]}
    assert "1 h0/nic0" in text and "egress: 4 h0/nic0" in text
    assert "A = a-job, B = b-job, X = no job" in text


def test_duplex_marks_both_cells_of_a_cross_connect() -> None:
    d = SwitchDrawing("dx", "duplex", 4, [Link(1, 3, "j")])
    cells = _cells(text_matrix(d))
    assert cells[1][2] == "A" and cells[3][0] == "A"
    assert sum(c != EMPTY for row in cells.values() for c in row) == 2
    assert sorted(cells) == [1, 2, 3, 4]


def test_large_switches_draw_only_the_ports_in_use_and_say_so() -> None:
    d = SwitchDrawing("big", "nxn", 64, [Link(3, 70), Link(9, 65, "j")])
    text = text_matrix(d)
    assert "large switch (128 ports): only the 2 row and 2 column ports in use" in text
    assert sorted(_cells(text)) == [3, 9]
    assert text.count("\n") < 10
    small = SwitchDrawing("small", "nxn", 63, [Link(3, 70)])
    assert "large switch" not in text_matrix(small) and len(_cells(text_matrix(small))) == 63


def test_an_empty_switch_still_draws_its_ports() -> None:
    text = text_matrix(SwitchDrawing("e", "nxn", 2, []))
    assert _cells(text) == {1: [EMPTY, EMPTY], 2: [EMPTY, EMPTY]}
    assert "cross-connects:" not in text  # no legend without cross-connects


def test_dot_is_a_directed_graph_for_nxn_and_undirected_for_duplex() -> None:
    nxn = dot(SwitchDrawing("ocs \"0\"", "nxn", 2, [Link(1, 4, "job")],
                            [PortLabel(1, "h0/nic0")]))
    assert nxn.startswith('digraph "ocs \\"0\\"" {') and nxn.rstrip().endswith("}")
    assert "subgraph cluster_ingress" in nxn and "subgraph cluster_egress" in nxn
    assert 'p1 [label="1\\nh0/nic0"];' in nxn
    assert 'p1 -> p4 [label="job"];' in nxn
    assert nxn.count("{") == nxn.count("}")
    duplex = dot(SwitchDrawing("d", "duplex", 4, [Link(1, 2)]))
    assert duplex.startswith('graph "d" {') and "p1 -- p2;" in duplex and "->" not in duplex
    assert len(re.findall(r"^  p\d+ \[label", duplex, re.M)) == 4


def test_dot_of_a_large_switch_has_only_ports_in_use() -> None:
    text = dot(SwitchDrawing("big", "duplex", 200, [Link(5, 150)]))
    assert sorted(map(int, re.findall(r"^  p(\d+) \[", text, re.M))) == [5, 150]
