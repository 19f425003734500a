"""Derived thread state, first match wins (spec §5.6)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from candor.service.protocol.thread_state import thread_state

ARCHIVED = datetime(2030, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    ("archived_at", "current_run_id", "last_status", "has_successor", "state"),
    [
        (ARCHIVED, "run_1", "waiting", False, "archived"),
        (ARCHIVED, None, None, False, "archived"),
        (None, "run_1", "waiting", False, "active"),
        (None, "run_1", "failed", False, "active"),
        (None, "run_2", "waiting", True, "active"),  # S-86: the successor exists and is running
        (None, None, "waiting", False, "waiting"),
        (None, None, "waiting", True, "idle"),
        (None, None, "failed", False, "paused"),
        (None, None, "cancelled", False, "paused"),
        (None, None, "completed", False, "idle"),
        (None, None, None, False, "idle"),
    ],
)
def test_thread_state_table(archived_at, current_run_id, last_status, has_successor, state):
    """S-64, S-69, S-70, S-86: archived > active > waiting (no successor) > paused > idle."""
    got = thread_state(
        archived_at=archived_at,
        current_run_id=current_run_id,
        last_run_status=last_status,
        last_run_has_successor=has_successor,
    )
    assert got == state


@given(
    st.sampled_from([None, ARCHIVED]),
    st.sampled_from([None, "run_1"]),
    st.sampled_from([None, "waiting", "completed", "failed", "cancelled"]),
    st.booleans(),
)
def test_first_match_wins(archived_at, current_run_id, last_status, has_successor):
    """S-64, S-86: archived is terminal; an active run hides the last run's status."""
    state = thread_state(
        archived_at=archived_at,
        current_run_id=current_run_id,
        last_run_status=last_status,
        last_run_has_successor=has_successor,
    )
    if archived_at is not None:
        assert state == "archived"
    elif current_run_id is not None:
        assert state == "active"
    else:
        assert state in ("waiting", "paused", "idle")
