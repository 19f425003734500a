"""Resume reads (spec §8.6): the replay lookup by key and the run to resume, read as the run's thread is locked, then
the locked thread with the facts the resume checks (S-81–S-83).

Which row is which is decided by `protocol.resume.split_resume_lookup`; the successor (`protocol.resume.successor_of`)
is inserted by `threads.start_run()`, where the unique index `uq_runs_resume_request` (`resumed_by_id, request_key`)
and the live-run index decide between racing resumes (S-83).
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import and_, bindparam, func, or_, select, true
from sqlalchemy.ext.asyncio import AsyncConnection

from ..protocol.resume import ResumeLookup, split_resume_lookup
from .auth import AuthorityFacts, authority_facts, authority_subquery
from .outbox import workspace_has_subscriptions
from .statements import fetch_rows
from .tables import runs, threads
from .views import RunRow, ThreadRow, select_thread, thread_row

__all__ = ("LockedThread", "find_resume_by_key", "find_resume_and_lock", "read_locked_thread")


async def find_resume_by_key(conn: AsyncConnection, *, principal_id: str, key: str) -> RunRow | None:
    """§8.2: the successor this principal created with this resume key, whatever has happened to it since (S-81)."""
    query = select(runs).where(runs.c.resumed_by_id == principal_id, runs.c.request_key == key)
    row = (await conn.execute(query)).mappings().first()
    return None if row is None else RunRow.from_mapping(row)


_TARGET_THREAD_LOCK = (
    select(threads.c.id)
    .where(
        threads.c.id
        == select(runs.c.thread_id)
        .where(runs.c.id == bindparam("lookup_run_id"), runs.c.workspace_id == bindparam("lookup_workspace_id"))
        .scalar_subquery()
    )
    .with_for_update()
    .cte("target_thread")
)
_RESUME_AND_LOCK = select(
    runs, select(func.count()).select_from(_TARGET_THREAD_LOCK).scalar_subquery().label("threads_locked")
).where(
    or_(
        and_(runs.c.resumed_by_id == bindparam("lookup_principal_id"), runs.c.request_key == bindparam("lookup_key")),
        and_(runs.c.id == bindparam("lookup_run_id"), runs.c.workspace_id == bindparam("lookup_workspace_id")),
    )
)
"""Built once: every resume request runs it. `threads_locked` is there to make PostgreSQL lock the target's thread
(`FOR UPDATE` in the CTE, run once the first row is read; nothing is locked when no row matches); SQLite has no
row locks, and its `BEGIN IMMEDIATE` already holds the database's write lock."""


async def find_resume_and_lock(
    conn: AsyncConnection, *, principal_id: str, key: str, workspace_id: str, run_id: str
) -> ResumeLookup[RunRow]:
    """The replay lookup and the run to resume, with the run's thread locked (`FOR UPDATE`), in one round trip (at
    most two rows: the key and the id are unique).

    The rows are plain reads from before the lock, as they were when the lookup came before it: what the resume
    checks after the lock is read by `read_locked_thread`, and the caller looks for the replay again when a check
    there refuses, since a racing twin may have committed while this statement waited for the lock. Only the
    target's thread is locked, never the replay's: a key reused for a run of another thread must not make two
    requests lock two threads in opposite orders.
    """
    params = {"lookup_principal_id": principal_id, "lookup_key": key, "lookup_workspace_id": workspace_id,
              "lookup_run_id": run_id}  # fmt: skip
    found = [RunRow.from_mapping(row) for row in await fetch_rows(conn, _RESUME_AND_LOCK, params)]
    return split_resume_lookup(found, principal_id=principal_id, key=key, workspace_id=workspace_id, run_id=run_id)


@dataclass(frozen=True, kw_only=True, slots=True)
class LockedThread:
    """The thread a resume locked, read after the lock together with the facts the resume checks there."""

    thread: ThreadRow
    authority: AuthorityFacts
    """The resuming principal's §4.3 facts (`auth.read_authority`)."""
    workspace_has_subscriptions: bool
    """Whether the thread's workspace has an enabled webhook subscription (`run.accepted` is staged for it)."""


_AUTHORITY = authority_subquery("authority_", "authority_principal_id")
_THREAD_AND_FACTS = (
    select_thread(workspace_id=None, thread_id=bindparam("load_thread_id"))  # type: ignore[arg-type]
    .add_columns(
        *_AUTHORITY.c,
        workspace_has_subscriptions(threads.c.workspace_id),
    )
    .outerjoin(_AUTHORITY, true())
)
"""Built once: the thread with its state (`views.select_thread`), the principal's authority facts and whether the
workspace has subscriptions, in one round trip instead of three."""


async def read_locked_thread(conn: AsyncConnection, *, thread_id: str, principal_id: str) -> LockedThread | None:
    """The thread `find_resume_and_lock` locked, read after the lock with its state, the principal's authority facts
    and the workspace's subscriptions (one statement: on PostgreSQL it sees what committed while the lock was
    waited for). `None` if the thread does not exist."""
    params = {"load_thread_id": thread_id, "authority_principal_id": principal_id}
    found = await fetch_rows(conn, _THREAD_AND_FACTS, params)
    if not found:
        return None
    row = found[0]
    return LockedThread(
        thread=thread_row(row),
        authority=authority_facts(row, "authority_"),
        workspace_has_subscriptions=bool(row["workspace_has_subscriptions"]),
    )
