"""Outcome classification (§7.9) and recovery (§7.6)."""

from __future__ import annotations

from typing import get_args

import pytest
from hypothesis import given
from hypothesis import strategies as st

from candor.service.protocol.outcomes import (
    AttemptOutcome,
    NoSeal,
    OutcomeKind,
    Recover,
    Requeue,
    Seal,
    SealAfterRecovery,
    classify_outcome,
    recovery_decision,
    retry_delay_seconds,
)
from candor.service.protocol.transitions import AttemptEnd

LIMIT = 1024


def result(status, code=None, output_bytes=None):
    return AttemptOutcome(kind="harness_result", harness_status=status, failure_code=code, output_bytes=output_bytes)


@pytest.mark.parametrize(
    ("outcome", "decision"),
    [
        (result("completed", output_bytes=LIMIT), Seal(status="completed", final_commit=True)),
        (result("completed", output_bytes=0), Seal(status="completed", final_commit=True)),
        (result("completed", output_bytes=LIMIT + 1), Seal(status="failed", failure_code="output_too_large")),
        (result("suspended"), Seal(status="waiting", final_commit=True)),
        (result("failed", "usage_limit_exceeded"), Seal(status="failed", failure_code="usage_limit_exceeded")),
        (result("failed", "agent_run_failed"), Seal(status="failed", failure_code="agent_run_failed")),
        (
            AttemptOutcome(kind="harness_error", failure_code="deferred_surface_mismatch"),
            Seal(status="failed", failure_code="deferred_surface_mismatch"),
        ),
        (
            AttemptOutcome(kind="harness_error", failure_code="deferred_override_invalid"),
            Seal(status="failed", failure_code="deferred_override_invalid"),
        ),
        (AttemptOutcome(kind="agent_factory_failed"), Seal(status="failed", failure_code="agent_unavailable")),
        (
            AttemptOutcome(kind="envelope_too_large"),
            Seal(status="failed", failure_code="checkpoint_envelope_too_large"),
        ),
        (AttemptOutcome(kind="checkpoint_corrupt"), Seal(status="failed", failure_code="checkpoint_corrupt")),
        (AttemptOutcome(kind="authority_refused"), Seal(status="failed", failure_code="authority_revoked")),
    ],
)
def test_deterministic_outcomes_seal_now(outcome, decision):
    """S-49, S-5: completed/suspended seal with the final commit; deterministic failures seal failed at once."""
    assert classify_outcome(outcome, output_limit=LIMIT) == decision


@pytest.mark.parametrize(
    ("outcome", "code"),
    [
        (result("failed", "model_unavailable"), "model_unavailable"),
        (result("failed", "tool_unavailable"), "tool_unavailable"),  # docs/mcp.md: an MCP server was down
        (AttemptOutcome(kind="unexpected_exception"), "attempt_failed"),
        (AttemptOutcome(kind="database_unavailable"), "attempt_failed"),
        (AttemptOutcome(kind="cleanup_error"), "attempt_failed"),
        (AttemptOutcome(kind="harness_error", failure_code="run_cleanup_failed"), "attempt_failed"),
        (AttemptOutcome(kind="authority_unavailable"), "attempt_failed"),
        (result("cancelled"), "attempt_failed"),
    ],
)
def test_transient_outcomes_recover_charged(outcome, code):
    """S-50: unexpected exceptions, database unavailable, RunCleanupError, model_unavailable and tool_unavailable
    end the attempt failed (charged) with the code of the latter two and attempt_failed otherwise."""
    assert classify_outcome(outcome, output_limit=LIMIT) == Recover(
        attempt_outcome="failed", failure_code=code, charged=True
    )


def test_cancel_request_seals_cancelled():
    """S-57: a cancellation honoured seals cancelled with code cancelled, as an attempt cancelled."""
    decision = classify_outcome(AttemptOutcome(kind="cancelled_by_request"), output_limit=LIMIT)
    assert decision == Seal(status="cancelled", failure_code="cancelled")
    assert decision.attempt == AttemptEnd(status="cancelled")


def test_handoff_recovers_uncharged():
    """S-32, S-53: a handoff yields; the next claim is free."""
    assert classify_outcome(AttemptOutcome(kind="handoff"), output_limit=LIMIT) == Recover(
        attempt_outcome="yielded", charged=False
    )


