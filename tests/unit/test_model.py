"""The domain model's value types: phase keys order totally and compare as they hash."""

from __future__ import annotations

import itertools

import pytest

from lightrail.controller.domain.model import Collective, PhaseKey, ProcessGroup


def test_phase_keys_of_one_group_with_different_collectives_sort() -> None:
    group = ProcessGroup.of([0, 1, 2, 3])
    keys = [PhaseKey(group, c) for c in Collective]
    ordered = sorted(keys)
    assert [k.collective.value for k in ordered] == sorted(c.value for c in Collective)
    assert min(keys).collective.value == min(c.value for c in Collective)


def test_phase_key_order_is_group_then_collective_then_seq_then_step() -> None:
    small, large = ProcessGroup.of([0, 1]), ProcessGroup.of([0, 2])
    keys = [
        PhaseKey(g, c, seq, step)
        for g, c, seq, step in itertools.product(
            (large, small), (Collective.SEND_RECV, Collective.ALL_REDUCE), (1, 0), (1, 0))
    ]
    ordered = sorted(keys)
    assert [(k.group.ranks, k.collective.value, k.seq, k.step) for k in ordered] == sorted(
        (k.group.ranks, k.collective.value, k.seq, k.step) for k in keys)
    for a, b in itertools.combinations(ordered, 2):
        assert a < b and a <= b and b > a and b >= a and a != b
    same = PhaseKey(ProcessGroup.of([1, 0]), Collective.SEND_RECV, 1, 1)
    twin = PhaseKey(ProcessGroup.of([0, 1]), Collective.SEND_RECV, 1, 1)
    assert same == twin and hash(same) == hash(twin) and same <= twin and not same < twin


def test_a_phase_key_does_not_order_against_other_types() -> None:
    key = PhaseKey(ProcessGroup.of([0, 1]), Collective.ALL_REDUCE)
    with pytest.raises(TypeError):
        _ = key < (0, 1)  # type: ignore[operator]
