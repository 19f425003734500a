"""In-database outbox handlers (§9.2, §9.6, issue 12): a `checkpoint_cleanup` row is claimed, worked and settled in
one transaction, and a failing batch rolls back whole before the usual path retries it row by row (S-109).

Every test runs on SQLite and PostgreSQL (`db`).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select, update

from candor.service.outbox import delivery
from candor.service.outbox.delivery import HandlerResult, InDatabaseHandler, deliver_outbox
from candor.service.outbox.webhooks import webhook_client
from candor.service.store.runs.outbox_staging import enqueue_once
from candor.service.store.schema.dialect import db_now
from candor.service.store.schema.tables import checkpoints, outbox
from candor.service.worker import WorkerLoop

from outbox import support
from outbox.support import outbox_rows
from transactions import write_transactions
from worker.support import add_thread_run


async def _stage_cleanups(db: Any, tenant: Any, run_ids: list[str]) -> None:
    async with db.engine.begin() as conn:
        for run_id in run_ids:
            await enqueue_once(
                conn,
                kind="checkpoint_cleanup",
                dedupe_key=run_id,
                target=run_id,
                payload={"run_id": run_id},
                workspace_id=tenant.workspace_id,
            )


async def test_cleanup_rows_cost_one_transaction_per_sub_batch(db, tenant, clock) -> None:
    """§9.6, §9.2, S-47: two sealed runs' cleanup rows (`parallel` = 2) are claimed, cleaned and settled in ONE
    committed transaction; each row is delivered after one attempt and the runs' superseded envelopes are gone."""
    service = support.make_service(db.url, db.engine, clock=clock)
    async with db.engine.begin() as conn:
        refs = [await add_thread_run(conn, tenant, script="tools") for _ in range(2)]
    await WorkerLoop(service, worker_id="w1").run_until_idle(timeout=30)
    assert len(await outbox_rows(db.engine, kind="checkpoint_cleanup")) == 2

    with write_transactions(db.engine) as transactions:
        settled = await deliver_outbox(service, handlers={"checkpoint_cleanup": delivery.handle_checkpoint_cleanup})

    assert settled == {"checkpoint_cleanup": 2}
    assert len(transactions) == 1
    rows = await outbox_rows(db.engine, kind="checkpoint_cleanup")
    assert [(row["status"], row["attempts"], row["lease_token_hash"]) for row in rows] == [("delivered", 1, None)] * 2
    async with db.engine.connect() as conn:
        for ref in refs:
            envelopes = (
                (
                    await conn.execute(
                        select(checkpoints.c.envelope)
                        .where(checkpoints.c.run_id == ref.run_id)
                        .order_by(checkpoints.c.seq)
                    )
                )
                .scalars()
                .all()
            )
            assert len(envelopes) >= 2 and all(e is None for e in envelopes[:-1]) and envelopes[-1] is not None


async def test_a_failing_row_rolls_back_its_batch_and_is_retried_on_its_own(db, tenant, clock) -> None:
    """§9.2, S-109: when the handler fails for one row, the one transaction rolls back whole (its neighbour's work
    included) and the pass falls back to the usual path: the neighbour is delivered, the failing row is settled
    `retry` after one attempt with the handler's error, not lost and not delivered."""
    calls: list[str] = []

    async def work(conn: Any, row: Any, ctx: Any) -> HandlerResult:
        calls.append(row.dedupe_key)
        if row.dedupe_key == "run_bad":
            raise RuntimeError("boom")
        return HandlerResult(outcome="delivered")

    service = support.make_service(db.url, db.engine, clock=clock)
    await _stage_cleanups(db, tenant, ["run_good", "run_bad"])
    async with db.engine.begin() as conn:  # claimed oldest first: the good row, then the bad one
        for key, age in (("run_good", 2), ("run_bad", 1)):
            await conn.execute(update(outbox).where(outbox.c.dedupe_key == key).values(available_at=db_now() - age))

    settled = await deliver_outbox(service, handlers={"checkpoint_cleanup": InDatabaseHandler(work)})

    assert settled == {"checkpoint_cleanup": 2}
    assert calls[:2] == ["run_good", "run_bad"]  # the batch, in claim order, until the bad row fails it
    assert sorted(calls[2:]) == ["run_bad", "run_good"]  # then each row on its own (concurrently: any order)
    rows = {row["dedupe_key"]: row for row in await outbox_rows(db.engine, kind="checkpoint_cleanup")}
    assert rows["run_good"]["status"] == "delivered" and rows["run_good"]["attempts"] == 1
    bad = rows["run_bad"]
    assert (bad["status"], bad["attempts"], bad["last_error"]) == ("pending", 1, "handler_error: RuntimeError")
    assert bad["lease_token_hash"] is None


async def test_an_in_database_handler_called_alone_runs_in_its_own_transaction(db, tenant, clock) -> None:
    """§9.2, §9.6: the fallback form (`handler(row, ctx)`) commits its work in exactly one transaction of its own,
    apart from the claim and the settle."""
    service = support.make_service(db.url, db.engine, clock=clock)
    async with db.engine.begin() as conn:
        ref = await add_thread_run(conn, tenant, script="tools")
    await WorkerLoop(service, worker_id="w1").run_until_idle(timeout=30)
    claim = delivery.claim_rows  # type: ignore[attr-defined]  # the claim delivery itself runs
    (row,) = await claim(db.engine, kind="checkpoint_cleanup", limit=1, lease_seconds=30, max_attempts=3)
    ctx = delivery.DeliveryContext(service=service, client=webhook_client(connections=1))
    try:
        with write_transactions(db.engine) as transactions:
            result = await delivery.handle_checkpoint_cleanup(row, ctx)
    finally:
        await ctx.client.aclose()
    assert result.outcome == "delivered"
    assert len(transactions) == 1 and any("UPDATE CHECKPOINTS" in statement for statement in transactions[0])
    assert not any("OUTBOX" in statement for statement in transactions[0])  # the claim and settle are not in it
    async with db.engine.connect() as conn:
        envelopes = select(func.count()).where(checkpoints.c.run_id == ref.run_id, checkpoints.c.envelope.is_not(None))
        assert (await conn.execute(envelopes)).scalar_one() == 1  # only the run's last checkpoint keeps its envelope