@pytest.mark.parametrize("kind", ["lease_lost", "deadline_cancelled"])
def test_lost_lease_writes_no_seal(kind):
    """S-22, S-51: LeaseLost or a deadline cancellation writes no seal, but usage is still recorded."""
    decision = classify_outcome(AttemptOutcome(kind=kind), output_limit=LIMIT)
    assert decision == NoSeal(reason=kind, record_usage=True)


@pytest.mark.parametrize(
    ("status", "attempt_status"),
    [("completed", "succeeded"), ("waiting", "succeeded"), ("failed", "failed"), ("cancelled", "cancelled")],
)
def test_seal_finishes_the_attempt(status, attempt_status):
    """S-49: the attempt is finished per §5.3 in the seal transaction."""
    assert Seal(status=status).attempt.status == attempt_status


_outcomes = st.one_of(
    st.builds(
        AttemptOutcome,
        kind=st.sampled_from([k for k in get_args(OutcomeKind) if k not in ("harness_result", "harness_error")]),
    ),
    st.builds(
        AttemptOutcome,
        kind=st.just("harness_error"),
        failure_code=st.sampled_from(["deferred_surface_mismatch", "run_cleanup_failed", "x"]),
    ),
    st.builds(result, st.just("completed"), output_bytes=st.integers(0, 2 * LIMIT)),
    st.builds(result, st.sampled_from(["suspended", "cancelled"])),
    st.builds(result, st.just("failed"), st.sampled_from(["model_unavailable", "usage_limit_exceeded"])),
)


@given(_outcomes)
def test_classification_invariants(outcome):
    """S-22, S-4, S-49, S-50: lease_lost is never a failure code; failed/cancelled seals carry a code and store
    no state; only completed/waiting seal with a final commit."""
    decision = classify_outcome(outcome, output_limit=LIMIT)
    match decision:
        case Seal():
            assert (decision.failure_code is not None) == (decision.status in ("failed", "cancelled"))
            assert decision.final_commit == (decision.status in ("completed", "waiting"))
            assert decision.failure_code != "lease_lost"
        case Recover():
            assert decision.failure_code != "lease_lost"
            assert decision.charged == (decision.attempt_outcome == "failed")
        case NoSeal():
            assert outcome.kind in ("lease_lost", "deadline_cancelled")


@pytest.mark.parametrize(
    "kwargs",
    [
        {"kind": "harness_result"},
        {"kind": "handoff", "harness_status": "completed", "output_bytes": 1},
        {"kind": "harness_result", "harness_status": "failed"},
        {"kind": "harness_error"},
        {"kind": "harness_result", "harness_status": "completed"},
        {"kind": "harness_result", "harness_status": "completed", "output_bytes": -1},
    ],
)
def test_malformed_outcomes_are_refused(kwargs):
    """S-49: the classification input must say what happened; inconsistent descriptions are errors."""
    with pytest.raises(ValueError):
        AttemptOutcome(**kwargs)


# --- recovery (§7.6) ---------------------------------------------------------------------------------------------

FAILED = AttemptEnd(status="failed")
YIELDED = AttemptEnd(status="yielded", yield_reason="handoff")


def sealed(status, code, attempt=FAILED):
    return SealAfterRecovery(status=status, failure_code=code, attempt=attempt)


def requeued(code, delay, attempt=FAILED):
    return Requeue(attempt=attempt, failure_code=code, delay_seconds=delay)


