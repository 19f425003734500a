"""How a finished attempt ends its run: the §7.9 classification, then the §7.6 recovery decision.

``classify_outcome`` turns what happened into a ``SealDecision``: seal now, recover (retry or hand off), or
write nothing (the lease is gone). A ``recover`` decision is settled by ``recovery_decision`` under lock, with the
run's current cancellation flag and attempt counters.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal, assert_never

from .backoff import run_retry_delay as retry_delay_seconds
from .transitions import AttemptEnd, SealedRunStatus, attempt_end

__all__ = (
    "HarnessStatus",
    "OutcomeKind",
    "AttemptOutcome",
    "Seal",
    "Recover",
    "NoSeal",
    "SealDecision",
    "classify_outcome",
    "SealAfterRecovery",
    "Requeue",
    "RecoveryDecision",
    "recovery_decision",
    "retry_delay_seconds",
    "CANCELLED_MESSAGE",
)

HarnessStatus = Literal["completed", "suspended", "failed", "cancelled"]

OutcomeKind = Literal[
    "harness_result",  # the stream ended with a RunResult (harness_status, failure_code, output_bytes)
    "harness_error",  # a HarnessError was raised (failure_code = its code)
    "agent_factory_failed",
    "envelope_too_large",
    "checkpoint_corrupt",
    "cleanup_error",  # RunCleanupError
    "database_unavailable",
    "authority_refused",
    "authority_unavailable",  # the authority check at attempt start could not answer
    "cancelled_by_request",  # stopped because cancel_requested_at was seen
    "lease_lost",
    "deadline_cancelled",  # task cancelled at the local lease deadline (S-24)
    "handoff",  # drain: yielded at a model boundary, or before the harness started (§7.11)
    "unexpected_exception",
]

CANCELLED_MESSAGE: Final = "The run was interrupted"
"""§7.12: the message of the ``cancelled`` failure."""

_MODEL_UNAVAILABLE: Final = "model_unavailable"
_TRANSIENT_RESULT_CODES: Final = frozenset({_MODEL_UNAVAILABLE, "tool_unavailable"})
"""Failed results retried from the last checkpoint (S-50): the provider or a tool server (docs/mcp.md) was down."""
_ATTEMPT_FAILED: Final = "attempt_failed"
_CLEANUP_CODE: Final = "run_cleanup_failed"  # RunCleanupError.code


@dataclass(frozen=True, kw_only=True, slots=True)
class AttemptOutcome:
    """What happened to an attempt, as the worker observed it."""

    kind: OutcomeKind
    harness_status: HarnessStatus | None = None
    """Set exactly for ``harness_result``."""
    failure_code: str | None = None
    """The ``SafeFailure`` code of a failed result, or the code of a raised ``HarnessError``."""
    output_bytes: int | None = None
    """Size of the encoded output of a ``completed`` result, compared with ``worker.output_bytes``."""

    def __post_init__(self) -> None:
        if (self.kind == "harness_result") != (self.harness_status is not None):
            raise ValueError("harness_status is required for, and only for, kind='harness_result'")
        needs_code = self.kind == "harness_error" or self.harness_status == "failed"
        if needs_code and not self.failure_code:
            raise ValueError(f"failure_code is required for {self.kind}/{self.harness_status}")
        if self.harness_status == "completed" and (self.output_bytes is None or self.output_bytes < 0):
            raise ValueError("output_bytes (≥ 0) is required for a completed result")


@dataclass(frozen=True, kw_only=True, slots=True)
class Seal:
    """Seal the run now, in the same fenced transaction as the attempt's end (§7.10)."""

    kind: Literal["seal"] = "seal"
    status: SealedRunStatus
    failure_code: str | None = None
    """Set exactly for ``failed`` and ``cancelled`` (S-4)."""
    final_commit: bool = False
    """``completed``/``waiting`` seal with the final checkpoint commit; ``failed``/``cancelled`` store no state."""

    @property
    def attempt(self) -> AttemptEnd:
        """§5.3: how the attempt is finished alongside this seal."""
        return attempt_end(self.status)


