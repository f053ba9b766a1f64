"""Beneš routing with the looping algorithm: every permutation of 8 ports, random permutations
of 64, every supported size, partial permutations, preferred states, tracing with lossy
elements, element indexing and input errors."""

from __future__ import annotations

import itertools
import random

import pytest

from lightrail.drivers.siph.benes import (
    MAX_PORTS,
    BenesNetwork,
    Element,
    ElementState,
    check_size,
    complete_permutation,
    route,
    simulate,
    trace,
    wiring,
)

BAR = ElementState.BAR
CROSS = ElementState.CROSS
SIZES = [2, 4, 8, 16, 32, 64]


def test_every_permutation_of_8_ports_routes_and_simulates_back() -> None:
    count = 0
    for perm in itertools.permutations(range(8)):
        states = route(8, perm)
        assert len(states) == 20
        assert simulate(8, states) == perm
        count += 1
    assert count == 40_320


@pytest.mark.parametrize("size", [2, 4])
def test_every_permutation_of_small_networks(size: int) -> None:
    for perm in itertools.permutations(range(size)):
        assert simulate(size, route(size, perm)) == perm


def test_random_permutations_of_64_ports() -> None:
    rng = random.Random(20240611)
    for _ in range(500):
        perm = list(range(64))
        rng.shuffle(perm)
        states = route(64, perm)
        assert len(states) == 11 * 32
        assert simulate(64, states) == tuple(perm)


@pytest.mark.parametrize("size", SIZES)
def test_every_size_identity_reverse_and_random(size: int) -> None:
    net = BenesNetwork(size)
    k = size.bit_length() - 1
    assert net.stages == 2 * k - 1
    assert net.element_count == (2 * k - 1) * size // 2
    rng = random.Random(size)
    perms = [list(range(size)), list(reversed(range(size)))]
    for _ in range(50):
        p = list(range(size))
        rng.shuffle(p)
        perms.append(p)
    for perm in perms:
        states = route(size, perm)
        assert len(states) == net.element_count
        assert simulate(size, states) == tuple(perm)


def test_two_port_network_is_one_element() -> None:
    assert route(2, [0, 1]) == (BAR,)
    assert route(2, [1, 0]) == (CROSS,)
    assert simulate(2, (CROSS,)) == (1, 0)


def test_identity_routes_to_all_bar() -> None:
    # the looping algorithm sends every even input up: bar everywhere reproduces the identity
    assert set(route(16, list(range(16)))) == {BAR}


def test_element_indexing_is_stage_major() -> None:
    net = BenesNetwork(8)
    assert (net.stages, net.rows, net.element_count) == (5, 4, 20)
    assert net.element(0) == Element(0, 0)
    assert net.element(5) == Element(1, 1)
    assert net.element(19) == Element(4, 3)
    for channel in range(net.element_count):
        assert net.channel(net.element(channel)) == channel
    assert net.input_element(5) == 2
    assert net.output_element(5) == 4 * 4 + 2
    with pytest.raises(ValueError, match="channel"):
        net.element(20)
    with pytest.raises(ValueError, match="element"):
        net.channel(Element(5, 0))


def test_wiring_is_inverse_shuffle_then_shuffle() -> None:
    # B(4): 2r+b -> b*2+r into the middle stage, and back out
    assert wiring(4) == ((0, 2, 1, 3), (0, 2, 1, 3))
    w8 = wiring(8)
    assert w8[0] == (0, 4, 1, 5, 2, 6, 3, 7)
    assert w8[1] == (0, 2, 1, 3, 4, 6, 5, 7)  # inverse shuffle inside each half
    assert w8[2] == (0, 2, 1, 3, 4, 6, 5, 7)  # shuffle inside each half
    assert w8[3] == (0, 2, 4, 6, 1, 3, 5, 7)


def test_partial_permutation_completes_with_lowest_unused_outputs() -> None:
    partial = {0: 5, 3: 0}
    full = complete_permutation(8, partial)
    # inputs 1, 2, 4, 5, 6, 7 take the unused outputs 1, 2, 3, 4, 6, 7 in ascending order
    assert full == (5, 1, 2, 0, 3, 4, 6, 7)
    states = route(8, partial)
    assert states == route(8, full)
    assert simulate(8, states) == full


