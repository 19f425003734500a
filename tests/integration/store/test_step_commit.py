"""The plain step commit's fence (§7.3, §7.8, issue 33): one table of situations, driven through every backend, with
the same outcome expected on each; and the races of a stale attempt with what replaces it."""

from __future__ import annotations

import asyncio
import dataclasses
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from sqlalchemy import func, insert, select, update

from candor.service.errors import LeaseLost
from candor.service.protocol.fencing import Lease
from candor.service.protocol.transitions import attempt_end
from candor.service.store.attempts.recovery import recover_attempt, requeue_run
from candor.service.store.attempts.seals import SealRequest, commit_checkpoint, failure, finish_attempt, seal_run
from candor.service.store.attempts.step_commit import StepCommit
from candor.service.store.checkpoints.incremental import CheckpointEnvelope, encode_envelope, encode_history
from candor.service.store.checkpoints.packed_messages import pack_messages, unpack_messages
from candor.service.store.db.engine import create_engine, read_transaction, write_transaction
from candor.service.store.runs.claims import claim_runs, lock_fenced, start_attempt
from candor.service.store.runs.current_checkpoint import materialize_current_checkpoint
from candor.service.store.schema.dialect import db_now
from candor.service.store.schema.tables import checkpoints, inbox_entries, run_attempts, runs

from .rows import new_id
from .step_commits import leased_run
from .test_checkpoints import prompt, step

ENVELOPE_THREAD = "thread"


async def _commit(engine: Any, lease: Lease, *, expected_seq: int, steps: int) -> Any:
    """The plain step that grows the history of `steps` steps by one more, over the base the attempt committed."""
    base = encode_history([prompt("go"), *(m for n in range(1, steps + 1) for m in step(n))])
    grown = [*base, *encode_history(step(steps + 1))]
    async with read_transaction(engine) as conn:
        base_id = (
            await conn.execute(
                select(checkpoints.c.id).where(checkpoints.c.run_id == lease.run_id, checkpoints.c.seq == expected_seq)
            )
        ).scalar_one_or_none()
    return await commit_checkpoint(
        engine,
        lease,
        expected_seq=expected_seq,
        base_id=base_id,
        base_encoded=base if base_id else (),
        new_encoded=grown,
        envelope=encode_envelope(CheckpointEnvelope(thread_id=lease.thread_id)),
        usage={"requests": 1},
    )


async def _count(engine: Any, run_id: str) -> int:
    async with read_transaction(engine) as conn:
        return int((await conn.execute(select(func.count()).where(checkpoints.c.run_id == run_id))).scalar_one())


# --- the fence table --------------------------------------------------------------------------------------------


async def _live(db: Any, lease: Lease) -> tuple[Lease, int]:
    return lease, 0


async def _expired(db: Any, lease: Lease) -> tuple[Lease, int]:
    async with write_transaction(db.engine) as conn:  # moving an expiry earlier is allowed (S-9)
        await conn.execute(
            update(run_attempts).where(run_attempts.c.id == lease.attempt_id).values(lease_expires_at=db_now() - 1)
        )
    return lease, 0


async def _taken_over(db: Any, lease: Lease) -> tuple[Lease, int]:
    """The attempt handed off (S-32: due at once) and another worker claimed the run."""
    await recover_attempt(db.engine, run_id=lease.run_id, attempt_id=lease.attempt_id, outcome="yielded", lease=lease)
    [claimed] = await claim_runs(
        db.engine, worker_id="w2", agents={"demo"}, limit=1, lease_seconds=30.0, randbytes=secrets.token_bytes
    )
    assert claimed.lease.attempt_id != lease.attempt_id
    return lease, 0


async def _wrong_token(db: Any, lease: Lease) -> tuple[Lease, int]:
    return dataclasses.replace(lease, token=secrets.token_bytes(32)), 0


async def _wrong_worker(db: Any, lease: Lease) -> tuple[Lease, int]:
    return dataclasses.replace(lease, worker_id="w9"), 0


async def _stale_seq(db: Any, lease: Lease) -> tuple[Lease, int]:
    """This attempt's own seq 1 is committed (e.g. an answer lost on the way back): committing seq 1 again fails."""
    await _commit(db.engine, lease, expected_seq=0, steps=0)
    return lease, 0


async def _sealed(db: Any, lease: Lease) -> tuple[Lease, int]:
    await seal_run(db.engine, lease, SealRequest(status="cancelled", failure=failure("cancelled")))
    return lease, 0


async def _cancelled_attempt(db: Any, lease: Lease) -> tuple[Lease, int]:
    """The attempt finished (cancelled) while the run row still names it: the attempt is no longer live."""
    async with write_transaction(db.engine) as conn:
        now = await conn.scalar(select(db_now()))
        end = attempt_end("cancelled")
        assert now is not None
        await conn.execute(finish_attempt(attempt_id=lease.attempt_id, end=end, attempt_failure=None, now=now))
    return lease, 0


