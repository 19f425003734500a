"""Stream entries written in batches (§8.7, S-104): deltas riding in a boundary commit get increasing ids and an
unbroken `prev` chain, interleaved with single appends, on both dialects."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select

from candor.service.store.attempts.seals import commit_checkpoint
from candor.service.store.checkpoints.incremental import CheckpointEnvelope, encode_envelope, encode_history
from candor.service.store.schema.tables import checkpoints, threads
from candor.service.store.threads.streams import NewStreamEntry, append_stream_entries, read_stream

from .step_commits import first_commit, leased_run
from .test_checkpoints import prompt


def _deltas(first: int, count: int) -> list[NewStreamEntry]:
    return [NewStreamEntry(type="delta", sequence=first + i, event={"i": first + i}) for i in range(count)]


async def test_batches_and_single_entries_chain_in_commit_order(db: Any) -> None:
    """S-104: every entry's `prev` is the id of the thread's entry written just before it, whether it was written
    alone (the database assigns its id) or in a batch (ids allocated up front)."""
    lease = await leased_run(db)
    first = await append_stream_entries(db.engine, lease, _deltas(1, 3))
    single = await append_stream_entries(
        db.engine, lease, [NewStreamEntry(type="boundary", sequence=4, checkpoint_seq=1)]
    )
    second = await append_stream_entries(db.engine, lease, _deltas(5, 2))
    ids = first + single + second
    assert ids == sorted(ids) and len(set(ids)) == 6
    async with db.engine.connect() as conn:
        workspace_id = (
            await conn.execute(select(threads.c.workspace_id).where(threads.c.id == lease.thread_id))
        ).scalar_one()
    stored = await read_stream(db.engine, workspace_id=workspace_id, thread_id=lease.thread_id, after=None)
    assert [e.id for e in stored] == ids
    assert [e.prev for e in stored] == [None, *ids[:-1]]
    assert [e.sequence for e in stored] == [1, 2, 3, 4, 5, 6]
    assert stored[3].type == "boundary" and stored[3].checkpoint_seq == 1 and stored[4].event == {"i": 5}


async def test_entries_riding_in_step_commits_chain_with_appends(db: Any) -> None:
    """§7.8 step 7, S-104: deltas and the `boundary` entry written by a step commit (on PostgreSQL in its single
    statement on asyncpg) continue the chain of entries appended on their own, and the next append continues
    theirs; the usage record and the checkpoint are written with them."""
    lease = await leased_run(db)
    envelope = encode_envelope(CheckpointEnvelope(thread_id=lease.thread_id))
    alone = await append_stream_entries(db.engine, lease, _deltas(1, 2))
    first = await first_commit(
        db.engine,
        lease,
        envelope=envelope,
        usage={"requests": 1},
        stream_entries=_deltas(3, 3),
        boundary_sequence=6,
    )
    lone = await commit_checkpoint(
        db.engine,
        lease,
        expected_seq=1,
        base_id=first.checkpoint_id,
        base_encoded=encode_history([prompt("go")]),
        new_encoded=encode_history([prompt("go")]),
        envelope=envelope,
        boundary_sequence=7,
    )
    after = await append_stream_entries(db.engine, lease, _deltas(8, 1))
    async with db.engine.connect() as conn:
        workspace_id = (
            await conn.execute(select(threads.c.workspace_id).where(threads.c.id == lease.thread_id))
        ).scalar_one()
        with_usage = select(checkpoints.c.seq).where(
            checkpoints.c.run_id == lease.run_id, checkpoints.c.usage.is_not(None)
        )
        usage = (await conn.execute(with_usage)).scalars().all()  # the usage rides on the checkpoint row
    stored = await read_stream(db.engine, workspace_id=workspace_id, thread_id=lease.thread_id, after=None)
    ids = [e.id for e in stored]
    assert ids == sorted(ids) and len(set(ids)) == 8 and ids[:2] == alone and ids[-1:] == after
    assert [e.prev for e in stored] == [None, *ids[:-1]]
    assert [e.sequence for e in stored] == [1, 2, 3, 4, 5, 6, 7, 8]
    assert [e.type for e in stored] == ["delta"] * 5 + ["boundary"] * 2 + ["delta"]
    assert [e.checkpoint_seq for e in stored[5:7]] == [1, 2] and stored[3].event == {"i": 4}
    assert (first.seq, lone.seq, usage) == (1, 2, [1])
