"""Retry delays of runs (§7.6) and outbox rows (§9.2)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from candor.service.protocol.backoff import (
    is_unsettled_at_claim,
    outbox_backoff_seconds,
    outbox_failure_settlement,
    run_retry_delay,
)


@pytest.mark.parametrize(
    ("attempts", "delay"),
    [(0, 1), (1, 1), (2, 2), (3, 4), (4, 8), (5, 16), (6, 32), (7, 60), (8, 60), (20, 60), (10_000, 60)],
)
def test_run_retry_delay(attempts, delay):
    """S-31: min(60, 2^max(0, attempts − 1)) seconds, no jitter."""
    assert run_retry_delay(attempts) == delay


@given(st.integers(0, 10_000))
def test_run_retry_delay_is_deterministic_and_bounded(attempts):
    """S-31: no jitter, between 1 and 60 seconds, never decreasing with attempts."""
    assert run_retry_delay(attempts) == min(60, 2 ** max(0, attempts - 1))
    assert 1 <= run_retry_delay(attempts) <= 60
    assert run_retry_delay(attempts + 1) >= run_retry_delay(attempts)


class _FixedUniform(random.Random):
    def __init__(self, fraction: float) -> None:
        super().__init__(0)
        self.fraction = fraction

    def uniform(self, a: float, b: float) -> float:
        return a + (b - a) * self.fraction


@pytest.mark.parametrize(
    ("attempts", "fraction", "seconds"),
    [
        (1, 1.0, 2.0),
        (1, 0.0, 1.6),
        (2, 1.0, 4.0),
        (3, 0.5, 8 * 0.9),
        (11, 1.0, 2048.0),
        (12, 1.0, 3600.0),
        (12, 0.0, 2880.0),
        (100, 1.0, 3600.0),
    ],
)
def test_outbox_backoff_table(attempts, fraction, seconds):
    """S-109: min(3600, 2^attempts) × U(0.8, 1.0)."""
    assert outbox_backoff_seconds(attempts, _FixedUniform(fraction)) == pytest.approx(seconds)


@given(st.integers(0, 10_000), st.integers(0, 2**32))
def test_outbox_backoff_bounds(attempts, seed):
    """S-109: every delay lies within [0.8, 1.0] × min(3600, 2^attempts), and a seed reproduces it."""
    base = min(3600, 2 ** min(attempts, 20))
    delay = outbox_backoff_seconds(attempts, random.Random(seed))
    assert 0.8 * base <= delay <= base
    assert delay == outbox_backoff_seconds(attempts, random.Random(seed))


@pytest.mark.parametrize(
    ("attempts", "max_attempts", "settlement"),
    [(1, 12, "retry"), (11, 12, "retry"), (12, 12, "dead"), (13, 12, "dead"), (1, 1, "dead")],
)
def test_failure_at_max_attempts_is_dead(attempts, max_attempts, settlement):
    """S-109: a failure at attempts ≥ max_attempts makes the row dead, otherwise it is retried."""
    assert outbox_failure_settlement(attempts=attempts, max_attempts=max_attempts) == settlement


@pytest.mark.parametrize(("attempts", "unsettled"), [(11, False), (12, True), (13, True)])
def test_unsettled_at_claim(attempts, unsettled):
    """S-110: a row already at max_attempts when claimed becomes dead with last_error "unsettled"."""
    assert is_unsettled_at_claim(attempts=attempts, max_attempts=12) is unsettled


@pytest.mark.parametrize(
    "call",
    [
        lambda: run_retry_delay(-1),
        lambda: outbox_backoff_seconds(-1, random.Random(0)),
        lambda: outbox_failure_settlement(attempts=-1, max_attempts=3),
    ],
)
def test_negative_attempts_are_refused(call):
    """S-31, S-109: attempt counters are never negative (CHECK 0 ≤ attempts)."""
    with pytest.raises(ValueError):
        call()
