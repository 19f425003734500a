"""store/runs.py on every backend: claims (§7.2: S-11, S-13, S-14, S-15, S-17), the fence (§7.3: S-20), the
expiry lock (S-27) and the attempt start (S-16), driven directly rather than through the worker."""

from __future__ import annotations

import dataclasses
import secrets
import time
from typing import Any

import pytest
from sqlalchemy import select, update

from candor.service.errors import LeaseLost
from candor.service.protocol.fencing import Lease, hash_lease_token
from candor.service.store.db.engine import read_transaction, write_transaction
from candor.service.store.runs.claims import claim_runs, lock_fenced, lock_for_expiry, read_now, start_attempt
from candor.service.store.schema.tables import run_attempts, runs

from .rows import add_run, add_thread, add_workspace, new_id
from .step_commits import leased_run


async def _claim(db: Any, *, agents: set[str] | frozenset[str] = frozenset({"demo"}), limit: int = 10) -> list[Any]:
    return await claim_runs(
        db.engine, worker_id="w1", agents=agents, limit=limit, lease_seconds=30.0, randbytes=secrets.token_bytes
    )


async def _queued_runs(db: Any, *runs_values: dict[str, Any]) -> list[str]:
    """One thread per run (a thread holds one live run), each run `accepted` with the given column values."""
    ids = []
    async with write_transaction(db.engine) as conn:
        workspace_id = await add_workspace(conn)
        for values in runs_values:
            thread_id = await add_thread(conn, workspace_id)
            ids.append(await add_run(conn, workspace_id, thread_id, **values))
    return ids


async def _row(db: Any, table: Any, row_id: str) -> dict[str, Any]:
    async with read_transaction(db.engine) as conn:
        return dict((await conn.execute(select(table).where(table.c.id == row_id))).mappings().one())


async def test_read_now_is_the_database_clock(db: Any) -> None:
    """§2.2: the clock every fenced write uses is the database's, read inside the caller's transaction."""
    before = time.time()
    async with read_transaction(db.engine) as conn:
        now = await read_now(conn)
    assert before - 5 <= now <= time.time() + 5


async def test_a_claim_takes_only_accepted_due_runs_in_order(db: Any) -> None:
    """S-11: only `accepted` runs whose `available_at` has come, in order of `available_at` then id."""
    now = time.time()
    due_late, not_due, due_early, cancelled = await _queued_runs(
        db,
        {"id": "run_" + "b" * 32, "available_at": now - 10},
        {"available_at": now + 3600},
        {"id": "run_" + "a" * 32, "available_at": now - 20},
        {"available_at": now - 30},
    )
    async with write_transaction(db.engine) as conn:  # runs are inserted `accepted` (S-6): cancel one before it ran
        await conn.execute(
            update(runs)
            .where(runs.c.id == cancelled)
            .values(status="cancelled", sealed_at=now, failure={"code": "cancelled", "message": "x"})
        )
    claimed = await _claim(db)
    assert [run.lease.run_id for run in claimed] == [due_early, due_late]
    assert {not_due, cancelled}.isdisjoint(run.lease.run_id for run in claimed)
    assert await _claim(db) == []  # both are running now: a second claimer gets nothing


async def test_a_claim_respects_its_limit_and_its_agents(db: Any) -> None:
    """S-17: a run of an agent the worker has not registered is never claimed; `limit` caps the claim."""
    first, second, other = await _queued_runs(db, {}, {}, {"agent": "unregistered"})
    assert await _claim(db, agents=set()) == []
    [one] = await _claim(db, limit=1)
    [two] = await _claim(db)
    assert {one.lease.run_id, two.lease.run_id} == {first, second}
    assert await _claim(db, agents={"demo"}) == []
    assert (await _row(db, runs, other))["status"] == "accepted"