@dataclass(frozen=True, kw_only=True, slots=True)
class Recover:
    """Recover the attempt (§7.6): settle it with ``recovery_decision`` under lock."""

    kind: Literal["recover"] = "recover"
    attempt_outcome: Literal["yielded", "failed"]
    failure_code: str | None = None
    """The attempt's failure code (``model_unavailable``, ``tool_unavailable`` or ``attempt_failed``); ``None`` for a
    yield."""
    charged: bool
    """Whether the next claim costs a charged attempt (S-50); a handoff is free (S-32)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class NoSeal:
    """S-22, S-51: write no seal and no failure; record the usage already incurred (bounded by ``database.timeout``)."""

    kind: Literal["none"] = "none"
    reason: Literal["lease_lost", "deadline_cancelled"]
    record_usage: bool = True


SealDecision = Seal | Recover | NoSeal


def classify_outcome(outcome: AttemptOutcome, *, output_limit: int) -> SealDecision:
    """S-49, S-50, S-51, S-22: the §7.9 table. ``output_limit`` is ``worker.output_bytes``."""
    match outcome.kind:
        case "harness_result":
            return _classify_result(outcome, output_limit=output_limit)
        case "harness_error":
            if outcome.failure_code == _CLEANUP_CODE:
                return _transient(_ATTEMPT_FAILED)
            return _failed(outcome.failure_code)
        case "agent_factory_failed":
            return _failed("agent_unavailable")
        case "envelope_too_large":
            return _failed("checkpoint_envelope_too_large")
        case "checkpoint_corrupt":
            return _failed("checkpoint_corrupt")
        case "authority_refused":
            return _failed("authority_revoked")
        case "cancelled_by_request":
            return Seal(status="cancelled", failure_code="cancelled")
        case "cleanup_error" | "database_unavailable" | "authority_unavailable" | "unexpected_exception":
            return _transient(_ATTEMPT_FAILED)
        case "handoff":
            return Recover(attempt_outcome="yielded", charged=False)
        case "lease_lost" | "deadline_cancelled":
            return NoSeal(reason=outcome.kind)
        case _:
            assert_never(outcome.kind)


def _classify_result(outcome: AttemptOutcome, *, output_limit: int) -> SealDecision:
    status = outcome.harness_status
    assert status is not None  # guaranteed by AttemptOutcome.__post_init__
    match status:
        case "completed":
            assert outcome.output_bytes is not None
            if outcome.output_bytes > output_limit:
                return _failed("output_too_large")
            return Seal(status="completed", final_commit=True)
        case "suspended":
            return Seal(status="waiting", final_commit=True)
        case "failed":
            if outcome.failure_code in _TRANSIENT_RESULT_CODES:
                return _transient(outcome.failure_code)
            return _failed(outcome.failure_code)
        case "cancelled":
            # The worker cancels the stream only for a request, a deadline or a handoff, and reports those as
            # their own kinds. A bare cancelled result has no known cause: treat it as transient, so a pending
            # cancellation still seals `cancelled` in recovery_decision (S-33) and nothing else is lost.
            return _transient(_ATTEMPT_FAILED)
        case _:
            assert_never(status)


def _failed(code: str | None) -> Seal:
    assert code
    return Seal(status="failed", failure_code=code)


def _transient(code: str) -> Recover:
    return Recover(attempt_outcome="failed", failure_code=code, charged=True)


@dataclass(frozen=True, kw_only=True, slots=True)
class SealAfterRecovery:
    """§7.6 steps 1–2: seal the run instead of returning it to ``accepted``."""

    kind: Literal["seal"] = "seal"
    status: Literal["failed", "cancelled"]
    failure_code: str
    """``cancelled`` (S-33), or the last attempt's failure code (S-30)."""
    attempt: AttemptEnd
    """How the recovered attempt itself is closed: ``failed`` or ``yielded``, as it ended."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Requeue:
    """§7.6 step 3: close the attempt, set the run ``accepted`` with ``current_attempt_id = NULL``."""

    kind: Literal["requeue"] = "requeue"
    attempt: AttemptEnd
    failure_code: str | None = None
    """The attempt's failure code; ``None`` for a yield."""
    delay_seconds: int
    """``available_at = now + delay_seconds``: 0 after a yield (S-32), the retry delay after a failure (S-31)."""

    @property
    def wake_workers(self) -> bool:
        """Wake workers when the run is due now."""
        return self.delay_seconds == 0


RecoveryDecision = SealAfterRecovery | Requeue

IMMEDIATE_RETRY_CODES: frozenset[str] = frozenset({"lease_expired"})
"""Failure codes whose run is due again at once, without the S-31 retry delay: a lease that expired says the
worker died or lost the database, not that the run misbehaved, so waiting would only add to the failover time of
S-28. The attempt is still charged (S-14, S-30), so a run that kills every worker still ends at `max_attempts`."""


def recovery_decision(
    attempt_outcome: Literal["yielded", "failed"],
    *,
    cancel_requested: bool,
    attempts: int,
    max_attempts: int,
    failure_code: str | None = None,
) -> RecoveryDecision:
    """S-30, S-31, S-32, S-33: §7.6 in order. ``attempts`` is ``runs.attempts`` (charged attempts so far).

    A failure in `IMMEDIATE_RETRY_CODES` (`lease_expired`) is requeued due now rather than after the S-31 delay.
    """
    match attempt_outcome:
        case "yielded":
            closed = attempt_end("handoff")
            code = None
        case "failed":
            if not failure_code:
                raise ValueError("a failed attempt needs its failure_code")
            closed = attempt_end("recovery")
            code = failure_code
        case _:
            assert_never(attempt_outcome)
    if cancel_requested:
        return SealAfterRecovery(status="cancelled", failure_code="cancelled", attempt=closed)
    if code is not None and attempts >= max_attempts:
        return SealAfterRecovery(status="failed", failure_code=code, attempt=closed)
    delay = 0 if code is None or code in IMMEDIATE_RETRY_CODES else retry_delay_seconds(attempts)
    return Requeue(attempt=closed, failure_code=code, delay_seconds=delay)
