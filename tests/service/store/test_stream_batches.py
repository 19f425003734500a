"""Stream entries written in batches (§8.7, S-104): deltas riding in a boundary commit get increasing ids and an
unbroken `prev` chain, interleaved with single appends, on both dialects."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select

from candor.service.store.streams import NewStreamEntry, append_stream_entries, read_stream
from candor.service.store.tables import threads

from .test_round_trips import _leased_run


def _deltas(first: int, count: int) -> list[NewStreamEntry]:
    return [NewStreamEntry(type="delta", sequence=first + i, event={"i": first + i}) for i in range(count)]


async def test_batches_and_single_entries_chain_in_commit_order(db: Any) -> None:
    """S-104: every entry's `prev` is the id of the thread's entry written just before it, whether it was written
    alone (the database assigns its id) or in a batch (ids allocated up front)."""
    lease = await _leased_run(db)
    first = await append_stream_entries(db.engine, lease, _deltas(1, 3))
    single = await append_stream_entries(db.engine, lease, [NewStreamEntry(type="boundary", sequence=4, checkpoint_seq=1)])
    second = await append_stream_entries(db.engine, lease, _deltas(5, 2))
    ids = first + single + second
    assert ids == sorted(ids) and len(set(ids)) == 6
    async with db.engine.connect() as conn:
        workspace_id = (await conn.execute(select(threads.c.workspace_id).where(threads.c.id == lease.thread_id))).scalar_one()
    stored = await read_stream(db.engine, workspace_id=workspace_id, thread_id=lease.thread_id, after=None)
    assert [e.id for e in stored] == ids
    assert [e.prev for e in stored] == [None, *ids[:-1]]
    assert [e.sequence for e in stored] == [1, 2, 3, 4, 5, 6]
    assert stored[3].type == "boundary" and stored[3].checkpoint_seq == 1 and stored[4].event == {"i": 5}
