"""`child_result` rows (§7.10, §9.5, S-118): staged by every non-waiting seal on a child thread, delivered as at most
one entry into the parent thread; a full parent inbox defers, an archived parent is ignored, a bad target is dead.

Every test runs on SQLite and PostgreSQL (`db`). The child threads are built as rows; their runs are sealed through
the service's own seal paths (an interrupt of an accepted run, a worker's recovery at `max_attempts`).
"""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import insert, select, update

from candor.service.outbox.delivery import deliver_outbox, handle_child_result
from candor.service.store.runs.outbox_staging import enqueue_once
from candor.service.store.schema.dialect import db_now
from candor.service.store.schema.tables import inbox_entries, outbox, threads
from candor.service.store.threads import interrupts as interrupts
from candor.service.worker import WorkerLoop

from outbox import support
from outbox.support import make_due, outbox_rows
from worker.support import RunRef, Tenant, add_thread_run, new_id, run_row

_HANDLERS = {"child_result": handle_child_result}


async def _child_of(conn: Any, tenant: Tenant, parent: RunRef, **run_values: Any) -> RunRef:
    """A child thread of `parent` (§5.1 origin ids) with an accepted run of its own."""
    thread_id = new_id("thr")
    await conn.execute(
        insert(threads).values(
            id=thread_id,
            workspace_id=tenant.workspace_id,
            origin="child",
            origin_thread_id=parent.thread_id,
            origin_run_id=parent.run_id,
            origin_tool_call_id="call_spawn",
            agent="scripted",
            created_at=db_now(),
            updated_at=db_now(),
        )
    )
    return await add_thread_run(conn, tenant, thread_id=thread_id, trigger="spawned", **run_values)


async def _cancelled_child(db: Any, tenant: Tenant) -> tuple[RunRef, RunRef]:
    """A parent thread with an active run, and a child whose accepted run is interrupted (sealed `cancelled`)."""
    async with db.engine.begin() as conn:
        parent = await add_thread_run(conn, tenant)
        child = await _child_of(conn, tenant, parent)
        await interrupts.cancel_accepted_run(conn, run_id=child.run_id, thread_id=child.thread_id)
    return parent, child


async def _entries(db: Any, thread_id: str) -> list[Any]:
    async with db.engine.connect() as conn:
        e = inbox_entries.c
        query = select(inbox_entries).where(e.thread_id == thread_id, e.kind == "child_result")
        return list((await conn.execute(query)).mappings().all())


async def test_interrupted_child_delivers_one_entry_even_when_delivered_twice(db, tenant) -> None:
    """S-118, §9.5: the seal stages exactly one row (dedupe key = run id, target = parent thread); delivery adds
    one steer entry without options whose text is the canonical JSON result; a second delivery of the same row
    (at least once: the settle was lost) adds no second entry and still settles delivered."""
    service = support.make_service(db.url, db.engine)
    parent, child = await _cancelled_child(db, tenant)
    (row,) = await outbox_rows(db.engine, kind="child_result")
    assert (row["dedupe_key"], row["target"], row["payload"]) == (
        child.run_id,
        parent.thread_id,
        {"child_run_id": child.run_id},
    )

    assert await deliver_outbox(service, handlers=_HANDLERS) == {"child_result": 1}
    (entry,) = await _entries(db, parent.thread_id)
    assert (entry["delivery"], entry["status"], entry["options"], entry["child_run_id"], entry["agent"]) == (
        "steer",
        "pending",
        None,
        child.run_id,
        None,
    )
    (item,) = entry["payload"]["content"]
    assert item["type"] == "text"
    assert json.loads(item["text"]) == {
        "child_run_id": child.run_id,
        "status": "cancelled",
        "output": None,
        "failure": {"code": "cancelled", "message": "The run was interrupted"},
    }
    assert (await run_row(db.engine, parent.run_id))["status"] == "accepted"  # active parent: a later commit steers

    async with db.engine.begin() as conn:  # the row comes back as if its settle had been lost
        await conn.execute(update(outbox).where(outbox.c.id == row["id"]).values(status="pending", settled_at=None))
    assert await deliver_outbox(service, handlers=_HANDLERS) == {"child_result": 1}
    assert [e["id"] for e in await _entries(db, parent.thread_id)] == [entry["id"]]
    (row,) = await outbox_rows(db.engine, kind="child_result")
    assert row["status"] == "delivered"


