"""Resume reads and writes (spec §8.6): everything the resume decides on, read in one statement, and the successor's
start, written in one statement guarded by what that read found (S-77, S-81–S-84).

A resume runs in `engine.guarded_writes`: on PostgreSQL no transaction spans the read and the write (two round
trips, no lock held between them); on SQLite both run in one `BEGIN IMMEDIATE` transaction. Which row is which is
decided by `protocol.resume.split_resume_lookup`, whether the run may be resumed by `protocol.resume.resume_refusal`,
and the successor is `protocol.resume.successor_of`.

A lost guard or unique index is `RaceLost`: the command reads again and answers from what the winner left (its
successor when the key is the same, S-81; otherwise the refusal, S-77). `start_successor` says why the guard is enough.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, bindparam, insert, or_, select, true, update
from sqlalchemy import exc as sa_exc
from sqlalchemy.ext.asyncio import AsyncConnection

from ...errors import RaceLost
from ...protocol.new_run import NewRun
from ...protocol.resume import split_resume_lookup
from ...runtime import Entropy
from ..db.dialect import writes_as_ctes
from ..db.statements import fetch_rows
from ..reads.views import RunRow, ThreadRow, select_thread, thread_row
from ..runs.outbox_staging import count_accepted, stage_run_transition, workspace_has_subscriptions
from ..schema.dialect import db_now
from ..schema.tables import runs, threads
from ..workspaces.auth import AuthorityFacts, authority_facts, authority_subquery, new_id
from .submit import INSERT_RUN, NEW_RUN_VALUES, new_run_params, race_lost

__all__ = ("ResumeRead", "read_resume", "start_successor", "GUARD_LOST")

GUARD_LOST = "resume_thread_guard"
"""`RaceLost.constraint` when the successor's start found the thread no longer waiting on the run it resumes."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ResumeRead:
    """What one resume request reads, in one statement (one snapshot)."""

    replay: RunRow | None
    """The successor this principal already created with this key (§8.2), whatever has happened to it since."""
    target: RunRow | None
    """The run to resume, when it exists in the principal's workspace (S-126: otherwise it reads as unknown)."""
    thread: ThreadRow | None
    """The target's thread with its state; `None` without a target."""
    authority: AuthorityFacts | None
    """The resuming principal's §4.3 facts; `None` without a target."""
    workspace_has_subscriptions: bool
    """Whether the target's workspace has an enabled webhook subscription (`run.accepted` is then staged)."""


_THREAD_PREFIX = "thread__"  # no column of `runs` starts with it
_AUTHORITY = authority_subquery("authority_", "read_principal_id")
_TARGET_THREAD_ID = (
    select(runs.c.thread_id)
    .where(runs.c.id == bindparam("read_run_id"), runs.c.workspace_id == bindparam("read_workspace_id"))
    .scalar_subquery()
)
_THREAD_AND_FACTS = (
    select_thread(workspace_id=None, thread_id=_TARGET_THREAD_ID)  # type: ignore[arg-type]
    .add_columns(*_AUTHORITY.c, workspace_has_subscriptions(threads.c.workspace_id))
    .outerjoin(_AUTHORITY, true())
    .subquery("target_thread")
)
_RESUME_READ = (
    select(runs, *(column.label(f"{_THREAD_PREFIX}{column.name}") for column in _THREAD_AND_FACTS.c))
    .select_from(runs.outerjoin(_THREAD_AND_FACTS, true()))
    .where(
        or_(
            and_(runs.c.resumed_by_id == bindparam("read_principal_id"), runs.c.request_key == bindparam("read_key")),
            and_(runs.c.id == bindparam("read_run_id"), runs.c.workspace_id == bindparam("read_workspace_id")),
        )
    )
)
"""Built once: every resume request runs it. At most two rows (the key and the id are unique), each carrying the
target's thread (`views.select_thread`: its state), the principal's authority facts and whether the workspace has
subscriptions, under `thread__` names; NULL there when no run of the workspace has the id."""


async def read_resume(
    conn: AsyncConnection, *, principal_id: str, key: str, workspace_id: str, run_id: str
) -> ResumeRead:
    """The replay lookup by key, the run to resume, its thread and the facts §8.6 checks, in one round trip.

    One statement sees one snapshot: a racing twin that committed before it is seen as the replay, together with
    the thread its successor changed; one that commits after it makes the guarded start lose (`start_successor`).
    """
    params = {
        "read_principal_id": principal_id,
        "read_key": key,
        "read_workspace_id": workspace_id,
        "read_run_id": run_id,
    }
    found = await fetch_rows(conn, _RESUME_READ, params)
    lookup = split_resume_lookup(
        [RunRow.from_mapping(row) for row in found],
        principal_id=principal_id,
        key=key,
        workspace_id=workspace_id,
        run_id=run_id,
    )
    facts = _thread_part(found[0]) if found else None
    if facts is None or facts["id"] is None:
        return ResumeRead(
            replay=lookup.replay, target=lookup.target, thread=None, authority=None, workspace_has_subscriptions=False
        )
    return ResumeRead(
        replay=lookup.replay,
        target=lookup.target,
        thread=thread_row(facts),
        authority=authority_facts(facts, "authority_"),
        workspace_has_subscriptions=bool(facts["workspace_has_subscriptions"]),
    )


