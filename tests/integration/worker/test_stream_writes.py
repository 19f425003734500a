"""Live stream entries cost no write transaction of their own at fast steps, and still show up live at slow ones
(§7.8 step 7, §8.7, issue 12: at most two write transactions per step)."""

from __future__ import annotations

from sqlalchemy import select

from candor.service.store.schema.tables import checkpoints, stream_entries
from candor.service.worker import WorkerLoop

from transactions import write_transactions
from worker import support
from worker.support import add_thread_run, run_row


def _touches(transaction: list[str], table: str) -> bool:
    return any(f"INSERT INTO {table.upper()} " in statement for statement in transaction)


async def test_deltas_ride_in_the_boundary_commits(db, tenant, control) -> None:
    """S-35, S-36: a fast run writes its deltas only inside checkpoint commits; no transaction writes stream
    entries without a checkpoint, and the deltas are there."""
    service = support.make_service(db.url, db.engine, stream_coalesce_seconds=30)
    async with db.engine.begin() as conn:
        ref = await add_thread_run(conn, tenant, script="step")
    with write_transactions(db.engine) as transactions:
        await WorkerLoop(service, worker_id="w1").run_until_idle(timeout=30)
    assert (await run_row(db.engine, ref.run_id))["status"] == "completed"
    stream_only = [t for t in transactions if _touches(t, "stream_entries") and not _touches(t, "checkpoints")]
    assert stream_only == []
    async with db.engine.connect() as conn:
        types = (await conn.execute(select(stream_entries.c.type).order_by(stream_entries.c.id))).scalars().all()
        commits = len((await conn.execute(select(checkpoints.c.id))).all())
    assert "delta" in types
    assert types.count("boundary") == commits  # one per checkpoint, the final (sealing) commit included
    assert types[-1] == "boundary"


async def test_deltas_of_a_slow_step_are_written_before_its_boundary(db, tenant, control) -> None:
    """§8.7: when the next boundary is far off (a slow tool), the buffered deltas are written on their own once
    the oldest waited `worker.stream_coalesce_seconds`, so a reader sees them while the step still runs."""
    service = support.make_service(db.url, db.engine, stream_coalesce_seconds=0.05)
    async with db.engine.begin() as conn:
        ref = await add_thread_run(conn, tenant, script="slow", options={"sleep": 1.0})
    with write_transactions(db.engine) as transactions:
        await WorkerLoop(service, worker_id="w1").run_until_idle(timeout=30)
    assert (await run_row(db.engine, ref.run_id))["status"] == "completed"
    stream_only = [t for t in transactions if _touches(t, "stream_entries") and not _touches(t, "checkpoints")]
    assert stream_only, "the slow step's deltas waited for its boundary"
