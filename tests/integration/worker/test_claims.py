"""Claiming (§7.2) and the worker loop's slots (§7.1) on both dialects: S-11…S-19."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import secrets
from typing import Any

import pytest
from sqlalchemy import select, update

from candor.service.errors import StoreUnavailable
from candor.service.store.attempts.recovery import recover_attempt
from candor.service.store.checkpoints.incremental import CheckpointEnvelope, insert_checkpoint
from candor.service.store.db.engine import create_engine
from candor.service.store.runs import claims as store_runs
from candor.service.store.runs.claims import claim_runs
from candor.service.store.schema.dialect import db_now
from candor.service.store.schema.tables import checkpoints, run_attempts, runs
from candor.service.worker import WorkerLoop
from candor.service.worker import loop as loop_module

from waiting import wait_until
from worker import support
from worker.support import add_thread_run, attempt_rows, run_row


async def _claim(
    engine: Any,
    *,
    limit: int = 10,
    agents: tuple[str, ...] = ("scripted",),
    worker_id: str = "w1",
    lease_seconds: float = 30.0,
) -> list[Any]:
    return await claim_runs(
        engine,
        worker_id=worker_id,
        agents=agents,
        limit=limit,
        lease_seconds=lease_seconds,
        randbytes=secrets.token_bytes,
    )


async def test_claim_order_and_due_runs_only(db, tenant) -> None:
    """S-11: only accepted, due runs, by `available_at` then `id`."""
    async with db.engine.begin() as conn:
        late = await add_thread_run(conn, tenant, available_at=db_now() - 5)
        early = await add_thread_run(conn, tenant, available_at=db_now() - 50)
        future = await add_thread_run(conn, tenant, available_at=db_now() + 60)
    claimed = await _claim(db.engine)
    assert [c.lease.run_id for c in claimed] == [early.run_id, late.run_id]
    assert future.run_id not in {c.lease.run_id for c in claimed}
    assert await _claim(db.engine) == []  # both are running now


async def test_claim_writes_attempt_and_run(db, tenant) -> None:
    """S-13, S-15, S-21: attempt 1 `initial`, leased for lease_seconds, hashed token; run running, started_at set;
    §5.1: the attempt records the claiming process's build (`worker_build`)."""
    async with db.engine.begin() as conn:
        ref = await add_thread_run(conn, tenant)
    [claimed] = await _claim(db.engine, lease_seconds=30)
    lease = claimed.lease
    assert (lease.run_id, lease.thread_id, lease.attempt_number, lease.worker_id) == (
        ref.run_id,
        ref.thread_id,
        1,
        "w1",
    )
    assert claimed.start_reason == "initial" and claimed.queue_wait_ms >= 0
    [attempt] = await attempt_rows(db.engine, ref.run_id)
    assert attempt["status"] == "leased" and attempt["start_reason"] == "initial"
    assert attempt["replaces_attempt_id"] is None
    assert attempt["worker_build"].startswith("candor/") and "pydantic-ai-slim/" in attempt["worker_build"]
    assert attempt["lease_token_hash"] == hashlib.sha256(lease.token).hexdigest() != lease.token.hex()
    assert attempt["lease_expires_at"] - attempt["created_at"] == pytest.approx(30, abs=0.01)
    run = await run_row(db.engine, ref.run_id)
    assert (run["status"], run["current_attempt_id"], run["attempts"]) == ("running", lease.attempt_id, 1)
    assert run["started_at"] is not None


async def test_recovery_is_charged_and_handoff_is_free(db, tenant) -> None:
    """S-13, S-14, S-15, S-32: recovery claims cost an attempt, handoff claims do not; started_at stays the first."""
    async with db.engine.begin() as conn:
        ref = await add_thread_run(conn, tenant)
    [first] = await _claim(db.engine)
    started_at = (await run_row(db.engine, ref.run_id))["started_at"]
    await recover_attempt(
        db.engine,
        run_id=ref.run_id,
        attempt_id=first.lease.attempt_id,
        outcome="failed",
        failure_code="attempt_failed",
        lease=first.lease,
    )
    await support.make_due(db.engine, ref.run_id)
    [second] = await _claim(db.engine)
    await recover_attempt(
        db.engine, run_id=ref.run_id, attempt_id=second.lease.attempt_id, outcome="yielded", lease=second.lease
    )
    [third] = await _claim(db.engine)  # a handoff is due at once (S-32)

    assert [c.start_reason for c in (first, second, third)] == ["initial", "recovery", "handoff"]
    attempts = await attempt_rows(db.engine, ref.run_id)
    assert [(a["number"], a["status"], a["start_reason"]) for a in attempts] == [
        (1, "failed", "initial"),
        (2, "yielded", "recovery"),
        (3, "leased", "handoff"),
    ]
    assert [a["replaces_attempt_id"] for a in attempts] == [None, attempts[0]["id"], attempts[1]["id"]]
    assert attempts[1]["yield_reason"] == "handoff"
    run = await run_row(db.engine, ref.run_id)
    assert run["attempts"] == 2 and run["started_at"] == started_at


