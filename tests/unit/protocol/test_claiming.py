"""Start reason, charge and plan of a claim (spec §7.2, §7.6)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from candor.service.protocol.claiming import (
    ClaimPlan,
    PreviousAttempt,
    charges_attempt,
    plan_claim,
    start_reason,
)
from candor.service.protocol.transitions import FINISHED_ATTEMPT_STATUSES

NOW = datetime(2030, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    ("previous", "reason", "charged"),
    [
        (None, "initial", True),
        ("yielded", "handoff", False),
        ("failed", "recovery", True),
        # Anything else counts as recovery (§7.2 "otherwise"), including states a claim should never see.
        ("succeeded", "recovery", True),
        ("cancelled", "recovery", True),
        ("leased", "recovery", True),
        ("running", "recovery", True),
    ],
)
def test_start_reason_and_charge(previous, reason, charged):
    """S-13, S-14, S-32: initial and recovery claims are charged; a handoff claim is free."""
    assert start_reason(previous) == reason
    assert charges_attempt(reason) is charged


def test_first_claim_plan():
    """S-13, S-14, S-15: attempt 1, initial, charged, started_at set, lease = now + lease_seconds."""
    assert plan_claim(None, attempts=0, now=NOW, lease_seconds=30) == ClaimPlan(
        number=1,
        start_reason="initial",
        replaces_attempt_id=None,
        charged=True,
        attempts=1,
        lease_expires_at=NOW + timedelta(seconds=30),
        first_claim=True,
    )


@pytest.mark.parametrize(
    ("status", "reason", "attempts_after"),
    [("failed", "recovery", 3), ("yielded", "handoff", 2)],
)
def test_later_claim_plan(status, reason, attempts_after):
    """S-13, S-14, S-32: the next number, replaces_attempt_id = previous; only recovery costs an attempt."""
    previous = PreviousAttempt(id="att_prev", number=4, status=status)
    plan = plan_claim(previous, attempts=2, now=NOW, lease_seconds=10)
    assert plan.number == 5
    assert plan.start_reason == reason
    assert plan.replaces_attempt_id == "att_prev"
    assert plan.attempts == attempts_after
    assert not plan.first_claim


@given(st.lists(st.sampled_from(["failed", "yielded"]), max_size=30))
def test_attempt_list_exceeds_charged_count_by_handoffs(history):
    """S-14, S-32: after any mix of recoveries and handoffs, runs.attempts = attempts − handoffs."""
    previous, attempts = None, 0
    for ending in [*history, None]:
        plan = plan_claim(previous, attempts=attempts, now=NOW, lease_seconds=30)
        attempts = plan.attempts
        if ending is None:
            break
        previous = PreviousAttempt(id=f"att_{plan.number}", number=plan.number, status=ending)
    assert plan.number == len(history) + 1
    assert attempts == plan.number - history.count("yielded")


def test_every_finished_status_has_a_reason():
    """S-13: each finished previous attempt maps to exactly one start reason."""
    assert {start_reason(s) for s in FINISHED_ATTEMPT_STATUSES} <= {"handoff", "recovery"}
