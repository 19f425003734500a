"""Inbox entry reads and the user's changes to pending entries (§8.3, §8.5): list, edit, withdraw, reorder.

Every write runs inside the caller's write transaction after `threads.lock_thread()`, which serializes it with
posts, archive, `advance_thread()` and the worker's steer hand-over (§7.3 lock order). The updates are still fenced
by `status = 'pending'`: a write that finds the entry no longer pending changes nothing and reports it, so the
caller can answer 409 instead of half-applying the request.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from sqlalchemy import Select, bindparam, func, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from ..reads.views import EntryRow
from ..schema.dialect import db_now
from ..schema.tables import inbox_entries
from .submit import options_digest, payload_size

__all__ = (
    "EntryEdit",
    "select_entries",
    "list_entries",
    "edit_pending_entry",
    "withdraw_pending_entry",
    "move_pending_entries",
)


@dataclass(frozen=True, kw_only=True, slots=True)
class EntryEdit:
    """The new content of a pending entry; `size` and `options_digest` follow from it as when it was posted."""

    payload: dict[str, Any]
    delivery: Literal["steer", "next_run"]
    agent: str | None
    options: dict[str, Any] | None


def select_entries(
    *, workspace_id: str, thread_id: str, status: str | None, limit: int, after: int | None
) -> Select[Any]:
    """A thread's entries in position order, optionally of one status, after the keyset position `after`."""
    e = inbox_entries.c
    query = select(inbox_entries).where(e.thread_id == thread_id, e.workspace_id == workspace_id)
    if status is not None:
        query = query.where(e.status == status)
    if after is not None:
        query = query.where(e.position > after)
    return query.order_by(e.position).limit(limit)


async def list_entries(
    conn: AsyncConnection, *, workspace_id: str, thread_id: str, status: str | None, limit: int, after: int | None
) -> list[EntryRow]:
    query = select_entries(workspace_id=workspace_id, thread_id=thread_id, status=status, limit=limit, after=after)
    return [EntryRow.from_mapping(row) for row in (await conn.execute(query)).mappings()]


def _pending(entry_id: str) -> Any:
    return (inbox_entries.c.id == entry_id) & (inbox_entries.c.status == "pending")


async def edit_pending_entry(conn: AsyncConnection, *, entry_id: str, edit: EntryEdit) -> bool:
    """Replace a pending entry's content (S-74); `False` when it is no longer pending (nothing changed)."""
    result = await conn.execute(
        update(inbox_entries)
        .where(_pending(entry_id))
        .values(
            payload=edit.payload,
            size=payload_size(edit.payload),
            delivery=edit.delivery,
            agent=edit.agent,
            options=edit.options,
            options_digest=None if edit.options is None else options_digest(edit.options),
        )
    )
    return result.rowcount == 1


async def withdraw_pending_entry(conn: AsyncConnection, *, entry_id: str) -> bool:
    """A pending entry becomes `withdrawn` (final, S-76; it keeps its idempotency key, S-92); `False` when it is
    no longer pending (nothing changed)."""
    result = await conn.execute(
        update(inbox_entries).where(_pending(entry_id)).values(status="withdrawn", finished_at=db_now())
    )
    return result.rowcount == 1


async def move_pending_entries(conn: AsyncConnection, *, thread_id: str, moves: Sequence[tuple[str, int]]) -> None:
    """Give pending entries new positions (`protocol.inbox.reordered_positions`) without breaking the unique
    `(thread_id, position)` constraint midway: both dialects check it row by row, so the moved entries first step
    aside to free positions above every position of the thread, then take their targets (all free by then)."""
    if not moves:
        return
    e = inbox_entries.c
    top = int(await conn.scalar(select(func.coalesce(func.max(e.position), 0)).where(e.thread_id == thread_id)) or 0)
    move = (
        update(inbox_entries)
        .where(e.id == bindparam("entry_id"), e.status == "pending")
        .values(position=bindparam("new_position"))
    )
    aside = [{"entry_id": entry_id, "new_position": top + n} for n, (entry_id, _) in enumerate(moves, start=1)]
    await conn.execute(move, aside)
    await conn.execute(move, [{"entry_id": entry_id, "new_position": position} for entry_id, position in moves])
