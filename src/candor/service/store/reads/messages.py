"""The messages a run added (§8.3 `GET /v1/runs/{run_id}/messages`), read page by page from its latest checkpoint.

A run's added messages are the history of its latest checkpoint after the history it started from (its start
checkpoint's `count` messages; none for a run without one). Only the message rows of the requested window are
read: the checkpoint chain gives the ranges (`plan_ranges`), cut to the window, read from the packed rows (or the
rows of older checkpoints) of those checkpoints only, and every body is checked
against its digest (S-46, `CheckpointCorrupt` on a mismatch or a missing row). Bodies are returned as the
pydantic-ai message JSON they store.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncConnection

from ...errors import CheckpointCorrupt
from ..checkpoints.incremental import plan_ranges, read_message_ranges, select_chain
from ..schema.tables import checkpoints

__all__ = ("MessagePage", "window_ranges", "read_added_messages", "iter_added_messages")


@dataclass(frozen=True, kw_only=True, slots=True)
class MessagePage:
    messages: tuple[Any, ...]
    """pydantic-ai message JSON, in history order."""
    more: bool
    """Whether the run added messages after this page."""


def window_ranges(ranges: Sequence[tuple[str, int, int]], low: int, high: int) -> list[tuple[str, int, int]]:
    """The parts of the row ranges `(checkpoint_id, lo, hi)` that fall inside the indexes `[low, high)` (pure)."""
    cut = [(checkpoint_id, max(lo, low), min(hi, high)) for checkpoint_id, lo, hi in ranges]
    return [(checkpoint_id, lo, hi) for checkpoint_id, lo, hi in cut if lo < hi]


async def _count(conn: AsyncConnection, checkpoint_id: str) -> int:
    count = await conn.scalar(select(checkpoints.c.count).where(checkpoints.c.id == checkpoint_id))
    if count is None:
        raise CheckpointCorrupt(f"checkpoint {checkpoint_id} not found")
    return int(count)


@dataclass(frozen=True, kw_only=True, slots=True)
class _AddedHistory:
    """Where a run's added messages are stored: the row ranges of its latest checkpoint's history, from `start`."""

    checkpoint_id: str
    ranges: list[tuple[str, int, int]]
    start: int
    count: int


async def _added_history(
    conn: AsyncConnection, *, checkpoint_id: str, start_checkpoint_id: str | None
) -> _AddedHistory:
    start = 0 if start_checkpoint_id is None else await _count(conn, start_checkpoint_id)
    chain = [tuple(row) for row in (await conn.execute(select_chain(checkpoint_id))).all()]
    ranges = plan_ranges(chain)
    return _AddedHistory(checkpoint_id=checkpoint_id, ranges=ranges, start=start, count=int(chain[0][3]))


async def _read_window(conn: AsyncConnection, history: _AddedHistory, low: int, high: int) -> tuple[Any, ...]:
    """The message JSON of history indexes `[low, high)`, every body checked against its digest (S-46)."""
    window = window_ranges(history.ranges, low, high)
    bodies: list[str | None] = [None] * (high - low)
    async for index, message in read_message_ranges(conn, window):
        bodies[index - low] = message.body
    if any(body is None for body in bodies):
        raise CheckpointCorrupt(f"checkpoint {history.checkpoint_id} is missing message rows")
    return tuple(json.loads(body) for body in bodies if body is not None)


async def read_added_messages(
    conn: AsyncConnection, *, checkpoint_id: str | None, start_checkpoint_id: str | None, offset: int, limit: int
) -> MessagePage:
    """Messages `offset … offset + limit − 1` of those the checkpoint's history adds to the start checkpoint's."""
    if checkpoint_id is None:  # the run has not committed: it added nothing yet
        return MessagePage(messages=(), more=False)
    history = await _added_history(conn, checkpoint_id=checkpoint_id, start_checkpoint_id=start_checkpoint_id)
    low = history.start + offset
    high = min(low + limit, history.count)
    if low >= high:
        return MessagePage(messages=(), more=False)
    return MessagePage(messages=await _read_window(conn, history, low, high), more=high < history.count)


async def iter_added_messages(
    conn: AsyncConnection, *, checkpoint_id: str | None, start_checkpoint_id: str | None, page_size: int
) -> AsyncIterator[tuple[Any, ...]]:
    """Every message the run added, `page_size` at a time (memory stays bounded by a page), in history order.

    The checkpoint chain is read once for all pages: a page of `read_added_messages` reads it again, and a
    thread's chain is as long as its checkpoints, so reading a long run's messages page by page that way costs
    the square of its length.
    """
    if checkpoint_id is None:
        return
    history = await _added_history(conn, checkpoint_id=checkpoint_id, start_checkpoint_id=start_checkpoint_id)
    for low in range(history.start, history.count, page_size):
        yield await _read_window(conn, history, low, min(low + page_size, history.count))