async def test_a_first_claim_leases_a_first_attempt(db: Any) -> None:
    """S-13, S-14, S-15: attempt 1, `initial`, `leased` until now + lease seconds; the run `running` with it as its
    current attempt, `attempts = 1` and `started_at` set; only the token's hash is stored (S-21)."""
    [run_id] = await _queued_runs(db, {})
    [claimed] = await _claim(db)
    assert (claimed.lease.run_id, claimed.lease.attempt_number, claimed.start_reason) == (run_id, 1, "initial")
    attempt = await _row(db, run_attempts, claimed.lease.attempt_id)
    run = await _row(db, runs, run_id)
    assert (attempt["status"], attempt["number"], attempt["start_reason"]) == ("leased", 1, "initial")
    assert attempt["worker_id"] == "w1" and attempt["replaces_attempt_id"] is None
    assert attempt["lease_expires_at"] == pytest.approx(attempt["created_at"] + 30.0, abs=1.0)
    assert attempt["lease_token_hash"] == hash_lease_token(claimed.lease.token)
    assert (run["status"], run["current_attempt_id"], run["attempts"]) == ("running", attempt["id"], 1)
    assert run["started_at"] is not None


async def test_starting_the_attempt_records_the_harness_run(db: Any) -> None:
    """S-16: `leased → running` with `harness_run_id`, under the fence."""
    [run_id] = await _queued_runs(db, {})
    [claimed] = await _claim(db)
    await start_attempt(db.engine, claimed.lease, harness_run_id="run_" + "1" * 32)
    attempt = await _row(db, run_attempts, claimed.lease.attempt_id)
    assert (attempt["status"], attempt["harness_run_id"]) == ("running", "run_" + "1" * 32)
    assert (await _row(db, runs, run_id))["status"] == "running"


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"token": "not-the-token"}, "token_mismatch"),
        ({"worker_id": "w2"}, "worker_mismatch"),
        ({"attempt_id": "att_" + "f" * 32}, "attempt_not_current"),
    ],
)
async def test_a_start_under_a_lease_that_does_not_match_changes_nothing(
    db: Any, change: dict[str, str], reason: str
) -> None:
    """S-20: a start made with another token, worker or attempt raises `LeaseLost` and writes nothing."""
    await _queued_runs(db, {})
    [claimed] = await _claim(db)
    with pytest.raises(LeaseLost) as lost:
        await start_attempt(db.engine, dataclasses.replace(claimed.lease, **change), harness_run_id="run_" + "1" * 32)
    assert lost.value.reason == reason
    attempt = await _row(db, run_attempts, claimed.lease.attempt_id)
    assert (attempt["status"], attempt["harness_run_id"]) == ("leased", None)


async def test_the_fence_refuses_an_expired_lease(db: Any) -> None:
    """S-20: once the lease expired, `lock_fenced` raises `LeaseLost` from an empty transaction."""
    lease = await leased_run(db)
    async with write_transaction(db.engine) as conn:
        fenced = await lock_fenced(conn, lease)
    assert (fenced.run.id, fenced.run.status, fenced.thread_archived) == (lease.run_id, "running", False)
    await _expire(db, lease)
    with pytest.raises(LeaseLost, match="lease_expired"):
        async with write_transaction(db.engine) as conn:
            await lock_fenced(conn, lease)


async def _expire(db: Any, lease: Lease) -> None:
    async with write_transaction(db.engine) as conn:
        await conn.execute(
            update(run_attempts).where(run_attempts.c.id == lease.attempt_id).values(lease_expires_at=time.time() - 60)
        )


async def test_the_expiry_lock_takes_only_an_expired_current_attempt(db: Any) -> None:
    """S-27: `lock_for_expiry` re-checks under lock: nothing for a live lease, an unknown run or an attempt of another
    run; the run under lock once its lease expired."""
    lease = await leased_run(db)
    other = await leased_run(db)
    await _expire(db, other)
    async with write_transaction(db.engine) as conn:
        assert await lock_for_expiry(conn, run_id=lease.run_id, attempt_id=lease.attempt_id) is None  # live
        assert await lock_for_expiry(conn, run_id=new_id("run"), attempt_id=lease.attempt_id) is None
        assert await lock_for_expiry(conn, run_id=lease.run_id, attempt_id=other.attempt_id) is None
    await _expire(db, lease)
    async with write_transaction(db.engine) as conn:
        fenced = await lock_for_expiry(conn, run_id=lease.run_id, attempt_id=lease.attempt_id)
    assert fenced is not None
    assert (fenced.run.id, fenced.run.current_attempt_id, fenced.thread_archived) == (
        lease.run_id,
        lease.attempt_id,
        False,
    )
