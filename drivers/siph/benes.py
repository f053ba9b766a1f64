"""Beneš network routing for silicon-photonic MZI switch meshes (pure, no I/O).

A Beneš network B(N) (V. E. Beneš, *Mathematical Theory of Connecting Networks and Telephone
Traffic*, Academic Press 1965; "Optimal rearrangeable multistage connecting networks", Bell System
Technical Journal 43(4), 1964) connects N = 2**k inputs to N outputs through ``2k - 1`` stages
of ``N/2`` 2x2 elements. It is *rearrangeable non-blocking*: every permutation can be realised,
but changing one connection may require re-routing others. This module computes element states
with the *looping algorithm* (D. C. Opferman and N. T. Tsao-Wu, "On a class of rearrangeable
switching networks", Bell System Technical Journal 50(5), 1971; A. Waksman, "A permutation
network", J. ACM 15(1), 1968), and simulates a network to verify a routing.

Numbering (0-based throughout this module; the driver maps canonical ports to it):

- *lines*: inputs and outputs 0..N-1. Element ``(stage, row)`` takes lines ``2*row`` (its upper
  port) and ``2*row + 1`` (its lower port) of the stage's input side.
- *elements*: ``Element(stage, row)`` with ``stage`` 0..2k-2 from inputs to outputs and ``row``
  0..N/2-1 from top to bottom. The flat *channel* index is ``stage * N/2 + row`` (the order of
  heater channels on the device and of every state tuple here).
- *states*: ``BAR`` joins upper-in to upper-out and lower-in to lower-out; ``CROSS`` swaps them.
- *wiring*: B(N) is an input stage, two B(N/2) sub-networks (upper: element rows 0..N/4-1 of the
  inner stages, lower: rows N/4..N/2-1) and an output stage. The upper output of input element
  ``r`` feeds input ``r`` of the upper sub-network, its lower output input ``r`` of the lower one
  (an inverse perfect shuffle of the lines, ``2r + b -> b*N/2 + r``); the output side mirrors it
  (a perfect shuffle). Recursing gives stage boundary ``s`` (``s < k-1``) an inverse shuffle in
  blocks of ``N >> s`` lines and boundary ``s >= k-1`` a shuffle in blocks of ``N >> (2k-3-s)``.

Partial permutations are completed before routing: an input without a given output is joined to
an unused output, first the one ``hint`` proposes (if it is unused), then the lowest unused
outputs in ascending input order (``complete_permutation``).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

MIN_PORTS = 2
"""Smallest network: one element."""
MAX_PORTS = 64
"""Largest supported network (11 stages of 32 elements, 352 elements)."""


class ElementState(enum.Enum):
    """State of one 2x2 element."""

    BAR = "bar"
    """Upper-in to upper-out, lower-in to lower-out."""
    CROSS = "cross"
    """Upper-in to lower-out, lower-in to upper-out."""


@dataclass(frozen=True, slots=True, order=True)
class Element:
    """One 2x2 element: ``stage`` 0..2k-2 (inputs to outputs), ``row`` 0..N/2-1 (top down)."""

    stage: int
    row: int

    def __str__(self) -> str:
        return f"element(stage={self.stage}, row={self.row})"


@dataclass(frozen=True, slots=True)
class LightPath:
    """Where the light entering ``input`` goes: ``output`` (None when it meets an element in an
    undefined state and is lost) and the channels of the elements it passes, in order."""

    input: int
    output: int | None
    channels: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class BenesNetwork:
    """The shape of a Beneš network with ``size`` = N inputs (a power of two, 2..64).

    Raises ``ValueError`` naming ``size`` when it is not such a power of two.
    """

    size: int

    def __post_init__(self) -> None:
        check_size(self.size)

    @property
    def order(self) -> int:
        """k = log2(N)."""
        return self.size.bit_length() - 1

    @property
    def stages(self) -> int:
        """Number of stages, 2k - 1."""
        return 2 * self.order - 1

    @property
    def rows(self) -> int:
        """Elements per stage, N/2."""
        return self.size // 2

    @property
    def element_count(self) -> int:
        """Elements in the network, (2k - 1) * N/2."""
        return self.stages * self.rows

    def element(self, channel: int) -> Element:
        """The element of flat ``channel``; ``ValueError`` when out of range."""
        if not 0 <= channel < self.element_count:
            raise ValueError(f"channel: {channel} not in 0..{self.element_count - 1}")
        return Element(channel // self.rows, channel % self.rows)

    def channel(self, element: Element) -> int:
        """The flat channel index of ``element``; ``ValueError`` when it does not exist."""
        if not (0 <= element.stage < self.stages and 0 <= element.row < self.rows):
            raise ValueError(f"element: {element} not in a {self.size}-port network")
        return element.stage * self.rows + element.row

    def input_element(self, line: int) -> int:
        """Channel of the first-stage element input ``line`` enters."""
        return line // 2

    def output_element(self, line: int) -> int:
        """Channel of the last-stage element output ``line`` leaves."""
        return (self.stages - 1) * self.rows + line // 2


def check_size(size: int) -> int:
    """Return k = log2(``size``); ``ValueError`` naming ``size`` unless it is a power of two in
    ``MIN_PORTS..MAX_PORTS``."""
    if (
        isinstance(size, bool)
        or not isinstance(size, int)
        or size < MIN_PORTS
        or size > MAX_PORTS
        or size & (size - 1)
    ):
        raise ValueError(
            f"size: must be a power of two in {MIN_PORTS}..{MAX_PORTS}, got {size!r}"
        )
    return size.bit_length() - 1


def _wiring(size: int) -> tuple[tuple[int, ...], ...]:
    """``wiring[s][line]``: the input line of stage s+1 that output ``line`` of stage s feeds."""
    k = check_size(size)
    stages = 2 * k - 1
    out: list[tuple[int, ...]] = []
    for s in range(stages - 1):
        block = size >> s if s < k - 1 else size >> (2 * k - 3 - s)
        half = block // 2
        table = [0] * size
        for line in range(size):
            base, j = divmod(line, block)
            if s < k - 1:  # inverse perfect shuffle: 2r + b -> b*half + r
                r, b = divmod(j, 2)
                table[line] = base * block + b * half + r
            else:  # perfect shuffle: b*half + r -> 2r + b
                b, r = divmod(j, half)
                table[line] = base * block + 2 * r + b
        out.append(tuple(table))
    return tuple(out)


_WIRING: dict[int, tuple[tuple[int, ...], ...]] = {}


def wiring(size: int) -> tuple[tuple[int, ...], ...]:
    """Inter-stage wiring of B(``size``) (cached): ``wiring(N)[s][line]`` is the input line of
    stage ``s + 1`` fed by output ``line`` of stage ``s``. ``ValueError`` for a bad size."""
    table = _WIRING.get(size)
    if table is None:
        table = _WIRING[size] = _wiring(size)
    return table


def check_permutation(size: int, permutation: Sequence[int]) -> None:
    """``ValueError`` naming ``permutation`` unless it is a full permutation of 0..size-1
    (``permutation[i]`` is the output of input ``i``)."""
    check_size(size)
    if len(permutation) != size:
        raise ValueError(
            f"permutation: expected {size} outputs (one per input), got {len(permutation)}"
        )
    seen: dict[int, int] = {}
    for i, o in enumerate(permutation):
        if isinstance(o, bool) or not isinstance(o, int) or not 0 <= o < size:
            raise ValueError(f"permutation: input {i} -> output {o!r} not in 0..{size - 1}")
        if o in seen:
            raise ValueError(
                f"permutation: output {o} appears twice (inputs {seen[o]} and {i})"
            )
        seen[o] = i


def complete_permutation(
    size: int, partial: Mapping[int, int], hint: Sequence[int | None] | None = None
) -> tuple[int, ...]:
    """A full permutation extending ``partial`` (input -> output, 0-based).

    Every input missing from ``partial`` gets ``hint[input]`` when that output is unused (the
    driver passes the outputs inputs reach now, so idle paths stay put), otherwise the lowest
    unused output, inputs taken in ascending order. Raises ``ValueError`` naming ``partial``
    (input or output out of range, an output used twice) or ``hint`` (wrong length).
    """
    check_size(size)
    used: dict[int, int] = {}
    for i, o in partial.items():
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < size:
            raise ValueError(f"partial: input {i!r} not in 0..{size - 1}")
        if isinstance(o, bool) or not isinstance(o, int) or not 0 <= o < size:
            raise ValueError(f"partial: input {i} -> output {o!r} not in 0..{size - 1}")
        if o in used:
            raise ValueError(f"partial: output {o} appears twice (inputs {used[o]} and {i})")
        used[o] = i
    if hint is not None and len(hint) != size:
        raise ValueError(f"hint: expected {size} entries, got {len(hint)}")
    out: list[int | None] = [partial.get(i) for i in range(size)]
    if hint is not None:
        for i in range(size):
            h = hint[i]
            if out[i] is None and h is not None and 0 <= h < size and h not in used:
                out[i] = h
                used[h] = i
    free = iter(o for o in range(size) if o not in used)
    return tuple(o if o is not None else next(free) for o in out)


def route(
    size: int,
    permutation: Sequence[int] | Mapping[int, int],
    prefer: Sequence[ElementState | None] | None = None,
) -> tuple[ElementState, ...]:
    """Element states (by channel) that realise ``permutation`` on B(``size``).

    ``permutation`` is a full permutation as a sequence (``permutation[i]`` = output of input
    ``i``) or a partial one as a mapping, completed by ``complete_permutation`` (no hint).
    ``prefer`` (by channel, None = no preference) are the states the device holds now: of the
    two ways to route each cycle of the looping algorithm, the one agreeing with more of them is
    taken, so an unchanged permutation routes to exactly ``prefer`` when ``prefer`` realises it,
    and a small change moves few elements (a heuristic, not a minimum).

    Looping algorithm (Opferman & Tsao-Wu 1971) on a block of M lines: the two inputs of an
    input element must use different sub-networks, and so must the two outputs of an output
    element. Starting from an unrouted input element, send its upper input through the upper
    sub-network; the output it reaches forces its element partner to come from the lower one,
    whose input forces its own partner up, and so on until the cycle closes; repeat for every
    cycle, then recurse into both sub-networks with the induced permutations. O(N log N).

    Raises ``ValueError`` naming ``size``, ``permutation``/``partial`` or ``prefer``.
    """
    check_size(size)
    perm = (
        complete_permutation(size, permutation)
        if isinstance(permutation, Mapping)
        else tuple(permutation)
    )
    check_permutation(size, perm)
    net = BenesNetwork(size)
    pref: list[int] | None = None
    if prefer is not None:
        if len(prefer) != net.element_count:
            raise ValueError(
                f"prefer: expected {net.element_count} element states, got {len(prefer)}"
            )
        pref = [-1 if p is None else int(p is ElementState.CROSS) for p in prefer]
    cross = [False] * net.element_count
    _route_block(list(perm), 0, 0, net.stages, net.rows, cross, pref)
    return tuple(ElementState.CROSS if c else ElementState.BAR for c in cross)


def _route_block(
    perm: list[int],
    stage: int,
    row0: int,
    stages: int,
    rows: int,
    cross: list[bool],
    pref: list[int] | None,
) -> None:
    m = len(perm)
    if m == 2:
        cross[stage * rows + row0] = perm[0] == 1
        return
    in_base = stage * rows + row0
    out_base = (stages - 1 - stage) * rows + row0
    inv = [0] * m
    for i, o in enumerate(perm):
        inv[o] = i
    side = [-1] * m  # 0: upper sub-network, 1: lower
    for start in range(0, m, 2):
        if side[start] != -1:
            continue
        cycle = _close_cycle(start, perm, inv, side)
        if pref is not None and _flip_agrees_more(cycle, perm, pref, in_base, out_base):
            for i in cycle:
                side[i] = 1
                side[i ^ 1] = 0
    half = m // 2
    upper = [0] * half
    lower = [0] * half
    for r in range(half):
        cross[in_base + r] = side[2 * r] == 1
        cross[out_base + r] = side[inv[2 * r]] == 1
    for i, o in enumerate(perm):
        if side[i] == 0:
            upper[i // 2] = o // 2
        else:
            lower[i // 2] = o // 2
    _route_block(upper, stage + 1, row0, stages, rows, cross, pref)
    _route_block(lower, stage + 1, row0 + half // 2, stages, rows, cross, pref)


def _close_cycle(start: int, perm: Sequence[int], inv: Sequence[int], side: list[int]) -> list[int]:
    """Route the looping algorithm's cycle through input ``start``: mark each input sent
    through the upper sub-network (``side`` 0) and its element partner lower (1), following
    output partners (``inv``: output -> input) until the cycle closes. Returns the upper
    inputs, in order."""
    cycle: list[int] = []
    i = start
    while side[i] == -1:
        side[i] = 0
        side[i ^ 1] = 1
        cycle.append(i)
        i = inv[perm[i] ^ 1] ^ 1
    return cycle


def _flip_agrees_more(
    cycle: Sequence[int], perm: Sequence[int], pref: Sequence[int], in_base: int, out_base: int
) -> bool:
    """True when ``cycle`` routed as marked (its inputs upper) disagrees with more of the
    preferred states ``pref`` (by channel: 1 CROSS, 0 BAR, -1 none) of the block's input
    elements (from channel ``in_base``) and output elements (from ``out_base``) than it agrees
    with: the other way round agrees with more of them."""
    agree = disagree = 0
    for i in cycle:
        # canonical: input element i//2 is CROSS iff i is its lower input; output
        # element perm[i]//2 is CROSS iff perm[i] is its lower output
        for channel, want in (
            (in_base + i // 2, i & 1),
            (out_base + perm[i] // 2, perm[i] & 1),
        ):
            p = pref[channel]
            if p == want:
                agree += 1
            elif p != -1:
                disagree += 1
    return disagree > agree


def _check_states(net: BenesNetwork, states: Sequence[object]) -> None:
    if len(states) != net.element_count:
        raise ValueError(
            f"states: expected {net.element_count} element states for {net.size} ports, "
            f"got {len(states)}"
        )


def simulate(size: int, states: Sequence[ElementState]) -> tuple[int, ...]:
    """The permutation element ``states`` (by channel) realise: ``result[i]`` is the output
    light entering input ``i`` leaves by. Raises ``ValueError`` naming ``size`` or ``states``
    (wrong length, an entry that is not an ``ElementState``)."""
    net = BenesNetwork(size)
    _check_states(net, states)
    rows = net.rows
    crossed: list[bool] = []
    for n, state in enumerate(states):
        if not isinstance(state, ElementState):
            raise ValueError(f"states[{n}]: {state!r} is not an ElementState")
        crossed.append(state is ElementState.CROSS)
    links = wiring(size)
    last = net.stages - 1
    out = [0] * size
    for i in range(size):
        line = i
        for s in range(net.stages):
            if crossed[s * rows + line // 2]:
                line ^= 1
            if s < last:
                line = links[s][line]
        out[i] = line
    return tuple(out)


def trace(size: int, states: Sequence[ElementState | None]) -> tuple[LightPath, ...]:
    """The light path of every input through element ``states`` (by channel), where None is an
    element in an undefined (lossy) state: light reaching it is lost (``output`` None). Raises
    ``ValueError`` naming ``size`` or ``states``."""
    net = BenesNetwork(size)
    _check_states(net, states)
    rows = net.rows
    links = wiring(size)
    last = net.stages - 1
    paths: list[LightPath] = []
    for i in range(size):
        line = i
        channels: list[int] = []
        output: int | None = None
        for s in range(net.stages):
            channel = s * rows + line // 2
            channels.append(channel)
            state = states[channel]
            if state is None:
                break
            if state is ElementState.CROSS:
                line ^= 1
            if s < last:
                line = links[s][line]
            else:
                output = line
        paths.append(LightPath(i, output, tuple(channels)))
    return tuple(paths)