def test_partial_permutation_prefers_the_hint_when_unused() -> None:
    hint: list[int | None] = [None, 5, 2, None, 7, None, None, 1]
    full = complete_permutation(8, {0: 5, 3: 0}, hint)
    # input 1's hint (5) is taken by input 0; inputs 2, 4, 7 keep their hints
    assert full == (5, 3, 2, 0, 7, 4, 6, 1)


@pytest.mark.parametrize("size", SIZES)
def test_random_partial_permutations(size: int) -> None:
    rng = random.Random(size * 7)
    for _ in range(50):
        used = rng.randint(0, size)
        inputs = rng.sample(range(size), used)
        outputs = rng.sample(range(size), used)
        partial = dict(zip(inputs, outputs, strict=True))
        realised = simulate(size, route(size, partial))
        assert all(realised[i] == o for i, o in partial.items())
        assert sorted(realised) == list(range(size))


@pytest.mark.parametrize("size", [4, 8, 16, 64])
def test_prefer_reproduces_any_valid_routing(size: int) -> None:
    # routing with a random preference yields some valid routing R of the permutation;
    # routing the same permutation preferring R must give R exactly (no element moves)
    rng = random.Random(size + 1)
    net = BenesNetwork(size)
    for _ in range(30):
        perm = list(range(size))
        rng.shuffle(perm)
        noise = [rng.choice([BAR, CROSS, None]) for _ in range(net.element_count)]
        some = route(size, perm, prefer=noise)
        assert simulate(size, some) == tuple(perm)
        assert route(size, perm, prefer=some) == some


def test_prefer_keeps_most_elements_on_a_small_change() -> None:
    rng = random.Random(3)
    perm = list(range(64))
    rng.shuffle(perm)
    before = route(64, perm)
    perm[0], perm[1] = perm[1], perm[0]
    after = route(64, perm, prefer=before)
    assert simulate(64, after) == tuple(perm)
    moved = sum(a != b for a, b in zip(before, after, strict=True))
    assert moved < len(before) // 4


def test_trace_drops_light_at_undefined_elements() -> None:
    states: list[ElementState | None] = list(route(8, list(range(8))))
    states[1] = None  # first-stage element of inputs 2 and 3
    paths = trace(8, states)
    assert [p.output for p in paths] == [0, 1, None, None, 4, 5, 6, 7]
    assert paths[2].channels == (1,)
    assert paths[0].channels[0] == 0 and len(paths[0].channels) == 5


def test_trace_agrees_with_simulate() -> None:
    rng = random.Random(11)
    for size in SIZES:
        perm = list(range(size))
        rng.shuffle(perm)
        states = route(size, perm)
        assert tuple(p.output for p in trace(size, states)) == simulate(size, states)


@pytest.mark.parametrize("size", [0, 1, 3, 6, 12, 128, -4])
def test_bad_size_names_the_field(size: int) -> None:
    with pytest.raises(ValueError, match="size"):
        check_size(size)
    with pytest.raises(ValueError, match="size"):
        route(size, list(range(max(size, 0))))


def test_max_ports_is_64() -> None:
    assert MAX_PORTS == 64
    with pytest.raises(ValueError, match="size"):
        BenesNetwork(128)


def test_non_permutations_name_the_field() -> None:
    with pytest.raises(ValueError, match=r"permutation: output 3 appears twice \(inputs 0 and 1\)"):
        route(4, [3, 3, 0, 1])
    with pytest.raises(ValueError, match=r"permutation: input 2 -> output 4 not in 0\.\.3"):
        route(4, [0, 1, 4, 2])
    with pytest.raises(ValueError, match="permutation: expected 4 outputs"):
        route(4, [0, 1, 2])
    with pytest.raises(ValueError, match="partial: output 1 appears twice"):
        route(4, {0: 1, 2: 1})
    with pytest.raises(ValueError, match="partial: input 7"):
        route(4, {7: 1})
    with pytest.raises(ValueError, match="prefer: expected 6 element states"):
        route(4, [0, 1, 2, 3], prefer=[BAR])
    with pytest.raises(ValueError, match="states: expected 6 element states"):
        simulate(4, [BAR, BAR])
    with pytest.raises(ValueError, match="hint: expected 4 entries"):
        complete_permutation(4, {}, [None])
