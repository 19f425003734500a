"""Resume reads (spec §8.6): the replay lookup by key and the run to resume, read before locking (S-81–S-83).

Which row is which is decided by `protocol.resume.split_resume_lookup`; the successor (`protocol.resume.successor_of`)
is inserted by `threads.start_run()`, where the unique index `uq_runs_resume_request` (`resumed_by_id, request_key`)
and the live-run index decide between racing resumes (S-83).
"""

from __future__ import annotations

from sqlalchemy import and_, bindparam, or_, select
from sqlalchemy.ext.asyncio import AsyncConnection

from ..protocol.resume import ResumeLookup, split_resume_lookup
from .tables import runs
from .views import RunRow

__all__ = ("find_resume_by_key", "find_resume_and_run")


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
    found = [RunRow.from_mapping(row) for row in (await conn.execute(_RESUME_AND_RUN, params)).mappings()]
    return split_resume_lookup(found, principal_id=principal_id, key=key, workspace_id=workspace_id, run_id=run_id)