async def test_unregistered_agents_and_unsupported_formats_are_not_claimed(db, tenant) -> None:
    """S-17: a run of an agent this worker lacks, or whose start checkpoint has an unknown format, stays accepted."""
    async with db.engine.begin() as conn:
        other = await add_thread_run(conn, tenant, agent="other")
        future_format = await add_thread_run(conn, tenant)
        written = await insert_checkpoint(
            conn,
            thread_id=future_format.thread_id,
            run_id=None,
            seq=0,
            attempt=None,
            base_id=None,
            base_encoded=(),
            new_encoded=(),
            envelope=CheckpointEnvelope(thread_id=future_format.thread_id),
        )
        await conn.execute(update(checkpoints).where(checkpoints.c.id == written.id).values(format=2))
        await conn.execute(update(runs).where(runs.c.id == future_format.run_id).values(start_checkpoint_id=written.id))
        ok = await add_thread_run(conn, tenant)
    claimed = await _claim(db.engine)
    assert [c.lease.run_id for c in claimed] == [ok.run_id]
    assert (await run_row(db.engine, other.run_id))["status"] == "accepted"
    assert (await run_row(db.engine, future_format.run_id))["status"] == "accepted"


async def test_concurrent_claimers_never_share_a_run(db, tenant) -> None:
    """S-11: four claimers on four engines racing for 24 runs: every run is claimed exactly once."""
    async with db.engine.begin() as conn:
        refs = [await add_thread_run(conn, tenant) for _ in range(24)]
    engines = [create_engine(db.url, timeout=5) for _ in range(4)]
    try:

        async def claimer(engine: Any, worker_id: str) -> list[str]:
            got: list[str] = []
            for _ in range(12):
                got += [c.lease.run_id for c in await _claim(engine, limit=2, worker_id=worker_id)]
                await asyncio.sleep(0)
            return got

        results = await asyncio.gather(*(claimer(e, f"w{i}") for i, e in enumerate(engines)))
    finally:
        for engine in engines:
            await engine.dispose()
    claimed = [run_id for got in results for run_id in got]
    assert sorted(claimed) == sorted(r.run_id for r in refs)
    async with db.engine.connect() as conn:
        count = len((await conn.execute(select(run_attempts.c.id))).all())
    assert count == 24


async def test_worker_never_exceeds_its_slots(db, service, tenant, control) -> None:
    """S-12, S-19: a 2-slot worker holds at most 2 live attempts; slots come back as attempts end."""
    async with db.engine.begin() as conn:
        refs = [await add_thread_run(conn, tenant, script="step") for _ in range(5)]
    control.tool_gate = asyncio.Event()
    worker = WorkerLoop(service, worker_id="w1", slots=2)
    passes = 0
    original_wait = worker._wait

    async def counted_wait(*args: Any, **kwargs: Any) -> None:
        nonlocal passes
        passes += 1
        await original_wait(*args, **kwargs)

    worker._wait = counted_wait  # type: ignore[method-assign]
    task = asyncio.create_task(worker.run_forever())
    try:

        async def two_live() -> bool:
            return len(control.ledger) >= 2

        await support.wait_for(two_live)
        full_since = passes

        def three_more_passes() -> bool:
            service.wake_workers()  # each wake-up is one more pass of the loop while both slots are busy
            return passes >= full_since + 3

        await wait_until(three_more_passes, 10)
        assert worker.busy == 2
        async with db.engine.connect() as conn:
            live = (
                await conn.execute(select(run_attempts.c.id).where(run_attempts.c.status.in_(["leased", "running"])))
            ).all()
        assert len(live) == 2
        control.tool_gate.set()

        async def all_done() -> bool:
            rows = [await run_row(db.engine, r.run_id) for r in refs]
            return all(r["status"] == "completed" for r in rows)

        await support.wait_for(all_done, timeout=30)
    finally:
        worker.stop()
        await asyncio.wait_for(task, 10)
    assert await worker.wait_attempts(timeout=10) == set()
    assert worker.busy == 0


async def test_claim_error_is_logged_and_retried(db, service, tenant, monkeypatch, caplog) -> None:
    """S-18: a failing claim logs "Claim failed" and the loop retries after `scan_seconds`."""
    async with db.engine.begin() as conn:
        ref = await add_thread_run(conn, tenant)
    real = store_runs.claim_runs
    calls = {"n": 0}

    async def flaky(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 1:
            raise StoreUnavailable("database unavailable: OperationalError")
        return await real(*args, **kwargs)

    monkeypatch.setattr(loop_module, "claim_runs", flaky)
    with caplog.at_level(logging.WARNING, logger="candor.worker"):
        await WorkerLoop(service).run_until_idle(timeout=30)
    assert any(r.getMessage() == "Claim failed" for r in caplog.records)
    assert calls["n"] >= 2
    assert (await run_row(db.engine, ref.run_id))["status"] == "completed"


async def test_crashed_attempt_releases_its_slot(db, service, tenant, monkeypatch, caplog) -> None:
    """S-19, §7.1: an exception escaping an attempt task is logged "Attempt crashed" and its slot comes back."""
    async with db.engine.begin() as conn:
        ref = await add_thread_run(conn, tenant)

    async def crash(service: Any, handle: Any) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(loop_module, "run_attempt", crash)
    worker = WorkerLoop(service, slots=1)
    with caplog.at_level(logging.ERROR, logger="candor.worker"):
        await worker.run_until_idle(timeout=30)
    assert worker.busy == 0
    assert any(r.getMessage() == "Attempt crashed" for r in caplog.records)
    # the attempt is left to lease expiry
    assert (await run_row(db.engine, ref.run_id))["status"] == "running"
