"""The workspace's threads (`GET /v1/threads`), newest first, filtered by agent, derived state, id prefix or origin.

What the console's run inspector lists. The derived state (§5.6) is the first matching row of
`protocol.thread_state`'s table; `state_condition` writes the same table as SQL so that a filtered page is read in
the database. `tests/integration/http/test_http_inspection.py` checks the two agree: each state's filter lists exactly
the threads whose view (`thread_state`) has that state, over threads in every state and every way into it.

A page walks `ix_threads_workspace_created` (`workspace_id`, `created_at`, `id`) backwards from its cursor
(`dialect.past_keyset`); the filters are applied to the rows it walks, so an unfiltered page reads about `limit`
rows and a filtered one reads until it found `limit` matches.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, Select, and_, exists, false, not_, or_, select
from sqlalchemy.ext.asyncio import AsyncConnection

from ...protocol.thread_state import ThreadState
from ..schema.dialect import past_keyset
from ..schema.tables import runs, threads
from .views import ThreadRow, thread_row

__all__ = ("THREAD_STATES", "ThreadFilters", "state_condition", "select_workspace_threads", "list_workspace_threads")

THREAD_STATES: tuple[ThreadState, ...] = ("archived", "active", "waiting", "paused", "idle")

_last_run = runs.alias("listed_last_run")
_successor = runs.alias("listed_successor")
_has_successor = exists().where(
    and_(_successor.c.parent_run_id == threads.c.last_run_id, _successor.c.trigger == "resume")
)


def state_condition(state: ThreadState) -> ColumnElement[bool]:
    """The SQL of `protocol.thread_state(...) == state`, over `threads` outer-joined to its last run."""
    archived = threads.c.archived_at.is_not(None)
    active = threads.c.current_run_id.is_not(None)
    waiting = and_(_last_run.c.status == "waiting", not_(_has_successor))
    paused = _last_run.c.status.in_(("failed", "cancelled"))
    # Each state is its own row of the table and excludes every row above it (first match wins).
    earlier: list[ColumnElement[bool]] = []
    for name, condition in (("archived", archived), ("active", active), ("waiting", waiting), ("paused", paused)):
        if name == state:
            return and_(condition, *(not_(above) for above in earlier))
        earlier.append(condition.self_group())
    if state == "idle":
        # `_last_run.status` is NULL for a thread with no sealed run: `NOT (NULL IN (...))` is NULL, not true.
        return and_(*(not_(above) for above in earlier[:2]), or_(_last_run.c.id.is_(None), not_(or_(waiting, paused))))
    return false()


@dataclass(frozen=True, kw_only=True, slots=True)
class ThreadFilters:
    """The filters of one list request; every one optional."""

    agent: str | None = None
    state: ThreadState | None = None
    id_prefix: str | None = None
    origin_thread_id: str | None = None


def _like_prefix(prefix: str) -> str:
    """`prefix` as a LIKE pattern that matches it literally (ids are ASCII; `\\` is the escape character)."""
    escaped = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return escaped + "%"


def select_workspace_threads(
    *, workspace_id: str, filters: ThreadFilters, limit: int, before: tuple[float, str] | None = None
) -> Select[Any]:
    query = (
        select(threads, _last_run.c.status.label("last_run_status"), _has_successor.label("last_run_has_successor"))
        .select_from(threads.outerjoin(_last_run, _last_run.c.id == threads.c.last_run_id))
        .where(threads.c.workspace_id == workspace_id)
    )
    if filters.agent is not None:
        query = query.where(threads.c.agent == filters.agent)
    if filters.state is not None:
        query = query.where(state_condition(filters.state))
    if filters.id_prefix:
        query = query.where(threads.c.id.like(_like_prefix(filters.id_prefix), escape="\\"))
    if filters.origin_thread_id is not None:
        query = query.where(threads.c.origin_thread_id == filters.origin_thread_id)
    if before is not None:
        query = query.where(past_keyset(threads.c.created_at, threads.c.id, before, newest_first=True))
    return query.order_by(threads.c.created_at.desc(), threads.c.id.desc()).limit(limit)


async def list_workspace_threads(
    conn: AsyncConnection,
    *,
    workspace_id: str,
    filters: ThreadFilters,
    limit: int,
    before: tuple[float, str] | None = None,
) -> list[ThreadRow]:
    query = select_workspace_threads(workspace_id=workspace_id, filters=filters, limit=limit, before=before)
    return [thread_row(row) for row in (await conn.execute(query)).mappings()]
