"""The workspace's runs across threads (`GET /v1/runs`), newest first, optionally only those awaiting a resume.

"Awaiting a resume" is exactly what `commands.resume_run` accepts (§8.6 step 4, §5.6): the run is `waiting`, it is
its thread's last run, nothing runs on the thread, the thread is not archived, and no resume successor exists yet.
A resumed waiting run keeps its `waiting` status for the record, so `status = 'waiting'` alone lists those too.

A page walks `ix_runs_workspace_created` (`workspace_id`, `created_at`, `id`) backwards from its cursor, or
`ix_runs_workspace_waiting` (the same columns over waiting runs only) when the list asks for waiting runs, so it
reads about `limit` rows however many runs the workspace has; the cursor starts the index range
(`dialect.past_keyset`).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Select, and_, exists, select
from sqlalchemy.ext.asyncio import AsyncConnection

from ..runs.current_checkpoint import run_columns
from ..schema.dialect import past_keyset
from ..schema.tables import runs, threads
from .views import RunRow

__all__ = ("select_workspace_runs", "list_workspace_runs")

_successor = runs.alias("resume_successor")


def select_workspace_runs(
    *,
    workspace_id: str,
    status: str | None,
    awaiting_resume: bool,
    limit: int,
    before: tuple[float, str] | None = None,
) -> Select[Any]:
    query = select(*run_columns()).where(runs.c.workspace_id == workspace_id)
    if status is not None:
        query = query.where(runs.c.status == status)
    if awaiting_resume:
        has_successor = exists().where(and_(_successor.c.parent_run_id == runs.c.id, _successor.c.trigger == "resume"))
        query = query.join(threads, threads.c.id == runs.c.thread_id).where(
            runs.c.status == "waiting",
            threads.c.last_run_id == runs.c.id,
            threads.c.current_run_id.is_(None),
            threads.c.archived_at.is_(None),
            ~has_successor,
        )
    if before is not None:
        query = query.where(past_keyset(runs.c.created_at, runs.c.id, before, newest_first=True))
    return query.order_by(runs.c.created_at.desc(), runs.c.id.desc()).limit(limit)


async def list_workspace_runs(
    conn: AsyncConnection,
    *,
    workspace_id: str,
    status: str | None,
    awaiting_resume: bool,
    limit: int,
    before: tuple[float, str] | None = None,
) -> list[RunRow]:
    query = select_workspace_runs(
        workspace_id=workspace_id, status=status, awaiting_resume=awaiting_resume, limit=limit, before=before
    )
    return [RunRow.from_mapping(row) for row in (await conn.execute(query)).mappings()]
