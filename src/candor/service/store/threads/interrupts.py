"""Interrupting runs and archiving threads (spec §7.12, S-58–S-60, S-64): the writes, under the thread lock.

An `accepted` run has no attempt, so it is sealed `cancelled` here at once (§5.2 `accepted → cancelled`): the
thread's `current_run_id` is cleared, `last_run_id` set, and its assigned entries fail with `run_ended` (§7.10).
A `running` run only gets `cancel_requested_at`; its worker honours it at the next heartbeat (S-57).
"""

from __future__ import annotations

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from ...protocol.outcomes import CANCELLED_MESSAGE
from ..reads.views import RunRow, load_run
from ..runs.outbox_staging import stage_seal_rows
from ..schema.dialect import db_now
from ..schema.tables import inbox_entries, runs, threads

__all__ = ("RUN_ENDED_MESSAGE", "lock_run", "cancel_accepted_run", "request_cancel", "archive_thread")

RUN_ENDED_MESSAGE = "The run this entry was assigned to ended"


async def lock_run(conn: AsyncConnection, *, run_id: str) -> RunRow | None:
    """Lock the run row (after its thread, §7.3) and read it."""
    if await conn.scalar(select(runs.c.id).where(runs.c.id == run_id).with_for_update()) is None:
        return None
    return await load_run(conn, run_id=run_id)


async def cancel_accepted_run(conn: AsyncConnection, *, run_id: str, thread_id: str) -> int:
    """S-58: seal an `accepted` run `cancelled` at once; returns how many assigned entries failed `run_ended`."""
    await conn.execute(
        update(runs)
        .where(runs.c.id == run_id, runs.c.status == "accepted")
        .values(
            status="cancelled",
            sealed_at=db_now(),
            failure={"code": "cancelled", "message": CANCELLED_MESSAGE},
            version=runs.c.version + 1,
        )
    )
    await conn.execute(
        update(threads)
        .where(threads.c.id == thread_id, threads.c.current_run_id == run_id)
        .values(current_run_id=None, last_run_id=run_id, updated_at=db_now())
    )
    failed = await conn.execute(
        update(inbox_entries)
        .where(inbox_entries.c.assigned_run_id == run_id, inbox_entries.c.status == "assigned")
        .values(status="failed", failure={"code": "run_ended", "message": RUN_ENDED_MESSAGE}, finished_at=db_now())
    )
    # S-106: a seal without an attempt stages `run.cancelled` and the `checkpoint_cleanup` row.
    await stage_seal_rows(conn, run_id=run_id, attempt_id=None)
    return int(failed.rowcount or 0)


async def request_cancel(conn: AsyncConnection, *, run_id: str) -> None:
    """S-60: set `cancel_requested_at` on a running run, only the first time."""
    await conn.execute(
        update(runs)
        .where(runs.c.id == run_id, runs.c.status == "running", runs.c.cancel_requested_at.is_(None))
        .values(cancel_requested_at=db_now(), version=runs.c.version + 1)
    )


async def archive_thread(conn: AsyncConnection, *, thread_id: str) -> int:
    """S-64: set `archived_at` and withdraw the pending entries; returns how many were withdrawn.

    The caller interrupts the active run; entries assigned to it follow the run's seal (§7.10).
    """
    withdrawn = await conn.execute(
        update(inbox_entries)
        .where(inbox_entries.c.thread_id == thread_id, inbox_entries.c.status == "pending")
        .values(status="withdrawn", finished_at=db_now())
    )
    await conn.execute(
        update(threads)
        .where(threads.c.id == thread_id, threads.c.archived_at.is_(None))
        .values(archived_at=db_now(), updated_at=db_now(), version=threads.c.version + 1)
    )
    return int(withdrawn.rowcount or 0)
