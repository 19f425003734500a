"""Fenced writes, renewal, expiry and recovery at the store level (§7.3–§7.6): S-20…S-34, S-38, S-71."""

from __future__ import annotations

import asyncio
import dataclasses
import secrets
from typing import Any

import pytest
from sqlalchemy import func, select, update

from candor.service.control.sweeps import ExpiryCursor, expire_leases
from candor.service.errors import LeaseLost, StoreUnavailable
from candor.service.protocol.outcomes import Requeue, SealAfterRecovery
from candor.service.store.attempts.recovery import recover_attempt
from candor.service.store.attempts.seals import SealRequest, commit_checkpoint, failure, seal_run
from candor.service.store.checkpoints.incremental import CheckpointEnvelope, encode_envelope
from candor.service.store.runs.claims import claim_runs, start_attempt
from candor.service.store.runs.leases import renew_leases
from candor.service.store.schema.dialect import db_now
from candor.service.store.schema.tables import checkpoints, inbox_entries, run_attempts, runs, threads, usage_records
from candor.service.worker import supervisor as supervisor_module
from candor.service.worker.handle import AttemptHandle
from candor.service.worker.supervisor import Supervisor

from worker.support import add_thread_run, attempt_rows, new_id, run_row


async def _claim_one(engine: Any, *, lease_seconds: float = 30.0, worker_id: str = "w1") -> Any:
    [claimed] = await claim_runs(
        engine,
        worker_id=worker_id,
        agents=("scripted",),
        limit=1,
        lease_seconds=lease_seconds,
        randbytes=secrets.token_bytes,
    )
    return claimed


def _envelope(thread_id: str) -> Any:
    return encode_envelope(CheckpointEnvelope(thread_id=thread_id))


async def _commit(engine: Any, lease: Any, *, expected_seq: int = 0, **kwargs: Any) -> Any:
    return await commit_checkpoint(
        engine,
        lease,
        expected_seq=expected_seq,
        base_id=kwargs.pop("base_id", None),
        base_encoded=(),
        new_encoded=(),
        envelope=_envelope(lease.thread_id),
        **kwargs,
    )


async def _count(engine: Any, table: Any, *where: Any) -> int:
    async with engine.connect() as conn:
        count: int = (await conn.execute(select(func.count()).select_from(table).where(*where))).scalar_one()
        return count


async def _expire(engine: Any, attempt_id: str, *, seconds_ago: float = 1.0) -> None:
    async with engine.begin() as conn:  # moving an expiry earlier is allowed; extending an expired one is not (S-9)
        await conn.execute(
            update(run_attempts).where(run_attempts.c.id == attempt_id).values(lease_expires_at=db_now() - seconds_ago)
        )


@pytest.mark.parametrize("broken", ["token", "worker", "attempt", "expired"])
async def test_stale_lease_writes_nothing(db, tenant, broken: str) -> None:
    """S-20, S-21, S-22: a write with a lease whose token, worker, attempt or expiry no longer matches raises
    `LeaseLost` and changes nothing."""
    async with db.engine.begin() as conn:
        ref = await add_thread_run(conn, tenant)
    claimed = await _claim_one(db.engine)
    lease = claimed.lease
    if broken == "token":
        lease = dataclasses.replace(lease, token=secrets.token_bytes(32))
    elif broken == "worker":
        lease = dataclasses.replace(lease, worker_id="w2")
    elif broken == "attempt":
        lease = dataclasses.replace(lease, attempt_id=new_id("att"))
    else:
        await _expire(db.engine, lease.attempt_id)
    with pytest.raises(LeaseLost):
        await _commit(db.engine, lease, usage={"requests": 1})
    with pytest.raises(LeaseLost):
        await seal_run(db.engine, lease, SealRequest(status="failed", failure=failure("attempt_failed")))
    with pytest.raises(LeaseLost):
        await start_attempt(db.engine, lease, harness_run_id="run_" + "0" * 32)
    assert await _count(db.engine, checkpoints, checkpoints.c.run_id == ref.run_id) == 0
    assert await _count(db.engine, usage_records, usage_records.c.run_id == ref.run_id) == 0
    run = await run_row(db.engine, ref.run_id)
    assert (run["status"], run["checkpoint_seq"], run["failure"]) == ("running", 0, None)
    [attempt] = await attempt_rows(db.engine, ref.run_id)
    assert attempt["status"] == "leased"