async def _steer_pending(db: Any, lease: Lease) -> tuple[Lease, int]:
    """A compatible steer entry waits: not a plain step any more; the general path commits and assigns it."""
    async with write_transaction(db.engine) as conn:
        run = (await conn.execute(select(runs).where(runs.c.id == lease.run_id))).mappings().one()
        await conn.execute(
            insert(inbox_entries).values(
                id=new_id("ent"),
                workspace_id=run["workspace_id"],
                thread_id=lease.thread_id,
                kind="message",
                delivery="steer",
                position=1,
                payload={"content": []},
                size=2,
                status="pending",
                agent=run["agent"],
                options_digest=run["options_digest"],
                created_at=db_now(),
            )
        )
    return lease, 0


FENCE_TABLE: list[tuple[str, Callable[[Any, Lease], Awaitable[tuple[Lease, int]]], str]] = [
    ("live lease", _live, "committed"),
    ("lease expired", _expired, "lease_lost:lease_expired"),
    ("taken over by another attempt", _taken_over, "lease_lost:attempt_not_current"),
    ("another token", _wrong_token, "lease_lost:token_mismatch"),
    ("another worker", _wrong_worker, "lease_lost:worker_mismatch"),
    ("stale seq", _stale_seq, "lease_lost:checkpoint_seq_changed"),
    ("run sealed", _sealed, "lease_lost:run_not_running"),
    ("attempt cancelled", _cancelled_attempt, "lease_lost:attempt_not_live"),
    ("steer entry pending", _steer_pending, "committed_with_steer"),
]


@pytest.mark.parametrize(("situation", "arrange", "expected"), FENCE_TABLE, ids=[row[0] for row in FENCE_TABLE])
async def test_the_plain_step_fence_table(db: Any, situation: str, arrange: Any, expected: str) -> None:
    """S-20, S-21, S-22, S-38, S-39, §7.3, §7.8 step 6: each situation gives the same outcome on every backend; a
    refused commit writes nothing (no checkpoint row added) and says which condition failed."""
    lease, expected_seq = await arrange(db, await leased_run(db))
    before = await _count(db.engine, lease.run_id)
    try:
        result = await _commit(db.engine, lease, expected_seq=expected_seq, steps=0)
    except LeaseLost as lost:
        outcome = f"lease_lost:{lost.reason}"
    else:
        outcome = "committed_with_steer" if result.assigned else "committed"
    assert outcome == expected, situation
    assert await _count(db.engine, lease.run_id) == before + (0 if outcome.startswith("lease_lost") else 1)


# --- races -------------------------------------------------------------------------------------------------------


async def test_a_zombie_racing_the_sweep_writes_nothing(db: Any) -> None:
    """S-38, S-27 (issue 33): a stale attempt's commit that reaches the attempt's row while the sweep holds it (the
    sweep's transaction finishes the attempt and requeues the run) waits, then finds the attempt finished and writes
    nothing: PostgreSQL re-evaluates the locked row's new version (READ COMMITTED), SQLite's single writer runs it
    after the sweep. The run's checkpoint stays where the sweep left it, and the next attempt continues from it."""
    lease = await leased_run(db)
    await _commit(db.engine, lease, expected_seq=0, steps=0)
    zombie_engine = create_engine(db.url, timeout=10)  # its own pool (and, on SQLite, its own turn among writers)
    try:
        async with write_transaction(db.engine) as sweep:
            fenced = await lock_fenced(sweep, lease)  # the attempt's row, locked as `lock_for_expiry` locks it
            zombie = asyncio.ensure_future(_commit(zombie_engine, lease, expected_seq=1, steps=1))
            await asyncio.sleep(0.5)
            assert not zombie.done()  # waiting for the attempt's row (PostgreSQL) or the writer lock (SQLite)
            await materialize_current_checkpoint(sweep, fenced)
            end = attempt_end("failed")
            await sweep.execute(
                finish_attempt(
                    attempt_id=lease.attempt_id, end=end, attempt_failure=failure("lease_expired"), now=fenced.now
                )
            )
            await sweep.execute(requeue_run(run_id=lease.run_id, available_at=fenced.now))
        with pytest.raises(LeaseLost):
            await asyncio.wait_for(zombie, timeout=20)
    finally:
        await zombie_engine.dispose()
    assert await _count(db.engine, lease.run_id) == 1
    [successor] = await claim_runs(
        db.engine, worker_id="w2", agents={"demo"}, limit=1, lease_seconds=30.0, randbytes=secrets.token_bytes
    )
    assert (successor.checkpoint_seq, successor.lease.attempt_number) == (1, 2)
    await start_attempt(db.engine, successor.lease, harness_run_id="run_" + "1" * 32)
    assert (await _commit(db.engine, successor.lease, expected_seq=1, steps=1)).seq == 2


