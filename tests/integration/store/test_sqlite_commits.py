"""The SQLite plain step commit's connection (§7.8, issues 12 and 33): checked out of the pool and handed back by
the commit itself (`step_commit._commit_sqlite`), through aiosqlite's public API only, and never handed to another
caller while a cancelled commit may still be running on it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sqlalchemy import event, select

from candor.service.store.attempts.seals import commit_checkpoint
from candor.service.store.checkpoints.incremental import CheckpointEnvelope, encode_envelope, encode_history
from candor.service.store.db.engine import create_engine, write_transaction

from .step_commits import commit_twice_and_once_refused, first_commit_in_background, leased_run, stored_checkpoints
from .test_checkpoints import prompt

pytestmark = pytest.mark.parametrize("db_kind", ["sqlite"])


async def test_a_step_commit_hands_its_connection_back_outside_a_transaction(db: Any) -> None:
    """S-37 (issue 33): a plain step commits on its own (one INSERT, or its `BEGIN IMMEDIATE` … `COMMIT` with stream
    entries; ROLLBACK when the fence refuses), so the pool takes the connection back outside any transaction after
    a commit and after a refused one (LeaseLost) alike; none stays checked out, and the commits that follow get a
    connection."""
    engine = create_engine(db.url, timeout=5)
    in_transaction: list[bool] = []

    def checkin(dbapi_connection: Any, _record: Any) -> None:
        in_transaction.append(bool(dbapi_connection.driver_connection.in_transaction))

    event.listen(engine.sync_engine.pool, "checkin", checkin)
    try:
        await commit_twice_and_once_refused(db, engine)
    finally:
        await engine.dispose()
    assert in_transaction and not any(in_transaction)


async def test_a_cancelled_step_commit_ends_once_its_call_has_ended(db: Any) -> None:
    """S-37, S-38: a step commit cancelled while it waits for SQLite's write lock (a worker told to stop
    mid-commit) cannot stop its call on the connection's thread. The cancellation completes once that call has
    ended, with the connection back in the pool and its rollback queued behind the call, so no other caller gets
    the connection inside the call's transaction. Here the lock is freed meanwhile, so the call commits, whole, and
    the next commit, with the `checkpoint_seq` read back, succeeds."""
    engine = create_engine(db.url, timeout=5)
    try:
        lease = await leased_run(db)
        envelope = encode_envelope(CheckpointEnvelope(thread_id=lease.thread_id))
        history = encode_history([prompt("go")])
        locked, release = asyncio.Event(), asyncio.Event()

        async def hold_write_lock() -> None:  # the commit's BEGIN IMMEDIATE waits until this commits
            async with write_transaction(db.engine) as holder:
                await holder.execute(select(1))
                locked.set()
                await release.wait()

        holder = asyncio.ensure_future(hold_write_lock())
        await locked.wait()
        commit = first_commit_in_background(engine, lease, history, envelope)
        await asyncio.sleep(0.3)
        assert not commit.done()
        commit.cancel()
        await asyncio.sleep(0.3)
        assert not commit.done()  # its call still waits for the lock on the connection's thread
        release.set()
        await holder
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(asyncio.shield(commit), timeout=10)
        assert engine.sync_engine.pool.checkedout() == 0  # type: ignore[attr-defined]  # QueuePool's, not on Pool
        # The call went on once the lock was free, and committed whole.
        assert await stored_checkpoints(db.engine, lease.run_id) == (1, 1)
        committed = await asyncio.wait_for(
            commit_checkpoint(
                engine, lease, expected_seq=1, base_id=None, base_encoded=(), new_encoded=history, envelope=envelope
            ),
            timeout=10,
        )
        assert committed.seq == 2
    finally:
        await engine.dispose()