async def test_superseded_attempt_cannot_commit(db, tenant) -> None:
    """S-20, S-38, S-39: after recovery the old lease is dead; the new attempt's commit needs the current seq."""
    async with db.engine.begin() as conn:
        ref = await add_thread_run(conn, tenant)
    old = (await _claim_one(db.engine)).lease
    first = await _commit(db.engine, old)
    assert first.seq == 1
    await recover_attempt(
        db.engine,
        run_id=ref.run_id,
        attempt_id=old.attempt_id,
        outcome="failed",
        failure_code="attempt_failed",
        lease=old,
    )
    async with db.engine.begin() as conn:
        await conn.execute(update(runs).where(runs.c.id == ref.run_id).values(available_at=db_now()))
    new = (await _claim_one(db.engine)).lease
    with pytest.raises(LeaseLost) as lost:
        await _commit(db.engine, old, expected_seq=1, base_id=first.checkpoint_id)
    assert lost.value.reason in ("attempt_not_current", "attempt_not_live")
    with pytest.raises(LeaseLost) as stale_seq:
        await _commit(db.engine, new, expected_seq=0)
    assert stale_seq.value.reason == "checkpoint_seq_changed"
    second = await _commit(db.engine, new, expected_seq=1, base_id=first.checkpoint_id)
    async with db.engine.connect() as conn:
        rows = (
            await conn.execute(
                select(checkpoints.c.seq, checkpoints.c.attempt)
                .where(checkpoints.c.run_id == ref.run_id)
                .order_by(checkpoints.c.seq)
            )
        ).all()
    assert [tuple(r) for r in rows] == [(1, 1), (2, 2)] and second.seq == 2


async def test_renewal_only_when_due(db, tenant) -> None:
    """S-23: a lease is pushed to now + lease_seconds only with ≤ 2/3 left, while live, unexpired and current."""
    async with db.engine.begin() as conn:
        fresh_ref = await add_thread_run(conn, tenant)
    fresh = (await _claim_one(db.engine)).lease
    async with db.engine.begin() as conn:
        due_ref = await add_thread_run(conn, tenant)
    due = (await _claim_one(db.engine)).lease
    async with db.engine.begin() as conn:
        gone_ref = await add_thread_run(conn, tenant)
    gone = (await _claim_one(db.engine)).lease
    async with db.engine.begin() as conn:
        await conn.execute(
            update(run_attempts).where(run_attempts.c.id == due.attempt_id).values(lease_expires_at=db_now() + 5)
        )
    await _expire(db.engine, gone.attempt_id)

    renewed = await renew_leases(db.engine, [fresh, due, gone], lease_seconds=30)
    assert renewed == {due.attempt_id}
    [attempt] = await attempt_rows(db.engine, due_ref.run_id)
    async with db.engine.connect() as conn:
        now = (await conn.execute(select(db_now()))).scalar_one()
    assert attempt["lease_expires_at"] - now == pytest.approx(30, abs=1)
    # a foreign token never renews (S-21)
    async with db.engine.begin() as conn:
        await conn.execute(
            update(run_attempts).where(run_attempts.c.id == fresh.attempt_id).values(lease_expires_at=db_now() + 5)
        )
    forged = dataclasses.replace(fresh, token=secrets.token_bytes(32))
    assert await renew_leases(db.engine, [forged], lease_seconds=30) == set()
    assert fresh_ref and gone_ref


async def test_expire_leases_recovers_only_past_due_attempts(db, service, tenant) -> None:
    """S-27, S-28: a past-due current attempt fails `lease_expired` and its run is due again at once (issue 15
    item 3 overrides the S-31 delay for an expired lease); a live lease is left alone."""
    async with db.engine.begin() as conn:
        expired_ref = await add_thread_run(conn, tenant)
    expired = (await _claim_one(db.engine)).lease
    async with db.engine.begin() as conn:
        live_ref = await add_thread_run(conn, tenant)
    await _claim_one(db.engine)
    await _expire(db.engine, expired.attempt_id)

    assert await expire_leases(service, cursor=ExpiryCursor()) == 1
    [attempt] = await attempt_rows(db.engine, expired_ref.run_id)
    assert (attempt["status"], attempt["failure"]["code"]) == ("failed", "lease_expired")
    run = await run_row(db.engine, expired_ref.run_id)
    assert (run["status"], run["current_attempt_id"], run["attempts"]) == ("accepted", None, 1)
    async with db.engine.connect() as conn:
        due_in = (
            await conn.execute(select(runs.c.available_at - db_now()).where(runs.c.id == expired_ref.run_id))
        ).scalar_one()
    assert -1 < due_in <= 0.05
    assert (await run_row(db.engine, live_ref.run_id))["status"] == "running"
    assert await expire_leases(service) == 0


@pytest.mark.postgres
@pytest.mark.parametrize("db_kind", ["postgresql"], indirect=True)
async def test_expire_leases_skips_locked_rows(db, service, tenant) -> None:
    """S-27: a candidate whose rows another transaction holds is skipped, not waited for."""
    async with db.engine.begin() as conn:
        ref = await add_thread_run(conn, tenant)
    lease = (await _claim_one(db.engine)).lease
    await _expire(db.engine, lease.attempt_id)
    async with db.engine.connect() as holder:
        async with holder.begin():
            await holder.execute(select(threads.c.id).where(threads.c.id == ref.thread_id).with_for_update())
            assert await asyncio.wait_for(expire_leases(service), 5) == 0
    assert await expire_leases(service) == 1


