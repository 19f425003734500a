"""Checkpoint cleanup (§9.6): the `checkpoint_cleanup` outbox handler's store work, one bounded page at a time.

Every seal stages a `checkpoint_cleanup` row (store/runs/outbox_staging.py); its handler (outbox/delivery.py) calls
`cleanup_page_locked` inside the transaction that claims and settles the row, and keeps the returned cursor in the
row's payload between pages. `cleanup_checkpoint_page` is the same page in a transaction of its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Integer, and_, bindparam, delete, func, select, union_all, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from ..db.engine import write_transaction
from ..schema.tables import checkpoint_messages, checkpoints, runs, threads

__all__ = ("CLEANUP_PAGE", "cleanup_checkpoints", "cleanup_checkpoint_page", "cleanup_page_locked")


CLEANUP_PAGE = 1000
"""§9.6: checkpoints looked at per `checkpoint_cleanup` invocation."""


async def cleanup_checkpoints(engine: AsyncEngine, *, run_id: str) -> int:
    """All pages of `cleanup_checkpoint_page` (tests and tools); returns rows touched."""
    touched, after = 0, 0
    while True:
        count, next_after = await cleanup_checkpoint_page(engine, run_id=run_id, after=after)
        touched += count
        if next_after is None:
            return touched
        after = next_after


async def cleanup_checkpoint_page(
    engine: AsyncEngine, *, run_id: str, after: int = 0, limit: int = CLEANUP_PAGE
) -> tuple[int, int | None]:
    """§9.6 for one sealed run, checkpoints with `seq > after` (at most `limit`): delete shadowed message rows and
    clear superseded envelopes. Returns the rows touched and the cursor of the next page (None when done).

    A checkpoint is protected when it is any run's current or start checkpoint or a thread's imported base (S-47);
    its messages and envelope stay. For the others, message rows at or beyond the largest `kept` of any checkpoint
    based on them are unreachable and deleted (only when a later checkpoint of the same run shadows them), and the
    envelope of every checkpoint but the run's last one is cleared. Messages packed in a checkpoint's own row
    (migration 0007) stay with it: reclaiming the shadowed part would rewrite the row, and checkpoint messages are
    insert-only (S-40); only a history rewrite leaves such messages unreachable.
    """
    async with write_transaction(engine) as conn:
        return await cleanup_page_locked(conn, run_id=run_id, after=after, limit=limit)


_c, _m = checkpoints.c, checkpoint_messages.c

# Built once: a page costs the control process its statements' execution, not their construction through
# SQLAlchemy's operator and coercion machinery. A page is a contiguous
# range of one run's `seq`, so every lookup names it by its bounds, never by a list of its ids: a list would be
# rendered into each statement as one parameter per checkpoint, and be a new statement text for every length.
_LAST_SEQ = select(func.max(_c.seq)).where(_c.run_id == bindparam("page_run")).scalar_subquery()
_PAGE_ROWS = (
    select(_c.id, _c.seq, _c.count)
    .where(_c.run_id == bindparam("page_run"), _c.seq > bindparam("page_after"), _c.seq < func.coalesce(_LAST_SEQ, 0))
    .order_by(_c.seq)
    .limit(bindparam("page_limit", type_=Integer))
)
_IN_PAGE = and_(_c.run_id == bindparam("page_run"), _c.seq > bindparam("page_after"), _c.seq <= bindparam("page_last"))
_PAGE_IDS = select(_c.id).where(_IN_PAGE)
# Every lookup is an index search (migration 0005): a page must not read whole tables that grow with every run. A
# run's `checkpoint_id` only ever names one of its own checkpoints (the step commit moves it to the checkpoint it
# inserted for that run; an insert leaves it NULL), so only this run can point there by it.
_POINTING = union_all(
    select(runs.c.checkpoint_id.label("id")).where(
        runs.c.id == bindparam("page_run"), runs.c.checkpoint_id.in_(_PAGE_IDS)
    ),
    select(runs.c.start_checkpoint_id).where(runs.c.start_checkpoint_id.in_(_PAGE_IDS)),
    select(threads.c.base_checkpoint_id).where(threads.c.base_checkpoint_id.in_(_PAGE_IDS)),
)
_CHILDREN = select(_c.base_id, _c.kept, _c.run_id).where(_c.base_id.in_(_PAGE_IDS))
_CLEAR_ENVELOPES = update(checkpoints).where(_IN_PAGE, _c.envelope.is_not(None)).values(envelope=None)
_CLEAR_UNPROTECTED = (
    update(checkpoints)
    .where(_IN_PAGE, _c.id.not_in(bindparam("page_protected", expanding=True)), _c.envelope.is_not(None))
    .values(envelope=None)
)
_DROP_SHADOWED = delete(checkpoint_messages).where(
    _m.checkpoint_id == bindparam("shadowed_checkpoint"), _m.index >= bindparam("kept_from")
)


async def cleanup_page_locked(
    conn: AsyncConnection, *, run_id: str, after: int = 0, limit: int = CLEANUP_PAGE
) -> tuple[int, int | None]:
    """`cleanup_checkpoint_page` inside the caller's write transaction."""
    touched = 0
    rows = (
        (await conn.execute(_PAGE_ROWS, {"page_run": run_id, "page_after": after, "page_limit": limit}))
        .mappings()
        .all()
    )
    if not rows:
        return 0, None
    page = {"page_run": run_id, "page_after": after, "page_last": rows[-1]["seq"]}
    protected = set((await conn.execute(_POINTING, page)).scalars())
    cleared = [row for row in rows if row["id"] not in protected]  # never the run's last one (excluded above)
    if not cleared:
        return touched, _next_page(rows, limit)
    # A page is a handful of statements, not a few per checkpoint: an 80-step run has 161 checkpoints.
    children: dict[str, list[Any]] = {}
    for child in (await conn.execute(_CHILDREN, page)).all():
        children.setdefault(child.base_id, []).append(child)
    for row in cleared:
        shadowed = any(child.run_id == run_id for child in children.get(row["id"], ()))
        needed = max((child.kept for child in children.get(row["id"], ())), default=row["count"])
        if shadowed and needed < row["count"]:  # a history rewrite: rare, one DELETE each
            result = await conn.execute(_DROP_SHADOWED, {"shadowed_checkpoint": row["id"], "kept_from": needed})
            touched += int(result.rowcount or 0)
    if protected:
        result = await conn.execute(_CLEAR_UNPROTECTED, {**page, "page_protected": sorted(protected)})
    else:
        result = await conn.execute(_CLEAR_ENVELOPES, page)
    touched += int(result.rowcount or 0)
    return touched, _next_page(rows, limit)


def _next_page(rows: Sequence[Any], limit: int) -> int | None:
    """The cursor of the next page: the last `seq` looked at when the page was full, else None (done)."""
    return int(rows[-1]["seq"]) if len(rows) == limit else None