@pytest.mark.parametrize(
    ("outcome", "cancel", "attempts", "max_attempts", "code", "decision"),
    [
        # S-33: cancellation first, whatever the counters say.
        ("failed", True, 1, 3, "lease_expired", sealed("cancelled", "cancelled")),
        ("failed", True, 3, 3, "lease_expired", sealed("cancelled", "cancelled")),
        ("yielded", True, 1, 3, None, sealed("cancelled", "cancelled", YIELDED)),
        # S-30: the N-th charged attempt failed → failed with that attempt's code.
        ("failed", False, 3, 3, "lease_expired", sealed("failed", "lease_expired")),
        ("failed", False, 1, 1, "model_unavailable", sealed("failed", "model_unavailable")),
        ("failed", False, 4, 3, "attempt_failed", sealed("failed", "attempt_failed")),
        # S-31: charged attempts left → accepted, due after min(60, 2^(attempts−1)).
        ("failed", False, 1, 3, "attempt_failed", requeued("attempt_failed", 1)),
        ("failed", False, 2, 3, "model_unavailable", requeued("model_unavailable", 2)),
        # Issue 15 item 3 (over S-31): an expired lease is not the run's fault → due now, still charged.
        ("failed", False, 1, 3, "lease_expired", requeued("lease_expired", 0)),
        ("failed", False, 2, 3, "lease_expired", requeued("lease_expired", 0)),
        ("failed", False, 7, 20, "attempt_failed", requeued("attempt_failed", 60)),
        # S-32: a handoff is due now and never runs out of attempts.
        ("yielded", False, 3, 3, None, requeued(None, 0, YIELDED)),
        ("yielded", False, 1, 3, None, requeued(None, 0, YIELDED)),
    ],
)
def test_recovery_decision(outcome, cancel, attempts, max_attempts, code, decision):
    """S-30, S-31, S-32, S-33: §7.6 steps in order."""
    got = recovery_decision(
        outcome, cancel_requested=cancel, attempts=attempts, max_attempts=max_attempts, failure_code=code
    )
    assert got == decision


def test_requeue_wakes_workers_only_when_due_now():
    """S-32: a handoff wakes workers; a backed-off retry waits for its due time."""
    handoff = recovery_decision("yielded", cancel_requested=False, attempts=1, max_attempts=3)
    assert isinstance(handoff, Requeue) and handoff.wake_workers
    retry = recovery_decision(
        "failed", cancel_requested=False, attempts=1, max_attempts=3, failure_code="attempt_failed"
    )
    assert isinstance(retry, Requeue) and not retry.wake_workers


@pytest.mark.parametrize("attempts", [1, 2, 5, 19])
def test_expired_lease_is_due_at_once_but_still_charged(attempts):
    """S-28, S-30 and issue 15 item 3 (which overrides S-31 for this code): a lease-expired attempt is not the
    run's fault, so its run is due again at once and workers are woken; it still counts toward max_attempts."""
    decision = recovery_decision(
        "failed", cancel_requested=False, attempts=attempts, max_attempts=20, failure_code="lease_expired"
    )
    assert isinstance(decision, Requeue)
    assert decision == requeued("lease_expired", 0) and decision.wake_workers
    other = recovery_decision(
        "failed", cancel_requested=False, attempts=attempts, max_attempts=20, failure_code="attempt_failed"
    )
    assert isinstance(other, Requeue) and other.delay_seconds == retry_delay_seconds(attempts) >= 1
    last = recovery_decision(
        "failed", cancel_requested=False, attempts=20, max_attempts=20, failure_code="lease_expired"
    )
    assert last == sealed("failed", "lease_expired")


def test_failed_recovery_needs_a_code():
    """S-30: the run is sealed with the failure code of the last attempt, so it must be known."""
    with pytest.raises(ValueError):
        recovery_decision("failed", cancel_requested=False, attempts=1, max_attempts=3)


@given(
    st.sampled_from(["yielded", "failed"]),
    st.booleans(),
    st.integers(1, 20),
    st.integers(1, 20),
)
def test_recovery_invariants(outcome, cancel, attempts, max_attempts):
    """S-30, S-31, S-32, S-33, S-22: a cancel always seals cancelled; a requeue never exceeds the charge limit;
    an expired lease is due again at once; the run failure code is never lease_lost."""
    code = None if outcome == "yielded" else "lease_expired"
    decision = recovery_decision(
        outcome, cancel_requested=cancel, attempts=attempts, max_attempts=max_attempts, failure_code=code
    )
    if cancel:
        assert decision == SealAfterRecovery(
            status="cancelled", failure_code="cancelled", attempt=YIELDED if code is None else FAILED
        )
        return
    match decision:
        case SealAfterRecovery():
            assert outcome == "failed" and attempts >= max_attempts
            assert decision.failure_code == "lease_expired"
        case Requeue():
            assert outcome == "yielded" or attempts < max_attempts
            assert decision.delay_seconds == 0  # a yield (S-32) or an expired lease (issue 15 item 3)
            assert decision.wake_workers
            assert 0 <= decision.delay_seconds <= 60
