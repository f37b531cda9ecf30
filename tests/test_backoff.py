"""The one exponential backoff (``dra_exporter.backoff``): doubling, capped, jittered, reset by a success."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dra_exporter.backoff import Backoff


class Clock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


def test_waits_double_up_to_the_cap_and_a_success_starts_afresh() -> None:
    backoff = Backoff(1.0, 5.0, random=lambda: 0.5)  # 0.5: the middle of the jitter range, factor 1
    assert [backoff.failed() for _ in range(5)] == [1.0, 2.0, 4.0, 5.0, 5.0]
    assert backoff.failures == 5
    backoff.succeeded()
    assert backoff.failures == 0
    assert backoff.failed() == 1.0


@given(st.floats(0.0, 1.0, exclude_max=True), st.integers(1, 200))
def test_jitter_keeps_every_wait_within_twenty_percent_of_the_capped_doubling(r: float, failures: int) -> None:
    backoff = Backoff(0.5, 30.0, random=lambda: r)
    for _ in range(failures - 1):
        backoff.failed()
    base = min(30.0, 0.5 * 2 ** (failures - 1))
    assert base * 0.8 <= backoff.failed() <= base * 1.2


def test_jitter_spreads_the_waits_of_many_clients() -> None:
    import random

    rng = random.Random(7)
    waits = {round(Backoff(1.0, 60.0, random=rng.random).failed(), 6) for _ in range(100)}
    assert len(waits) > 90 and min(waits) >= 0.8 and max(waits) <= 1.2


def test_remaining_counts_down_on_the_injected_clock() -> None:
    clock = Clock()
    backoff = Backoff(2.0, 60.0, monotonic=clock, random=lambda: 0.0)  # factor 0.8
    assert backoff.remaining() == 0.0
    assert backoff.failed() == pytest.approx(1.6)
    clock.now += 1.0
    assert backoff.remaining() == pytest.approx(0.6)
    clock.now += 0.6
    assert backoff.remaining() == 0.0
    backoff.failed()
    backoff.succeeded()
    assert backoff.remaining() == 0.0


@pytest.mark.parametrize("initial, maximum, jitter", [
    (0.0, 1.0, 0.2), (2.0, 1.0, 0.2), (1.0, float("inf"), 0.2), (float("nan"), 1.0, 0.2), (1.0, 2.0, 1.0),
    (1.0, 2.0, -0.1),
])
def test_bad_settings_are_refused(initial: float, maximum: float, jitter: float) -> None:
    with pytest.raises(ValueError, match="backoff"):
        Backoff(initial, maximum, jitter=jitter)
