"""Lifecycle states of runs, attempts, inbox entries and outbox rows, and the moves allowed for runs and attempts.

The run and attempt tables map a state (``None`` = the row does not exist yet) to the states it may move to. A move
to the same state is not a transition: ``may_update_*`` says whether a row may be rewritten while keeping its state.
These tables are the one source of the state machines: the database triggers (store/schema/tables.py) are rendered from
them through ``moves``, ``initial_status`` and ``final_statuses``. Targets are tuples so that the rendered SQL keeps
one order, and a migrated database's triggers compare equal to a fresh one's.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Final, Literal, TypeVar, assert_never, get_args

__all__ = (
    "RunStatus",
    "SealedRunStatus",
    "RUN_STATUSES",
    "SEALED_RUN_STATUSES",
    "LIVE_RUN_STATUSES",
    "RUN_TRANSITIONS",
    "is_sealed",
    "can_transition",
    "may_update_run",
    "AttemptStatus",
    "ATTEMPT_STATUSES",
    "LIVE_ATTEMPT_STATUSES",
    "FINISHED_ATTEMPT_STATUSES",
    "ATTEMPT_TRANSITIONS",
    "is_attempt_live",
    "can_transition_attempt",
    "may_update_attempt",
    "AttemptEnding",
    "AttemptEnd",
    "attempt_end",
    "EntryStatus",
    "ENTRY_STATUSES",
    "OutboxStatus",
    "OUTBOX_STATUSES",
    "is_redeliverable",
    "moves",
    "initial_status",
    "final_statuses",
    "live_statuses",
)

S = TypeVar("S", bound=str)

# --- reading a table (the database triggers are rendered from these) ----------------------------------------------


def moves(table: Mapping[S | None, Collection[S]]) -> tuple[tuple[S, S], ...]:
    """The status changes an existing row may make, as ``(from, to)`` pairs in table order (creation excluded)."""
    return tuple((source, target) for source, targets in table.items() if source is not None for target in targets)


def initial_status(table: Mapping[S | None, Collection[S]]) -> S:
    """The one status a row is created in (``ValueError`` if the table allows none or several)."""
    match tuple(table.get(None, ())):
        case (status,):
            return status
        case created:
            raise ValueError(f"a table for one guard creates rows in exactly one status, not {created!r}")


def final_statuses(table: Mapping[S | None, Collection[S]]) -> tuple[S, ...]:
    """The statuses with no way out, in table order: a row in one never changes again."""
    return tuple(status for status, targets in table.items() if status is not None and not targets)


def live_statuses(table: Mapping[S | None, Collection[S]]) -> tuple[S, ...]:
    """The statuses a row may still leave, in table order."""
    return tuple(status for status, targets in table.items() if status is not None and targets)


# --- runs (§5.2) -------------------------------------------------------------------------------------------------

RunStatus = Literal["accepted", "running", "waiting", "completed", "failed", "cancelled"]
SealedRunStatus = Literal["waiting", "completed", "failed", "cancelled"]

RUN_STATUSES: Final[tuple[RunStatus, ...]] = get_args(RunStatus)
SEALED_RUN_STATUSES: Final[frozenset[RunStatus]] = frozenset(get_args(SealedRunStatus))

RUN_TRANSITIONS: Final[Mapping[RunStatus | None, tuple[RunStatus, ...]]] = {
    None: ("accepted",),
    "accepted": ("running", "cancelled", "failed"),
    "running": ("accepted", "completed", "waiting", "failed", "cancelled"),
    # S-6: sealed runs never change again; a waiting run is continued by a successor, not by a transition.
    "waiting": (),
    "completed": (),
    "failed": (),
    "cancelled": (),
}
LIVE_RUN_STATUSES: Final[frozenset[RunStatus]] = frozenset(live_statuses(RUN_TRANSITIONS))


def is_sealed(status: RunStatus) -> bool:
    """Whether a run in this status is sealed (``sealed_at`` set, never changes again)."""
    return status in SEALED_RUN_STATUSES


def can_transition(from_status: RunStatus | None, to_status: RunStatus) -> bool:
    """S-7: whether §5.2 allows a run to move from ``from_status`` (``None`` = creation) to ``to_status``."""
    return _allowed(RUN_TRANSITIONS, from_status, to_status)


def may_update_run(from_status: RunStatus, to_status: RunStatus) -> bool:
    """S-6, S-7: whether a run row may be rewritten: a listed transition, or a same-status update of an unsealed run."""
    if from_status == to_status:
        return not is_sealed(from_status)
    return can_transition(from_status, to_status)


# --- attempts (§5.3) ---------------------------------------------------------------------------------------------

AttemptStatus = Literal["leased", "running", "succeeded", "yielded", "failed", "cancelled"]

ATTEMPT_STATUSES: Final[tuple[AttemptStatus, ...]] = get_args(AttemptStatus)

_ATTEMPT_ENDS: Final[tuple[AttemptStatus, ...]] = ("succeeded", "yielded", "failed", "cancelled")
ATTEMPT_TRANSITIONS: Final[Mapping[AttemptStatus | None, tuple[AttemptStatus, ...]]] = {
    None: ("leased",),
    "leased": ("running", *_ATTEMPT_ENDS),
    # S-8: running → leased is forbidden.
    "running": _ATTEMPT_ENDS,
    # S-8: finished attempts are immutable.
    "succeeded": (),
    "yielded": (),
    "failed": (),
    "cancelled": (),
}
LIVE_ATTEMPT_STATUSES: Final[frozenset[AttemptStatus]] = frozenset(live_statuses(ATTEMPT_TRANSITIONS))
FINISHED_ATTEMPT_STATUSES: Final[frozenset[AttemptStatus]] = frozenset(final_statuses(ATTEMPT_TRANSITIONS))


def is_attempt_live(status: AttemptStatus) -> bool:
    """Whether an attempt in this status still holds (or may hold) a lease."""
    return status in LIVE_ATTEMPT_STATUSES


def can_transition_attempt(from_status: AttemptStatus | None, to_status: AttemptStatus) -> bool:
    """S-8: whether §5.3 allows an attempt to move from ``from_status`` (``None`` = creation) to ``to_status``."""
    return _allowed(ATTEMPT_TRANSITIONS, from_status, to_status)


def may_update_attempt(from_status: AttemptStatus, to_status: AttemptStatus) -> bool:
    """S-8: a listed transition, or a same-status update (renewal, heartbeat) of a live attempt."""
    if from_status == to_status:
        return is_attempt_live(from_status)
    return can_transition_attempt(from_status, to_status)


AttemptEnding = Literal["completed", "waiting", "failed", "cancelled", "handoff", "recovery"]
"""How an attempt ended: its run was sealed with one of the first four statuses, or it handed off or was recovered."""


@dataclass(frozen=True, kw_only=True, slots=True)
class AttemptEnd:
    """The status (and yield reason) an attempt is finished with."""

    status: AttemptStatus
    """One of the finished statuses."""
    yield_reason: Literal["handoff"] | None = None
    """Set exactly when ``status == "yielded"``."""


def attempt_end(ending: AttemptEnding) -> AttemptEnd:
    """§5.3: the attempt status recorded for how the attempt ended."""
    match ending:
        case "completed" | "waiting":
            return AttemptEnd(status="succeeded")
        case "failed" | "recovery":
            return AttemptEnd(status="failed")
        case "cancelled":
            return AttemptEnd(status="cancelled")
        case "handoff":
            return AttemptEnd(status="yielded", yield_reason="handoff")
        case _:
            assert_never(ending)


# --- inbox entries (§5.4) ----------------------------------------------------------------------------------------

EntryStatus = Literal["pending", "assigned", "consumed", "failed", "withdrawn"]

ENTRY_STATUSES: Final[tuple[EntryStatus, ...]] = get_args(EntryStatus)


# --- outbox rows (§5.5) ------------------------------------------------------------------------------------------

OutboxStatus = Literal["pending", "delivered", "dead"]

OUTBOX_STATUSES: Final[tuple[OutboxStatus, ...]] = get_args(OutboxStatus)


def is_redeliverable(kind: str, status: OutboxStatus) -> bool:
    """S-114: only a ``dead`` webhook row may be redelivered (anything else → 409 ``not_dead``)."""
    return kind == "webhook" and status == "dead"


def _allowed(table: Mapping[S | None, Collection[S]], from_status: S | None, to_status: S) -> bool:
    try:
        targets = table[from_status]
    except KeyError:
        raise ValueError(f"unknown status {from_status!r}") from None
    if to_status not in table:
        raise ValueError(f"unknown status {to_status!r}")
    return to_status in targets
