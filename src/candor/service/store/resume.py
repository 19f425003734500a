"""Resume reads (spec §8.6): the replay lookup by key and the run to resume, read before locking (S-81–S-83).

Which row is which is decided by `protocol.resume.split_resume_lookup`; the successor (`protocol.resume.successor_of`)
is inserted by `threads.start_run()`, where the unique index `uq_runs_resume_request` (`resumed_by_id, request_key`)
and the live-run index decide between racing resumes (S-83).
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import and_, bindparam, or_, select, true
from sqlalchemy.ext.asyncio import AsyncConnection

from ..protocol.resume import ResumeLookup, split_resume_lookup
from .auth import AuthorityFacts, authority_facts, authority_subquery
from .outbox import workspace_has_subscriptions
from .statements import fetch_rows
from .tables import runs, threads
from .views import RunRow, ThreadRow, select_thread, thread_row

__all__ = ("LockedThread", "find_resume_by_key", "find_resume_and_run", "lock_thread_for_resume")


async def find_resume_by_key(conn: AsyncConnection, *, principal_id: str, key: str) -> RunRow | None:
    """§8.2: the successor this principal created with this resume key, whatever has happened to it since (S-81)."""
    query = select(runs).where(runs.c.resumed_by_id == principal_id, runs.c.request_key == key)
    row = (await conn.execute(query)).mappings().first()
    return None if row is None else RunRow.from_mapping(row)


_RESUME_AND_RUN = select(runs).where(
    or_(
        and_(runs.c.resumed_by_id == bindparam("lookup_principal_id"), runs.c.request_key == bindparam("lookup_key")),
        and_(runs.c.id == bindparam("lookup_run_id"), runs.c.workspace_id == bindparam("lookup_workspace_id")),
    )
)
"""Built once: every resume request runs it."""


async def find_resume_and_run(
    conn: AsyncConnection, *, principal_id: str, key: str, workspace_id: str, run_id: str
) -> ResumeLookup[RunRow]:
    """The replay lookup and the run to resume in one round trip (at most two rows: the key and the id are unique).

    Both are plain reads taken before the thread lock; the caller still looks for the replay again when a check
    after the lock refuses, since a racing twin may have committed meanwhile.
    """
    params = {"lookup_principal_id": principal_id, "lookup_key": key, "lookup_workspace_id": workspace_id,
              "lookup_run_id": run_id}  # fmt: skip
    found = [RunRow.from_mapping(row) for row in await fetch_rows(conn, _RESUME_AND_RUN, params)]
    return split_resume_lookup(found, principal_id=principal_id, key=key, workspace_id=workspace_id, run_id=run_id)


@dataclass(frozen=True, kw_only=True, slots=True)
class LockedThread:
    """The thread a resume locked, read after the lock together with the facts the resume checks there."""

    thread: ThreadRow
    authority: AuthorityFacts
    """The resuming principal's §4.3 facts (`auth.read_authority`)."""
    workspace_has_subscriptions: bool
    """Whether the thread's workspace has an enabled webhook subscription (`run.accepted` is staged for it)."""


_LOCK_THREAD = select(threads.c.id).where(threads.c.id == bindparam("lock_thread_id")).with_for_update()
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


async def lock_thread_for_resume(conn: AsyncConnection, *, thread_id: str, principal_id: str) -> LockedThread | None:
    """Lock the thread row (`FOR UPDATE`; SQLite already holds the write lock), then read it with its state, the
    principal's authority facts and the workspace's subscriptions, all after the lock (one statement: on
    PostgreSQL it sees what committed while it waited). `None` if the thread does not exist."""
    if not await fetch_rows(conn, _LOCK_THREAD, {"lock_thread_id": thread_id}):
        return None
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
