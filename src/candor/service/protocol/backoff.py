"""Retry delays for runs (§7.6, no jitter) and outbox rows (§9.2, jittered by an injected random source)."""

from __future__ import annotations

import random
from typing import Final, Literal

__all__ = (
    "RUN_RETRY_DELAY_CAP_SECONDS",
    "OUTBOX_BACKOFF_CAP_SECONDS",
    "run_retry_delay",
    "outbox_backoff_seconds",
    "outbox_failure_settlement",
    "is_unsettled_at_claim",
)

RUN_RETRY_DELAY_CAP_SECONDS: Final = 60
OUTBOX_BACKOFF_CAP_SECONDS: Final = 3600


def run_retry_delay(attempts: int) -> int:
    """S-31: seconds before a failed attempt's run is due again, ``min(60, 2^max(0, attempts − 1))``.

    ``attempts`` is the run's charged attempt count including the attempt that failed.
    """
    _check_attempts(attempts)
    exponent = max(0, attempts - 1)
    # 2^6 = 64 > 60 already; never build a huge integer for a large count.
    return RUN_RETRY_DELAY_CAP_SECONDS if exponent >= 6 else min(RUN_RETRY_DELAY_CAP_SECONDS, 2**exponent)


def outbox_backoff_seconds(attempts: int, rng: random.Random) -> float:
    """S-109: ``min(3600, 2^attempts) × U(0.8, 1.0)`` seconds; ``attempts`` is the count after the claim."""
    _check_attempts(attempts)
    base = OUTBOX_BACKOFF_CAP_SECONDS if attempts >= 12 else min(OUTBOX_BACKOFF_CAP_SECONDS, 2**attempts)
    return base * rng.uniform(0.8, 1.0)


def outbox_failure_settlement(*, attempts: int, max_attempts: int) -> Literal["retry", "dead"]:
    """S-109, §9.2: a failed delivery or handler exception is ``dead`` at ``attempts ≥ max_attempts``, else retry."""
    _check_attempts(attempts)
    return "dead" if attempts >= max_attempts else "retry"


def is_unsettled_at_claim(*, attempts: int, max_attempts: int) -> bool:
    """S-110: a row already at ``max_attempts`` when claimed (its last claim lapsed) becomes ``dead``/``unsettled``."""
    _check_attempts(attempts)
    return attempts >= max_attempts


def _check_attempts(attempts: int) -> None:
    if attempts < 0:
        raise ValueError(f"attempts must be ≥ 0, got {attempts}")