def _thread_part(row: Mapping[str, Any]) -> dict[str, Any]:
    """The `thread__` columns of a `_RESUME_READ` row, under their own names (an asyncpg record iterates over its
    values, hence `items()`)."""
    return {name[len(_THREAD_PREFIX) :]: value for name, value in row.items() if name.startswith(_THREAD_PREFIX)}


_GUARDED_THREAD_START = (
    update(threads)
    .where(
        threads.c.id == bindparam("start_thread_id"),
        threads.c.last_run_id == bindparam("start_waiting_run_id"),
        threads.c.current_run_id.is_(None),
        threads.c.archived_at.is_(None),
    )
    .values(current_run_id=bindparam("start_run_id"), agent=bindparam("start_agent"), updated_at=db_now())
)
"""The successor becomes the thread's current run only while the thread is still waiting on the resumed run."""


def _guarded_insert() -> Any:
    started = _GUARDED_THREAD_START.returning(threads.c.id).cte("thread_started")
    columns = [value.label(name) for name, value in NEW_RUN_VALUES.items()]
    return insert(runs).from_select(list(NEW_RUN_VALUES), select(*columns).select_from(started)).returning(*runs.c)


_START_SUCCESSOR = _guarded_insert()
"""Built once (PostgreSQL): the guarded thread UPDATE as a data-modifying CTE, and the successor's INSERT selecting
from it, so a thread that is no longer waiting on the run inserts nothing (one statement, committing on its own)."""


async def start_successor(
    conn: AsyncConnection, run: NewRun, *, entropy: Entropy, waiting_run_id: str, workspace_has_subscriptions: bool
) -> RunRow:
    """Insert the resume's successor (`accepted`, due now) as the thread's current run, if the thread is still
    waiting on `waiting_run_id`; stage `run.accepted` when the workspace has subscriptions (S-106).

    On PostgreSQL outside a transaction (`engine.guarded_writes`) this is one statement, committing on its own; when
    a webhook is to be staged, the start and the staging share a transaction. On SQLite it runs in the caller's
    transaction: the guarded UPDATE, then the INSERT. Raises `RaceLost` when the guard or a unique index decided
    for another request; nothing is written then.

    Why the guard is enough: the resume decided from a thread that was `waiting` with the target as its last run (no
    archive, no current run, last run = the target: `protocol.thread_state`). Every change that could make the
    resume wrong writes those columns of the thread row: a resume or a message making a run current, that run's
    seal or cancellation making it the last run, an archive. The thread UPDATE re-checks them on the row as it is
    when it writes (PostgreSQL re-reads a row another transaction changed while the UPDATE waited for its lock), and
    the INSERT only follows an UPDATE that found its row. Two resumes racing with the same key are told apart by
    `uq_runs_resume_request` (S-83), any two starts on one thread by `uq_runs_live_thread` (S-1).
    """
    if workspace_has_subscriptions and not conn.in_transaction():  # PostgreSQL's `guarded_writes`
        async with conn.begin():  # the start and its webhook are committed together
            return await _start(conn, run, entropy=entropy, waiting_run_id=waiting_run_id, staging=True)
    return await _start(conn, run, entropy=entropy, waiting_run_id=waiting_run_id, staging=workspace_has_subscriptions)


async def _start(conn: AsyncConnection, run: NewRun, *, entropy: Entropy, waiting_run_id: str, staging: bool) -> RunRow:
    run_id = new_id("run", entropy)
    params = new_run_params(run, run_id)
    params.update(
        start_thread_id=run.thread_id, start_run_id=run_id, start_agent=run.agent, start_waiting_run_id=waiting_run_id
    )
    try:
        if writes_as_ctes(conn):
            rows = await fetch_rows(conn, _START_SUCCESSOR, params)
        elif (await conn.execute(_GUARDED_THREAD_START, params)).rowcount == 1:
            rows = await fetch_rows(conn, INSERT_RUN, params)
        else:
            rows = []
    except sa_exc.IntegrityError as exc:  # uq_runs_live_thread (S-1) or uq_runs_resume_request (S-83)
        raise race_lost(exc) from exc
    if not rows:
        raise RaceLost(GUARD_LOST)
    started = RunRow.from_mapping(rows[0])
    if staging:
        await stage_run_transition(
            conn, run_id=run_id, run_status="accepted", workspace_id=run.workspace_id, has_subscriptions=True
        )
    count_accepted(conn, trigger=run.trigger)
    return started
