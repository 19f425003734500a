"""When an attempt tries a database call again after a blip, and how it knows a write it cannot see landed.

An attempt that meets a transient database fault (`db_faults.classify_database_error`) does not fail: it waits a
bounded, jittered, exponentially growing delay and tries again, for as long as the try would still start before
its last moment for a fenced write (S-25: `database.timeout` before the local lease deadline, which moves with
every confirmed renewal). Past that point it gives up and the attempt ends as it did before (`attempt_failed`, or
no write at all once the deadline is near): an outage shorter than the window costs nothing; a longer one costs
what a lost lease costs.

A write whose outcome is unknown (the connection broke after the statement was sent) may have committed. Before
trying it again the attempt reads whether its own write is there (`own_attempt_end_landed`, the checkpoint row of
its next `seq` and attempt number), so it neither writes twice nor mistakes its own write for a lost lease.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from .db_faults import DatabaseFault

__all__ = ("StoreRetryPolicy", "DEFAULT_STORE_RETRY", "store_retry_delay", "next_store_retry", "own_end_landed")


@dataclass(frozen=True, kw_only=True, slots=True)
class StoreRetryPolicy:
    """Backoff of an attempt's database retries: `first_seconds · 2^(tries − 1)`, capped at `max_seconds`, of
    which a random share of up to `jitter` is taken off (so workers that lost the database together do not all
    come back in the same millisecond)."""

    first_seconds: float = 0.05
    max_seconds: float = 2.0
    jitter: float = 0.5

    def __post_init__(self) -> None:
        if not (0 < self.first_seconds <= self.max_seconds):
            raise ValueError("need 0 < first_seconds <= max_seconds")
        if not (0 <= self.jitter < 1):
            raise ValueError("need 0 <= jitter < 1")


DEFAULT_STORE_RETRY: Final = StoreRetryPolicy()
"""50 ms, 100 ms, 200 ms … 2 s: a 0.3 s server restart costs four or five tries; a 10 s outage about ten."""


def store_retry_delay(tries: int, policy: StoreRetryPolicy, random_fraction: float) -> float:
    """Seconds to wait after the `tries`-th failed try (1, 2, …); `random_fraction` in [0, 1) draws the jitter."""
    if tries < 1:
        raise ValueError(f"tries must be ≥ 1, got {tries}")
    if not (0 <= random_fraction < 1):
        raise ValueError("random_fraction must be in [0, 1)")
    exponent = min(tries - 1, 32)  # 2^32 · first_seconds is far past any cap; never build a huge float
    base = min(policy.max_seconds, policy.first_seconds * (1 << exponent))
    return base * (1 - policy.jitter * random_fraction)


def next_store_retry(
    fault: DatabaseFault | None,
    *,
    tries: int,
    now: float,
    last_start: float,
    policy: StoreRetryPolicy = DEFAULT_STORE_RETRY,
    random_fraction: float,
) -> float | None:
    """The delay before trying again after the `tries`-th failure, or None to give up: the fault is not a passing
    one (or not a database fault at all), or the next try would start after `last_start` (monotonic seconds: the
    local lease deadline less `database.timeout`, S-25)."""
    if fault is None or not fault.transient:
        return None
    delay = store_retry_delay(tries, policy, random_fraction)
    if now + delay >= last_start:
        return None
    return delay


def own_end_landed(
    attempt: Mapping[str, object] | None, *, status: str, failure_code: str | None, yield_reason: str | None = None
) -> bool:
    """Whether the attempt row shows this attempt's own ending (a seal, a recovery or a handoff it wrote, then lost
    the answer to): the status, failure code and yield reason it wrote. Another writer's ending differs: the expiry
    sweep writes `failed` with `lease_expired`, which no attempt writes for itself."""
    if attempt is None or attempt.get("status") != status:
        return False
    failure = attempt.get("failure")
    found_code = failure.get("code") if isinstance(failure, Mapping) else None
    return found_code == failure_code and attempt.get("yield_reason") == yield_reason
