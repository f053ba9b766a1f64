"""The shared retry pacing (``lightrail.controller.domain.timing``): exponential growth, the cap,
jitter from an injected random source, the stateful retry counter and its reset."""

from __future__ import annotations

import pytest

from lightrail.controller.domain.timing import Backoff, BackoffState


def test_delays_double_up_to_the_cap() -> None:
    b = Backoff(initial_s=0.05, max_s=1.0)
    assert [b.delay_s(n) for n in range(7)] == pytest.approx(
        [0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0])


def test_other_multiplier_and_a_cap_below_the_first_wait() -> None:
    assert [Backoff(initial_s=1.0, max_s=100.0, multiplier=3.0).delay_s(n)
            for n in range(4)] == [1.0, 3.0, 9.0, 27.0]
    assert Backoff(initial_s=2.0, max_s=0.5).delay_s(0) == 0.5


def test_huge_attempt_counts_stay_at_the_cap() -> None:
    assert Backoff(initial_s=0.1, max_s=2.0).delay_s(10**6) == 2.0
    assert Backoff(initial_s=0.0, max_s=2.0).delay_s(10**6) == 0.0
    assert Backoff(initial_s=0.1, max_s=2.0, multiplier=1.0).delay_s(10**6) == 0.1


def test_no_jitter_draws_nothing() -> None:
    def draw() -> float:
        raise AssertionError("drew a random number without jitter")

    assert Backoff(initial_s=0.2, max_s=1.0).delay_s(1, draw) == 0.4


def test_jitter_scales_the_wait_by_the_drawn_number() -> None:
    b = Backoff(initial_s=1.0, max_s=8.0, jitter=0.5)
    assert b.delay_s(2, lambda: 0.0) == 4.0
    assert b.delay_s(2, lambda: 0.5) == 3.0
    assert b.delay_s(5, lambda: 0.99) == pytest.approx(8.0 * (1 - 0.495))
    full = Backoff(initial_s=1.0, max_s=8.0, jitter=1.0)
    assert full.delay_s(3, lambda: 0.25) == 6.0


@pytest.mark.parametrize(
    "kwargs",
    [{"initial_s": -0.1}, {"max_s": -1.0}, {"multiplier": 0.5}, {"jitter": 1.5},
     {"jitter": -0.1}, {"initial_s": float("nan")}],
)
def test_invalid_policies_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="Backoff"):
        Backoff(**kwargs)


def test_negative_attempt_is_refused() -> None:
    with pytest.raises(ValueError, match="attempt"):
        Backoff().delay_s(-1)


def test_state_counts_retries_and_resets() -> None:
    state = BackoffState(Backoff(initial_s=0.05, max_s=0.2))
    assert [state.next_s() for _ in range(4)] == pytest.approx([0.05, 0.1, 0.2, 0.2])
    assert state.attempt == 4
    state.reset()
    assert state.attempt == 0
    assert state.next_s() == 0.05


def test_state_draws_from_its_injected_source() -> None:
    draws = iter([0.0, 1.0 - 2**-53, 0.5])
    state = BackoffState(Backoff(initial_s=1.0, max_s=10.0, jitter=1.0),
                         draw=lambda: next(draws))
    assert state.next_s() == 1.0
    assert state.next_s() == pytest.approx(0.0, abs=1e-12)
    assert state.next_s() == 2.0