async def test_recovery_while_cancel_requested_seals_cancelled(db, tenant) -> None:
    """S-33: recovering an attempt of a run with `cancel_requested_at` seals the run `cancelled`."""
    async with db.engine.begin() as conn:
        ref = await add_thread_run(conn, tenant)
    lease = (await _claim_one(db.engine)).lease
    async with db.engine.begin() as conn:
        await conn.execute(update(runs).where(runs.c.id == ref.run_id).values(cancel_requested_at=db_now()))
    await _expire(db.engine, lease.attempt_id)
    decision = await recover_attempt(
        db.engine, run_id=ref.run_id, attempt_id=lease.attempt_id, outcome="failed", failure_code="lease_expired"
    )
    assert isinstance(decision, SealAfterRecovery)
    run = await run_row(db.engine, ref.run_id)
    assert (run["status"], run["failure"]["code"]) == ("cancelled", "cancelled")


async def test_assigned_entries_survive_recovery_and_fail_with_the_run(db, tenant) -> None:
    """S-34, S-71, S-30: assigned entries stay assigned across recovery; when the last charged attempt fails the
    run seals `failed` with that attempt's code and its entries fail `run_ended`."""
    async with db.engine.begin() as conn:
        ref = await add_thread_run(conn, tenant, max_attempts=1)
    lease = (await _claim_one(db.engine)).lease
    async with db.engine.begin() as conn:
        await conn.execute(update(runs).where(runs.c.id == ref.run_id).values(max_attempts=2))
    decision = await recover_attempt(
        db.engine,
        run_id=ref.run_id,
        attempt_id=lease.attempt_id,
        outcome="failed",
        failure_code="attempt_failed",
        lease=lease,
    )
    assert isinstance(decision, Requeue) and decision.delay_seconds == 1
    async with db.engine.connect() as conn:
        status = (
            await conn.execute(select(inbox_entries.c.status).where(inbox_entries.c.id == ref.entry_id))
        ).scalar_one()
    assert status == "assigned"
    async with db.engine.begin() as conn:
        await conn.execute(update(runs).where(runs.c.id == ref.run_id).values(available_at=db_now()))
    lease = (await _claim_one(db.engine)).lease
    await _expire(db.engine, lease.attempt_id)
    decision = await recover_attempt(
        db.engine, run_id=ref.run_id, attempt_id=lease.attempt_id, outcome="failed", failure_code="lease_expired"
    )
    assert isinstance(decision, SealAfterRecovery)
    run = await run_row(db.engine, ref.run_id)
    assert (run["status"], run["attempts"], run["failure"]["code"]) == ("failed", 2, "lease_expired")
    async with db.engine.connect() as conn:
        entry = (await conn.execute(select(inbox_entries).where(inbox_entries.c.id == ref.entry_id))).mappings().one()
        thread = (await conn.execute(select(threads).where(threads.c.id == ref.thread_id))).mappings().one()
    assert (entry["status"], entry["failure"]["code"]) == ("failed", "run_ended")
    assert (thread["current_run_id"], thread["last_run_id"]) == (None, ref.run_id)


async def test_heartbeat_with_unavailable_authority_extends_nothing(db, service, tenant, monkeypatch) -> None:
    """S-26: one *unavailable* authority check fails the whole heartbeat: no stop, no renewal."""
    async with db.engine.begin() as conn:
        await add_thread_run(conn, tenant)
    claimed = await _claim_one(db.engine)
    await _expire(db.engine, claimed.lease.attempt_id, seconds_ago=-5)  # 5 s left: due for renewal
    # 15 s left by the local clock: due there too, so only S-26 keeps the renewal from happening
    handle = AttemptHandle(claimed=claimed, lease_seconds=30, sent_at=service.clock.monotonic() - 15)

    async def unavailable(engine: Any, run_ids: Any) -> Any:
        raise StoreUnavailable("the database did not answer")

    monkeypatch.setattr(supervisor_module, "read_heartbeat_facts", unavailable)
    supervisor = Supervisor(service, handles=lambda: [handle])
    with pytest.raises(supervisor_module.HeartbeatFailed):
        await supervisor.heartbeat()
    assert handle.stop_reason is None
    [attempt] = await attempt_rows(db.engine, claimed.lease.run_id)
    async with db.engine.connect() as conn:
        left = attempt["lease_expires_at"] - (await conn.execute(select(db_now()))).scalar_one()
    assert left < 6


async def test_local_deadline_cancels_the_attempt_once(db, service, tenant) -> None:
    """S-24, S-25: once a third of the lease is unconfirmed the task is cancelled once and may write no more."""
    async with db.engine.begin() as conn:
        await add_thread_run(conn, tenant)
    claimed = await _claim_one(db.engine)
    now = service.clock.monotonic()
    handle = AttemptHandle(claimed=claimed, lease_seconds=30, sent_at=now)
    assert handle.may_write(now, db_timeout=5) and not handle.deadline_reached(now)
    assert not handle.may_write(now + 25.5, db_timeout=5)  # S-25: within database.timeout of the deadline
    handle.task = asyncio.create_task(asyncio.sleep(60))
    handle.sent_at = now - 21  # 9 s left < a third of 30
    supervisor = Supervisor(service, handles=lambda: [handle])
    supervisor.enforce_deadlines()
    supervisor.enforce_deadlines()
    with pytest.raises(asyncio.CancelledError):
        await handle.task
    assert handle.deadline_cancelled and not handle.may_write(service.clock.monotonic(), db_timeout=0)
