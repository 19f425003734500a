"""Tables of run and attempt states (spec §5.2, §5.3), their readers, and who may redeliver (§9.7)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from candor.service.protocol.transitions import (
    ATTEMPT_STATUSES,
    ATTEMPT_TRANSITIONS,
    FINISHED_ATTEMPT_STATUSES,
    RUN_STATUSES,
    RUN_TRANSITIONS,
    SEALED_RUN_STATUSES,
    AttemptEnd,
    RunStatus,
    attempt_end,
    can_transition,
    can_transition_attempt,
    final_statuses,
    initial_status,
    is_redeliverable,
    is_sealed,
    live_statuses,
    may_update_attempt,
    may_update_run,
    moves,
)

# §5.2, row by row.
SPEC_RUN_MOVES = {
    (None, "accepted"),
    ("accepted", "running"),
    ("accepted", "cancelled"),
    ("accepted", "failed"),
    ("running", "accepted"),
    ("running", "completed"),
    ("running", "waiting"),
    ("running", "failed"),
    ("running", "cancelled"),
}


@pytest.mark.parametrize(
    ("from_status", "to_status", "allowed"),
    [
        (None, "accepted", True),
        (None, "running", False),
        ("accepted", "running", True),
        ("accepted", "cancelled", True),
        ("accepted", "failed", True),
        ("accepted", "waiting", False),
        ("accepted", "completed", False),
        ("running", "accepted", True),
        ("running", "completed", True),
        ("running", "waiting", True),
        ("running", "failed", True),
        ("running", "cancelled", True),
        ("completed", "running", False),
        ("waiting", "accepted", False),
        ("waiting", "running", False),
        ("failed", "accepted", False),
        ("cancelled", "accepted", False),
    ],
)
def test_run_transition_table(from_status, to_status, allowed):
    """S-7: transitions outside §5.2 (completed → running, waiting → accepted, accepted → waiting) are refused."""
    assert can_transition(from_status, to_status) is allowed


def test_run_table_is_exactly_the_spec():
    """S-7: the table allows exactly the §5.2 moves and nothing else."""
    allowed = {(a, b) for a, b in itertools.product((None, *RUN_STATUSES), RUN_STATUSES) if can_transition(a, b)}
    assert allowed == SPEC_RUN_MOVES


@given(st.sampled_from(sorted(SEALED_RUN_STATUSES)), st.sampled_from(RUN_STATUSES))
def test_sealed_runs_are_absorbing(sealed, target):
    """S-6, S-7: a sealed run never changes again, not even with the same status."""
    assert is_sealed(sealed)
    assert not can_transition(sealed, target)
    assert not may_update_run(sealed, target)


@pytest.mark.parametrize(("status", "allowed"), [("accepted", True), ("running", True), ("waiting", False)])
def test_same_status_run_update(status, allowed):
    """S-6: an unsealed run may be rewritten in place (checkpoint pointer, cancel flag); a sealed one may not."""
    assert may_update_run(status, status) is allowed


def test_every_run_status_is_reachable_and_sealed_states_are_terminal():
    """S-7: closure of the table: every status is reachable from creation; only sealed ones have no way out."""
    reachable: set[RunStatus] = set()
    frontier: list[RunStatus | None] = [None]
    while frontier:
        state = frontier.pop()
        for nxt in RUN_TRANSITIONS[state]:
            if nxt not in reachable:
                reachable.add(nxt)
                frontier.append(nxt)
    assert reachable == set(RUN_STATUSES)
    assert {s for s in RUN_STATUSES if not RUN_TRANSITIONS[s]} == SEALED_RUN_STATUSES


@pytest.mark.parametrize(
    ("from_status", "to_status", "allowed"),
    [
        (None, "leased", True),
        (None, "running", False),
        ("leased", "running", True),
        ("leased", "succeeded", True),
        ("leased", "yielded", True),
        ("leased", "failed", True),
        ("leased", "cancelled", True),
        ("running", "leased", False),
        ("running", "succeeded", True),
        ("running", "yielded", True),
        ("running", "failed", True),
        ("running", "cancelled", True),
        ("succeeded", "running", False),
        ("failed", "leased", False),
        ("yielded", "running", False),
        ("cancelled", "failed", False),
    ],
)
def test_attempt_transition_table(from_status, to_status, allowed):
    """S-8: leased → running → finished; running → leased is refused."""
    assert can_transition_attempt(from_status, to_status) is allowed


@given(st.sampled_from(sorted(FINISHED_ATTEMPT_STATUSES)), st.sampled_from(ATTEMPT_STATUSES))
def test_finished_attempts_are_immutable(finished, target):
    """S-8: a finished attempt cannot be modified at all."""
    assert ATTEMPT_TRANSITIONS[finished] == ()
    assert not may_update_attempt(finished, target)


@pytest.mark.parametrize("status", ["leased", "running"])
def test_live_attempt_may_be_renewed_in_place(status):
    """S-8, S-23: a live attempt may be rewritten in place (renewal, heartbeat)."""
    assert may_update_attempt(status, status)


@pytest.mark.parametrize(
    ("ending", "expected"),
    [
        ("completed", AttemptEnd(status="succeeded")),
        ("waiting", AttemptEnd(status="succeeded")),
        ("failed", AttemptEnd(status="failed")),
        ("cancelled", AttemptEnd(status="cancelled")),
        ("handoff", AttemptEnd(status="yielded", yield_reason="handoff")),
        ("recovery", AttemptEnd(status="failed")),
    ],
)
def test_attempt_status_for_how_it_ended(ending, expected):
    """S-53: §5.3 table; a handoff yields with yield_reason "handoff", a recovery ends failed."""
    end = attempt_end(ending)
    assert end == expected
    assert end.status in FINISHED_ATTEMPT_STATUSES


@pytest.mark.parametrize(
    ("kind", "status", "allowed"),
    [
        ("webhook", "dead", True),
        ("webhook", "pending", False),
        ("webhook", "delivered", False),
        ("child_result", "dead", False),
        ("checkpoint_cleanup", "dead", False),
    ],
)
def test_redeliver_only_dead_webhooks(kind, status, allowed):
    """S-114, §5.5: only a dead webhook row goes back to pending (redeliver); any other row → 409 not_dead."""
    assert is_redeliverable(kind, status) is allowed


@pytest.mark.parametrize(
    "call",
    [
        # Statuses outside the tables, deliberately.
        lambda: can_transition("sealed", "running"),  # type: ignore[arg-type]
        lambda: can_transition("running", "paused"),  # type: ignore[arg-type]
        lambda: can_transition_attempt("expired", "failed"),  # type: ignore[arg-type]
    ],
)
def test_unknown_status_is_an_error(call):
    """S-7, S-8: an unknown status is a programming error, never silently allowed or refused."""
    with pytest.raises(ValueError):
        call()


@pytest.mark.parametrize(
    ("table", "statuses"),
    [
        (RUN_TRANSITIONS, RUN_STATUSES),
        (ATTEMPT_TRANSITIONS, ATTEMPT_STATUSES),
    ],
)
def test_every_table_has_a_row_per_status(table, statuses):
    """S-7, S-8: each table has one row per status plus creation, and targets only known statuses."""
    assert set(table) == {None, *statuses}
    assert all(set(targets) <= set(statuses) for targets in table.values())


def test_table_readers_on_a_small_table():
    """S-7: moves keep table order and skip creation; final statuses have no way out, live ones have one."""
    table = {None: ("new",), "new": ("done", "gone"), "done": (), "gone": ()}
    assert moves(table) == (("new", "done"), ("new", "gone"))
    assert initial_status(table) == "new"
    assert final_statuses(table) == ("done", "gone")
    assert live_statuses(table) == ("new",)


@pytest.mark.parametrize("created", [(), ("a", "b")])
def test_initial_status_needs_exactly_one(created):
    """S-6, S-8: a status guard creates rows in one status; a table creating rows in none or several is refused."""
    with pytest.raises(ValueError, match="exactly one status"):
        initial_status({None: created, "a": (), "b": ()})


def test_run_and_attempt_tables_as_the_triggers_read_them():
    """S-6, S-7, S-8: what the triggers are rendered from: §5.2 and §5.3 moves, creation status, final statuses."""
    assert {(None, initial_status(RUN_TRANSITIONS)), *moves(RUN_TRANSITIONS)} == SPEC_RUN_MOVES
    assert set(final_statuses(RUN_TRANSITIONS)) == SEALED_RUN_STATUSES
    assert initial_status(ATTEMPT_TRANSITIONS) == "leased"
    assert set(final_statuses(ATTEMPT_TRANSITIONS)) == FINISHED_ATTEMPT_STATUSES
    assert ("running", "leased") not in moves(ATTEMPT_TRANSITIONS)
    assert set(live_statuses(RUN_TRANSITIONS)) | set(final_statuses(RUN_TRANSITIONS)) == set(RUN_STATUSES)