async def test_archived_parent_is_delivered_and_ignored(db, tenant) -> None:
    """S-118, §9.5: parent thread archived → the row settles `delivered` and no entry is added."""
    service = support.make_service(db.url, db.engine)
    parent, _ = await _cancelled_child(db, tenant)
    async with db.engine.begin() as conn:
        await interrupts.archive_thread(conn, thread_id=parent.thread_id)
    await deliver_outbox(service, handlers=_HANDLERS)
    (row,) = await outbox_rows(db.engine, kind="child_result")
    assert (row["status"], row["last_error"]) == ("delivered", None)
    assert await _entries(db, parent.thread_id) == []


async def test_full_parent_inbox_defers_and_never_drops(db, tenant) -> None:
    """S-118, §9.5, S-112: a full parent inbox settles `deferred` by 30 s without using up an attempt; once there
    is room the entry arrives."""
    service = support.make_service(db.url, db.engine)
    service.settings = service.settings.model_copy(
        update={"control": service.settings.control.model_copy(update={"inbox_count": 1})}
    )
    parent, child = await _cancelled_child(db, tenant)  # the parent's assigned source entry fills its inbox
    before = await support.db_time(db.engine)
    await deliver_outbox(service, handlers=_HANDLERS)
    (row,) = await outbox_rows(db.engine, kind="child_result")
    assert (row["status"], row["attempts"], row["last_error"]) == ("pending", 0, "inbox_full")
    assert row["available_at"] >= before + 29
    assert await _entries(db, parent.thread_id) == []

    async with db.engine.begin() as conn:  # the parent's run consumed its entry: there is room now
        await conn.execute(
            update(inbox_entries)
            .where(inbox_entries.c.id == parent.entry_id)
            .values(status="consumed", incorporated_checkpoint_seq=1, finished_at=db_now())
        )
    await make_due(db.engine, row["id"])
    await deliver_outbox(service, handlers=_HANDLERS)
    (row,) = await outbox_rows(db.engine, kind="child_result")
    assert row["status"] == "delivered"
    assert [e["child_run_id"] for e in await _entries(db, parent.thread_id)] == [child.run_id]


async def test_invalid_target_is_dead(db, tenant) -> None:
    """§9.5: a row whose parent thread or child run does not exist (or do not belong together) settles `dead`."""
    service = support.make_service(db.url, db.engine)
    parent, child = await _cancelled_child(db, tenant)
    async with db.engine.begin() as conn:
        await enqueue_once(
            conn,
            kind="child_result",
            dedupe_key="run_missing",
            target=parent.thread_id,
            payload={"child_run_id": "run_missing"},
            workspace_id=tenant.workspace_id,
        )
        await enqueue_once(
            conn,
            kind="child_result",
            dedupe_key="run_elsewhere",
            target=child.thread_id,
            payload={"child_run_id": child.run_id},
            workspace_id=tenant.workspace_id,
        )
        await conn.execute(update(outbox).where(outbox.c.dedupe_key == child.run_id).values(target="thr_missing"))
    await deliver_outbox(service, handlers=_HANDLERS)
    rows = await outbox_rows(db.engine, kind="child_result")
    assert [(r["status"], r["last_error"]) for r in rows] == [("dead", "invalid_target")] * 3
    assert await _entries(db, parent.thread_id) == [] and await _entries(db, child.thread_id) == []


async def test_recovery_seal_at_max_attempts_stages_the_row_and_waiting_does_not(db, tenant) -> None:
    """S-118, §7.10: a seal through recovery (transient failure at `max_attempts`) stages the row; a child run
    sealed `waiting` stages none; the idle parent then starts a run with trigger `child_result` (§8.5)."""
    service = support.make_service(db.url, db.engine)
    async with db.engine.begin() as conn:
        parent = await add_thread_run(conn, tenant)
        failing = await _child_of(conn, tenant, parent, script="unavailable", max_attempts=1)
        waiting = await _child_of(conn, tenant, parent, script="approval")
    await WorkerLoop(service, worker_id="w1").run_until_idle(timeout=30)

    assert (await run_row(db.engine, failing.run_id))["status"] == "failed"
    assert (await run_row(db.engine, waiting.run_id))["status"] == "waiting"
    assert (await run_row(db.engine, parent.run_id))["status"] == "completed"
    (row,) = await outbox_rows(db.engine, kind="child_result")
    assert row["dedupe_key"] == failing.run_id

    await deliver_outbox(service, handlers=_HANDLERS)
    (entry,) = await _entries(db, parent.thread_id)
    assert json.loads(entry["payload"]["content"][0]["text"])["failure"]["code"] == "model_unavailable"
    async with db.engine.connect() as conn:
        thread = (await conn.execute(select(threads).where(threads.c.id == parent.thread_id))).mappings().one()
    started = await run_row(db.engine, thread["current_run_id"])
    assert (started["trigger"], started["source_entry_id"]) == ("child_result", entry["id"])
    assert started["status"] == "accepted"
