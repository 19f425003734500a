"""Which threads the `advance_threads` sweep looks at: not archived, no active run, pending inbox entries."""

from __future__ import annotations

from sqlalchemy import Select, exists, select
from sqlalchemy.ext.asyncio import AsyncConnection

from ..schema.tables import inbox_entries, threads

__all__ = ("select_threads_to_advance", "threads_to_advance")


def select_threads_to_advance(*, after: str | None, limit: int) -> Select[tuple[str]]:
    """Candidates by id from `after`: the per-thread lock in `advance_thread` decides, this only narrows."""
    has_pending = exists().where(inbox_entries.c.thread_id == threads.c.id, inbox_entries.c.status == "pending")
    query = select(threads.c.id).where(threads.c.archived_at.is_(None), threads.c.current_run_id.is_(None), has_pending)
    if after is not None:
        query = query.where(threads.c.id > after)
    return query.order_by(threads.c.id).limit(limit)


async def threads_to_advance(conn: AsyncConnection, *, after: str | None, limit: int) -> list[str]:
    result = await conn.execute(select_threads_to_advance(after=after, limit=limit))
    return [str(thread_id) for thread_id in result.scalars()]
