"""A control process killed between the POST and the settle (failpoint `outbox_before_settle`): once its claim
lapses the row is claimed and delivered again — at least once, never lost (§9.2, S-110, S-111). An in-database
handler's row (checkpoint cleanup) killed at the same point loses its claim and its work together."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest
from sqlalchemy import func, select, update

from candor.service.failpoints import ENV_VAR, EXIT_CODE
from candor.service.outbox.delivery import deliver_outbox
from candor.service.store.runs.outbox_staging import stage_run_event
from candor.service.store.schema.dialect import db_now
from candor.service.store.schema.tables import checkpoints, outbox
from candor.service.worker import WorkerLoop

from outbox import support
from worker.support import add_thread_run

PROC = Path(__file__).with_name("_deliver_proc.py")


@pytest.mark.crash
async def test_killed_before_settle_is_delivered_again_after_the_claim_lapses(db, tenant, receiver, clock) -> None:
    """S-111, §9.2: the killed sender's claim lapses; the next pass delivers the same delivery id again."""
    async with db.engine.begin() as conn:
        await support.add_subscription(conn, tenant, url=receiver.url, events=["run.accepted"])
        ref = await add_thread_run(conn, tenant)
        await stage_run_event(conn, event_type="run.accepted", run_row_or_id=ref.run_id)
    (staged,) = await support.outbox_rows(db.engine)

    env = {**os.environ, ENV_VAR: "outbox_before_settle", "CANDOR_TEST_KEY": support.KEY}
    process = await asyncio.create_subprocess_exec(sys.executable, str(PROC), db.url, env=env)
    assert await asyncio.wait_for(process.wait(), 60) == EXIT_CODE
    assert len(receiver.received) == 1  # the POST happened, the settle did not

    row = await support.outbox_row(db.engine, staged["id"])
    assert row["status"] == "pending" and row["attempts"] == 1 and row["lease_token_hash"] is not None
    service = support.make_service(db.url, db.engine, clock=clock)
    assert (await deliver_outbox(service))["webhook"] == 0  # still leased by the dead process

    # The lease runs out on the database clock (lease_seconds = 60): move its deadline into the past.
    async with db.engine.begin() as conn:
        await conn.execute(update(outbox).values(lease_expires_at=db_now() - 1))
    assert (await deliver_outbox(service))["webhook"] == 1
    row = await support.outbox_row(db.engine, staged["id"])
    assert row["status"] == "delivered" and row["attempts"] == 2
    ids = [request.headers["Candor-Delivery-Id"] for request in receiver.received]
    assert ids == [staged["id"], staged["id"]]  # at least once, same delivery id for deduplication


@pytest.mark.crash
async def test_killed_inside_a_cleanup_transaction_leaves_no_claim_and_no_cleanup(db, tenant, clock) -> None:
    """§9.2, §9.6, S-47: a control process killed after a `checkpoint_cleanup` row's work but before its settle
    (one transaction: claim, cleanup, settle) leaves the row exactly as staged (no claim, no attempt used, no lease
    to wait out) and the run's envelopes untouched; the next pass cleans and delivers it after one attempt."""
    service = support.make_service(db.url, db.engine, clock=clock)
    async with db.engine.begin() as conn:
        ref = await add_thread_run(conn, tenant, script="tools")
    await WorkerLoop(service, worker_id="w1").run_until_idle(timeout=30)
    (staged,) = await support.outbox_rows(db.engine, kind="checkpoint_cleanup")
    envelopes_before = await _envelope_count(db, ref.run_id)
    assert envelopes_before >= 2

    env = {**os.environ, ENV_VAR: "outbox_before_settle", "CANDOR_TEST_KEY": support.KEY}
    process = await asyncio.create_subprocess_exec(sys.executable, str(PROC), db.url, env=env)
    assert await asyncio.wait_for(process.wait(), 60) == EXIT_CODE

    row = await support.outbox_row(db.engine, staged["id"])
    assert (row["status"], row["attempts"], row["lease_token_hash"]) == ("pending", 0, None)
    assert await _envelope_count(db, ref.run_id) == envelopes_before  # the cleanup rolled back with the claim

    assert (await deliver_outbox(service))["checkpoint_cleanup"] == 1  # no lease to wait out
    row = await support.outbox_row(db.engine, staged["id"])
    assert (row["status"], row["attempts"]) == ("delivered", 1)
    assert await _envelope_count(db, ref.run_id) == 1  # only the run's last checkpoint keeps its envelope


async def _envelope_count(db, run_id: str) -> int:
    query = select(func.count()).where(checkpoints.c.run_id == run_id, checkpoints.c.envelope.is_not(None))
    async with db.engine.connect() as conn:
        return int((await conn.execute(query)).scalar_one())