async def test_a_zombie_that_commits_first_is_where_its_successor_starts(db: Any) -> None:
    """S-38, S-39, S-48 (issue 33): a plain step moves no pointer on `runs`, so the handoff that ends an attempt
    writes the run's latest checkpoint there (`materialize_current_checkpoint`) and the successor's claim starts
    from the stale attempt's last commit; the stale attempt's next commit is refused (the seq it would take is the
    successor's), and the successor's commits continue the run's seqs."""
    lease = await leased_run(db)
    await _commit(db.engine, lease, expected_seq=0, steps=0)
    await _commit(db.engine, lease, expected_seq=1, steps=1)
    async with read_transaction(db.engine) as conn:
        stored = (await conn.execute(select(runs.c.checkpoint_seq).where(runs.c.id == lease.run_id))).scalar_one()
    assert stored == 0  # plain steps leave `runs` alone
    await recover_attempt(db.engine, run_id=lease.run_id, attempt_id=lease.attempt_id, outcome="yielded", lease=lease)
    [successor] = await claim_runs(
        db.engine, worker_id="w2", agents={"demo"}, limit=1, lease_seconds=30.0, randbytes=secrets.token_bytes
    )
    assert successor.checkpoint_seq == 2
    await start_attempt(db.engine, successor.lease, harness_run_id="run_" + "2" * 32)
    assert (await _commit(db.engine, successor.lease, expected_seq=2, steps=2)).seq == 3
    with pytest.raises(LeaseLost):
        await _commit(db.engine, lease, expected_seq=2, steps=2)
    async with read_transaction(db.engine) as conn:
        rows = (
            await conn.execute(
                select(checkpoints.c.seq, checkpoints.c.attempt)
                .where(checkpoints.c.run_id == lease.run_id)
                .order_by(checkpoints.c.seq)
            )
        ).all()
    assert [tuple(row) for row in rows] == [(1, 1), (2, 1), (3, 2)]


async def test_two_attempts_committing_the_same_seq_are_exclusive(db: Any) -> None:
    """S-38, S-39: `unique(run_id, seq)` settles two commits of one seq whatever the fence saw: the second fails as
    `LeaseLost` and writes nothing (here the same attempt commits seq 1 twice at once)."""
    lease = await leased_run(db)
    results = await asyncio.gather(
        *(_commit(db.engine, lease, expected_seq=0, steps=0) for _ in range(2)), return_exceptions=True
    )
    assert sorted(type(result).__name__ for result in results) == ["CommitResult", "LeaseLost"]
    assert await _count(db.engine, lease.run_id) == 1


# --- the request value -------------------------------------------------------------------------------------------


def test_a_step_commit_checks_what_the_table_no_longer_checks() -> None:
    """S-39, S-41, §6 (migration 0007 dropped the CHECKs of `checkpoints` on PostgreSQL): `StepCommit` refuses a seq
    below 1, a `kept` outside `[0, count]` and kept messages without a base, before any statement is sent."""
    lease = Lease(run_id="run", attempt_id="att", thread_id="thr", attempt_number=1, worker_id="w", token=b"t" * 32)
    envelope = encode_envelope(CheckpointEnvelope(thread_id="thr"))
    history = encode_history([prompt("go"), *step(1)])
    made = StepCommit.of(
        lease, expected_seq=0, base_id=None, base_encoded=(), new_encoded=history, envelope=envelope, usage=None
    )
    assert (made.seq, made.kept, made.count) == (1, 0, 3)
    assert unpack_messages(made.messages, checkpoint_id="c", first_index=0, count=3) == [
        (m.body, m.digest) for m in history
    ]
    wrongs: list[dict[str, Any]] = [{"seq": 0}, {"kept": 4}, {"kept": 1}]
    for wrong in wrongs:
        with pytest.raises(ValueError):
            dataclasses.replace(made, **wrong)
    grown = StepCommit.of(
        lease,
        expected_seq=1,
        base_id="ckp",
        base_encoded=history,
        new_encoded=[*history, *encode_history(step(2))],
        envelope=envelope,
        usage={"requests": 1},
    )
    assert (grown.seq, grown.kept, grown.count, grown.usage) == (2, 3, 5, {"requests": 1})
    assert grown.messages == pack_messages(encode_history(step(2)))
    # S-42: what the row stores for the step: the envelope and its digest, the new messages as packed
    assert grown.bytes_written == len(envelope.text) + len(envelope.digest) + len(grown.messages)
