"""The attempt's database retries: backoff, the lease window, and knowing its own write landed (issue 34 item 1)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from candor.service.protocol.db_faults import DatabaseFault
from candor.service.protocol.store_retry import (
    DEFAULT_STORE_RETRY,
    StoreRetryPolicy,
    next_store_retry,
    own_end_landed,
    store_retry_delay,
)

BLIP = DatabaseFault(kind="connection_refused", transient=True, cause="connection refused by 127.0.0.1:5432")
WRONG_PASSWORD = DatabaseFault(kind="authentication_failed", transient=False, cause="password authentication failed")


@pytest.mark.parametrize(
    ("tries", "delay"), [(1, 0.05), (2, 0.1), (3, 0.2), (4, 0.4), (5, 0.8), (6, 1.6), (7, 2.0), (50, 2.0), (10**6, 2.0)]
)
def test_delay_doubles_up_to_the_cap_without_jitter(tries: int, delay: float) -> None:
    """Issue 34 item 1: 50 ms doubling to at most 2 s (jitter drawn as 0 takes nothing off)."""
    assert store_retry_delay(tries, DEFAULT_STORE_RETRY, 0.0) == pytest.approx(delay)


@given(st.integers(1, 10_000), st.floats(0, 1, exclude_max=True))
def test_jitter_takes_off_at_most_half(tries: int, fraction: float) -> None:
    """Issue 34 item 1: the jittered delay is within [½, 1] of the base delay, never above the cap."""
    base = store_retry_delay(tries, DEFAULT_STORE_RETRY, 0.0)
    jittered = store_retry_delay(tries, DEFAULT_STORE_RETRY, fraction)
    assert base / 2 <= jittered <= base <= DEFAULT_STORE_RETRY.max_seconds


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError):
        store_retry_delay(0, DEFAULT_STORE_RETRY, 0.0)
    with pytest.raises(ValueError):
        store_retry_delay(1, DEFAULT_STORE_RETRY, 1.0)
    with pytest.raises(ValueError):
        StoreRetryPolicy(first_seconds=3, max_seconds=2)
    with pytest.raises(ValueError):
        StoreRetryPolicy(jitter=1.0)


def test_retry_only_transient_faults_and_only_inside_the_window() -> None:
    """Issue 34 item 1, S-25: a transient fault is retried while the next try starts before the last moment for a
    fenced write (local deadline less `database.timeout`); a permanent one or none at all is not retried."""
    assert next_store_retry(BLIP, tries=1, now=100.0, last_start=110.0, random_fraction=0.0) == pytest.approx(0.05)
    assert next_store_retry(BLIP, tries=7, now=100.0, last_start=102.5, random_fraction=0.0) == pytest.approx(2.0)
    # would start at it:
    assert next_store_retry(BLIP, tries=7, now=100.0, last_start=102.0, random_fraction=0.0) is None
    assert next_store_retry(BLIP, tries=1, now=100.0, last_start=99.0, random_fraction=0.0) is None  # already past
    assert next_store_retry(WRONG_PASSWORD, tries=1, now=0.0, last_start=100.0, random_fraction=0.0) is None
    assert next_store_retry(None, tries=1, now=0.0, last_start=100.0, random_fraction=0.0) is None


def test_a_short_outage_fits_the_window_of_a_default_lease() -> None:
    """Issue 34 item 1: with the default policy, tries keep coming at most 2 s apart, so an outage is survived
    whenever it ends at least 2 s before the window closes (a 0.3 s restart costs about four tries)."""
    now, tries, waited = 0.0, 0, []
    while (delay := next_store_retry(BLIP, tries=tries + 1, now=now, last_start=20.0, random_fraction=0.5)) is not None:
        tries += 1
        waited.append(delay)
        now += delay
    assert max(waited) <= 2.0 and 18.0 <= now < 20.0
    restart, elapsed, count = 0.3, 0.0, 0
    while elapsed < restart:
        count += 1
        elapsed += store_retry_delay(count, DEFAULT_STORE_RETRY, 0.0)
    assert count == 3  # 50 + 100 + 200 ms: the fourth try finds the server back


@pytest.mark.parametrize(
    ("row", "status", "code", "reason", "landed"),
    [
        (
            {"status": "failed", "failure": {"code": "attempt_failed", "message": "x"}, "yield_reason": None},
            "failed",
            "attempt_failed",
            None,
            True,
        ),
        (
            {"status": "failed", "failure": {"code": "lease_expired"}, "yield_reason": None},
            "failed",
            "attempt_failed",
            None,
            False,
        ),  # the expiry sweep's ending, not this attempt's
        ({"status": "yielded", "failure": None, "yield_reason": "handoff"}, "yielded", None, "handoff", True),
        ({"status": "running", "failure": None, "yield_reason": None}, "failed", "attempt_failed", None, False),
        (
            {"status": "cancelled", "failure": {"code": "cancelled"}, "yield_reason": None},
            "cancelled",
            "cancelled",
            None,
            True,
        ),
        (None, "failed", "attempt_failed", None, False),
    ],
)
def test_own_end_landed(
    row: dict[str, Any] | None, status: str, code: str | None, reason: str | None, landed: bool
) -> None:
    """Issue 34 item 1: a seal or recovery whose answer was lost is recognized by the ending it wrote; another
    writer's ending (the expiry sweep's `lease_expired`) is not mistaken for it."""
    assert own_end_landed(row, status=status, failure_code=code, yield_reason=reason) is landed
