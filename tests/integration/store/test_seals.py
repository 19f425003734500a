"""store/seals.py on every backend: the seal transaction (§7.10: S-48, S-71), its fence (S-20, S-22) and the usage
written with and without it (S-51), driven directly rather than through the worker."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from sqlalchemy import func, insert, select, update

from candor.service.errors import LeaseLost
from candor.service.protocol.fencing import Lease
from candor.service.store.attempts.seals import (
    CommitResult,
    SealRequest,
    failure,
    record_usage,
    seal_run,
)
from candor.service.store.db.engine import read_transaction, write_transaction
from candor.service.store.schema.dialect import db_now
from candor.service.store.schema.tables import inbox_entries, run_attempts, runs, threads, usage_records

from .rows import new_id
from .step_commits import first_commit, leased_run

WRONG_TOKEN = b"not-the-token"


async def _first_commit(db: Any, lease: Lease) -> CommitResult:
    """The run's first step commit, charged one request."""
    return await first_commit(
        db.engine,
        lease,
        usage={"requests": 1},
    )


async def _assigned_entry(db: Any, lease: Lease) -> str:
    """A steer entry assigned to the run and not yet consumed."""
    entry_id = new_id("ent")
    async with write_transaction(db.engine) as conn:
        workspace_id = (await conn.execute(select(runs.c.workspace_id).where(runs.c.id == lease.run_id))).scalar_one()
        await conn.execute(
            insert(inbox_entries).values(
                id=entry_id,
                workspace_id=workspace_id,
                thread_id=lease.thread_id,
                kind="message",
                delivery="steer",
                position=1,
                payload={"content": []},
                size=2,
                status="assigned",
                assigned_run_id=lease.run_id,
                created_at=db_now(),
            )
        )
    return entry_id


async def _row(db: Any, table: Any, row_id: str) -> dict[str, Any]:
    async with read_transaction(db.engine) as conn:
        return dict((await conn.execute(select(table).where(table.c.id == row_id))).mappings().one())


async def _usage_rows(db: Any, run_id: str) -> int:
    async with read_transaction(db.engine) as conn:
        query = select(func.count()).select_from(usage_records).where(usage_records.c.run_id == run_id)
        return int((await conn.execute(query)).scalar_one())


async def test_a_completed_seal_ends_the_attempt_the_run_and_the_threads_turn(db: Any) -> None:
    """§7.10, S-71: the attempt `succeeded`, the run `completed` with its output and the sum of its usage, the thread
    left with the run as its last; the entry assigned to the run and not consumed goes back to `pending`."""
    lease = await leased_run(db)
    await _first_commit(db, lease)
    entry_id = await _assigned_entry(db, lease)
    await seal_run(db.engine, lease, SealRequest(status="completed", output="done"), usage={"requests": 2})
    run = await _row(db, runs, lease.run_id)
    assert (run["status"], run["output"], run["current_attempt_id"]) == ("completed", "done", None)
    assert run["sealed_at"] is not None and run["usage"]["requests"] == 3  # the commit's 1 and the seal's 2 (S-51)
    attempt = await _row(db, run_attempts, lease.attempt_id)
    assert attempt["status"] == "succeeded" and attempt["finished_at"] is not None
    thread = await _row(db, threads, lease.thread_id)
    assert (thread["current_run_id"], thread["last_run_id"]) == (None, lease.run_id)
    entry = await _row(db, inbox_entries, entry_id)
    assert (entry["status"], entry["assigned_run_id"]) == ("pending", None)


async def test_a_completed_seal_on_an_archived_thread_withdraws_the_entries(db: Any) -> None:
    """S-71: on an archived thread the returned entries end `withdrawn` instead."""
    lease = await leased_run(db)
    await _first_commit(db, lease)
    entry_id = await _assigned_entry(db, lease)
    async with write_transaction(db.engine) as conn:
        await conn.execute(update(threads).where(threads.c.id == lease.thread_id).values(archived_at=db_now()))
    await seal_run(db.engine, lease, SealRequest(status="completed", output="done"))
    entry = await _row(db, inbox_entries, entry_id)
    assert entry["status"] == "withdrawn" and entry["finished_at"] is not None


async def test_a_failed_seal_keeps_the_last_commit_and_fails_the_entries(db: Any) -> None:
    """S-48, S-71: a `failed` seal leaves `checkpoint_id` at the last commit; the attempt ends `failed` with the
    run's failure, and the assigned entries `failed` with `run_ended`."""
    lease = await leased_run(db)
    committed = await _first_commit(db, lease)
    entry_id = await _assigned_entry(db, lease)
    await seal_run(db.engine, lease, SealRequest(status="failed", failure=failure("agent_unavailable")))
    run = await _row(db, runs, lease.run_id)
    assert (run["status"], run["failure"]["code"]) == ("failed", "agent_unavailable")
    assert (run["checkpoint_id"], run["checkpoint_seq"]) == (committed.checkpoint_id, committed.seq)
    attempt = await _row(db, run_attempts, lease.attempt_id)
    assert (attempt["status"], attempt["failure"]["code"]) == ("failed", "agent_unavailable")
    entry = await _row(db, inbox_entries, entry_id)
    assert (entry["status"], entry["failure"]["code"]) == ("failed", "run_ended")


@pytest.mark.parametrize("status", ["completed", "failed"])
async def test_a_seal_under_a_lost_lease_writes_nothing(db: Any, status: str) -> None:
    """S-20, S-22: a seal whose lease no longer matches raises `LeaseLost`: the run stays `running`, the attempt
    live, the entry assigned, and the usage it carried is not recorded."""
    lease = await leased_run(db)
    await _first_commit(db, lease)
    entry_id = await _assigned_entry(db, lease)
    request = (
        SealRequest(status="completed", output="x")
        if status == "completed"
        else SealRequest(status="failed", failure=failure("attempt_failed"))
    )
    with pytest.raises(LeaseLost):
        await seal_run(db.engine, dataclasses.replace(lease, token=WRONG_TOKEN), request, usage={"requests": 5})
    run = await _row(db, runs, lease.run_id)
    assert (run["status"], run["current_attempt_id"], run["sealed_at"]) == ("running", lease.attempt_id, None)
    assert (await _row(db, run_attempts, lease.attempt_id))["status"] == "running"
    assert (await _row(db, inbox_entries, entry_id))["status"] == "assigned"
    assert await _usage_rows(db, lease.run_id) == 0


async def test_usage_is_recorded_without_the_fence_and_summed_at_the_seal(db: Any) -> None:
    """S-51: usage incurred by an attempt that lost its lease is still written (`record_usage` takes no fence), and
    the run's seal sums it with its commits' usage."""
    lease = await leased_run(db)
    await _first_commit(db, lease)
    await record_usage(db.engine, run_id=lease.run_id, attempt_id=lease.attempt_id, usage={"requests": 4})
    assert await _usage_rows(db, lease.run_id) == 1
    await seal_run(db.engine, lease, SealRequest(status="completed", output="done"))
    assert (await _row(db, runs, lease.run_id))["usage"]["requests"] == 5
