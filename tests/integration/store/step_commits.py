"""Step-commit helpers shared by the store tests: a leased run, a commit sequence, and reading back what was
stored."""

from __future__ import annotations

import asyncio
import secrets
from typing import Any

import pytest
from sqlalchemy import func, insert, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from candor.service.errors import LeaseLost
from candor.service.protocol.fencing import Lease
from candor.service.store.attempts.seals import CommitResult, commit_checkpoint
from candor.service.store.checkpoints.incremental import CheckpointEnvelope, encode_envelope, encode_history
from candor.service.store.db.engine import read_transaction, write_transaction
from candor.service.store.runs.claims import claim_runs, start_attempt
from candor.service.store.runs.current_checkpoint import run_columns
from candor.service.store.schema.dialect import db_now
from candor.service.store.schema.tables import checkpoints, inbox_entries, runs

from .rows import add_run, add_thread, add_workspace, new_id
from .test_checkpoints import prompt, step


async def leased_run(db: Any, *, source_entry: bool = False) -> Lease:
    """A new thread's run, claimed by worker `w1` and its attempt started: the lease step commits are made under."""
    async with write_transaction(db.engine) as conn:
        workspace_id = await add_workspace(conn)
        thread_id = await add_thread(conn, workspace_id)
        run_id = await add_run(conn, workspace_id, thread_id)
        if source_entry:  # the message that started the run, assigned to it
            entry_id = new_id("ent")
            await conn.execute(
                insert(inbox_entries).values(
                    id=entry_id,
                    workspace_id=workspace_id,
                    thread_id=thread_id,
                    kind="message",
                    delivery="next_run",
                    position=1,
                    payload={"content": []},
                    size=2,
                    status="assigned",
                    assigned_run_id=run_id,
                    created_at=db_now(),
                )
            )
            await conn.execute(update(runs).where(runs.c.id == run_id).values(source_entry_id=entry_id))
    [claimed] = await claim_runs(
        db.engine, worker_id="w1", agents={"demo"}, limit=1, lease_seconds=30.0, randbytes=secrets.token_bytes
    )
    await start_attempt(db.engine, claimed.lease, harness_run_id="run_" + "0" * 32)
    return claimed.lease


async def first_commit(engine: AsyncEngine, lease: Lease, **options: Any) -> CommitResult:
    """A run's first step commit (seq 1, no base): `new_encoded` the prompt "go" and the envelope empty unless
    given; the other `options` go to `commit_checkpoint` as they are (usage, stream entries, source entry…)."""
    options.setdefault("new_encoded", encode_history([prompt("go")]))
    options.setdefault("envelope", encode_envelope(CheckpointEnvelope(thread_id=lease.thread_id)))
    return await commit_checkpoint(engine, lease, expected_seq=0, base_id=None, base_encoded=(), **options)


async def commit_twice_and_once_refused(db: Any, engine: AsyncEngine) -> None:
    """A run's first step commit, one the fence refuses (a stale expected seq), and the second, all on `engine`;
    no connection stays checked out after each."""
    lease = await leased_run(db)
    envelope = encode_envelope(CheckpointEnvelope(thread_id=lease.thread_id))
    history = encode_history([prompt("go")])
    first = await commit_checkpoint(
        engine, lease, expected_seq=0, base_id=None, base_encoded=(), new_encoded=history, envelope=envelope
    )
    assert engine.sync_engine.pool.checkedout() == 0  # type: ignore[attr-defined]  # QueuePool's, not on Pool
    with pytest.raises(LeaseLost):  # a stale expected seq: the fence writes nothing
        await commit_checkpoint(
            engine, lease, expected_seq=0, base_id=None, base_encoded=(), new_encoded=history, envelope=envelope
        )
    assert engine.sync_engine.pool.checkedout() == 0  # type: ignore[attr-defined]  # QueuePool's, not on Pool
    second = await asyncio.wait_for(
        commit_checkpoint(
            engine,
            lease,
            expected_seq=1,
            base_id=first.checkpoint_id,
            base_encoded=history,
            new_encoded=encode_history([prompt("go"), *step(1)]),
            envelope=envelope,
        ),
        timeout=10,
    )
    assert second.seq == 2


def first_commit_in_background(engine: AsyncEngine, lease: Lease, history: Any, envelope: Any) -> asyncio.Future[Any]:
    """A run's first step commit, started as a task the test may cancel."""
    return asyncio.ensure_future(
        commit_checkpoint(
            engine, lease, expected_seq=0, base_id=None, base_encoded=(), new_encoded=history, envelope=envelope
        )
    )


async def stored_checkpoints(engine: AsyncEngine, run_id: str) -> tuple[int, int]:
    """How many checkpoints are stored and the run's current `checkpoint_seq` as readers see it (derived while it
    runs, `current_checkpoint.run_columns`): one statement, so one snapshot of both."""
    count = select(func.count()).select_from(checkpoints).scalar_subquery()
    derived = select(*run_columns()).where(runs.c.id == run_id).subquery()
    pointer = select(derived.c.checkpoint_seq).scalar_subquery()
    async with read_transaction(engine) as conn:
        found, seq = (await conn.execute(select(count, pointer))).one()
    return int(found), int(seq)
