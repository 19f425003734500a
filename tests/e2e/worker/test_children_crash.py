"""A worker process dies after a child spawn committed but before the parent's next checkpoint (§7.13, H-52).

The first worker is this module run as a script (`python test_children_crash.py DATABASE_URL WORKER_ID`) with
`CANDOR_FAILPOINTS=checkpoint_before_commit@3`: it commits the parent's model boundary (1) and the tool boundary
holding the `start_child_run` call (2), runs the tool (the fenced spawn commits), and dies inside the commit of the
tool's return (3). After its lease expires the recovering attempt replays the retry-safe call, which must return
the child the first execution created instead of starting a second one.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

if __name__ == "__main__":  # the crashing worker process: make `worker.*`, `integration.*` importable like pytest does
    sys.path[:0] = [str(Path(__file__).resolve().parents[2] / "support"), str(Path(__file__).resolve().parents[2])]

from sqlalchemy import select

from candor.service.core import Service
from candor.service.store.schema.tables import runs, threads
from candor.service.worker import WorkerLoop

from integration.worker.test_children import make_registry, make_service
from worker import support
from worker.support import add_thread_run, attempt_rows, run_row

pytestmark = [pytest.mark.crash, pytest.mark.postgres]


@pytest.mark.parametrize("db_kind", ["postgresql"], indirect=True)
async def test_replayed_spawn_after_a_crash_returns_the_same_child(db, tenant) -> None:
    """§7.13, H-52: the spawn is idempotent per (parent run, tool call id) and declared retry-safe, so recovery
    replays it (`tool_recovery="declared"`) and gets the first child back; exactly one child exists."""
    async with db.engine.begin() as conn:
        parent = await add_thread_run(conn, tenant, agent="parent", script="spawn")
    await support.run_until_failpoint([__file__, db.url, "worker-first"], "checkpoint_before_commit@3")

    # The spawn committed; the checkpoint holding the tool's return did not.
    run = await run_row(db.engine, parent.run_id)
    assert (run["status"], run["checkpoint_seq"]) == ("running", 2)
    async with db.engine.connect() as conn:
        (first_child,) = (await conn.execute(select(threads).where(threads.c.origin_run_id == parent.run_id))).all()
        (child_run_id,) = (await conn.execute(select(runs.c.id).where(runs.c.thread_id == first_child.id))).scalars()

    expiring = make_service(db, lease_seconds=3)

    await support.wait_for_lease_expiry(expiring)
    await support.make_due(db.engine, parent.run_id)
    await WorkerLoop(make_service(db), worker_id="worker-second").run_until_idle(timeout=30)

    run = await run_row(db.engine, parent.run_id)
    assert (run["status"], run["output"], run["attempts"]) == ("completed", f"ok {child_run_id}", 2)
    attempts = await attempt_rows(db.engine, parent.run_id)
    assert [(a["status"], a["start_reason"]) for a in attempts] == [("failed", "initial"), ("succeeded", "recovery")]
    async with db.engine.connect() as conn:
        children = (await conn.execute(select(threads.c.id).where(threads.c.origin_run_id == parent.run_id))).all()
        child = (await conn.execute(select(runs.c.status).where(runs.c.id == child_run_id))).scalar_one()
    assert [row.id for row in children] == [first_child.id]
    assert child == "completed"


async def _crashing_worker(url: str, worker_id: str) -> None:
    service = await Service.open(support.make_settings(url, lease_seconds=3), agents=make_registry())
    try:
        await WorkerLoop(service, worker_id=worker_id, slots=1).run_forever()
    finally:
        await service.close()


if __name__ == "__main__":
    asyncio.run(_crashing_worker(sys.argv[1], sys.argv[2]))
