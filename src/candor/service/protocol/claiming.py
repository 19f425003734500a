"""How a claimed run starts its next attempt: start reason, charge, number and lease (§7.2, §7.6)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal, assert_never

from .fencing import lease_expiry
from .transitions import AttemptStatus

__all__ = ("StartReason", "start_reason", "charges_attempt", "PreviousAttempt", "ClaimPlan", "plan_claim")

StartReason = Literal["initial", "handoff", "recovery"]


def start_reason(previous_attempt_status: AttemptStatus | None) -> StartReason:
    """S-13: ``initial`` without a previous attempt, ``handoff`` after a yield, otherwise ``recovery``."""
    if previous_attempt_status is None:
        return "initial"
    if previous_attempt_status == "yielded":
        return "handoff"
    return "recovery"


def charges_attempt(start_reason: StartReason) -> bool:
    """S-14, S-32: ``initial`` and ``recovery`` claims cost one of ``max_attempts``; handoffs are free."""
    match start_reason:
        case "initial" | "recovery":
            return True
        case "handoff":
            return False
        case _:
            assert_never(start_reason)


@dataclass(frozen=True, kw_only=True, slots=True)
class PreviousAttempt:
    """The run's attempt with the highest number, as the claim reads it."""

    id: str
    number: int
    status: AttemptStatus


@dataclass(frozen=True, kw_only=True, slots=True)
class ClaimPlan:
    """What one claim writes for one run (§7.2)."""

    number: int
    """The new attempt's number: 1 for the first, previous + 1 after."""
    start_reason: StartReason
    replaces_attempt_id: str | None
    """The previous attempt's id (S-13)."""
    charged: bool
    """Whether ``runs.attempts`` grows by one (S-14)."""
    attempts: int
    """``runs.attempts`` after the claim."""
    lease_expires_at: datetime
    """``now + worker.lease_seconds`` (S-15)."""
    first_claim: bool
    """Whether ``runs.started_at`` is set by this claim (only on the first claim, S-15)."""


def plan_claim(previous: PreviousAttempt | None, *, attempts: int, now: datetime, lease_seconds: float) -> ClaimPlan:
    """S-13, S-14, S-15: the attempt row and run counters one claim writes."""
    reason = start_reason(previous.status if previous is not None else None)
    charged = charges_attempt(reason)
    return ClaimPlan(
        number=1 if previous is None else previous.number + 1,
        start_reason=reason,
        replaces_attempt_id=None if previous is None else previous.id,
        charged=charged,
        attempts=attempts + 1 if charged else attempts,
        lease_expires_at=lease_expiry(now, lease_seconds),
        first_claim=previous is None,
    )
