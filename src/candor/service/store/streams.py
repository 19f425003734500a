"""Thread stream entries (§8.7): fenced appends by the worker, reads by the SSE endpoint, and the trim sweep.

Entries are provisional live output. The worker appends coalesced `delta` entries and one `boundary` entry per
committed checkpoint, each batch in one transaction fenced with the attempt's lease (thread → run → attempt, S-20),
so a worker that lost its lease writes nothing. The `boundary` entry is written by the checkpoint commit itself
(`insert_stream_entries`), so it exists exactly when its checkpoint does, also for the final commit that seals the
run (after which the lease is gone and a separate fenced append would be refused). Because the fence locks the
thread row first, a thread's entries are inserted one transaction at a time, and their ids increase in commit
order on both backends.

Each stored payload carries `prev`, the id of the thread's entry written just before it (null for the first):
a reader that has seen entry `n` and next receives an entry whose `prev` is not `n` knows that entries in
between were trimmed, and sends `gap` (S-104).

`trim_streams` (control role, every `worker.stream_trim_seconds`) removes entries covered by a boundary that is
older than `worker.stream_trim_seconds` (S-105), entries older than `worker.stream_ttl`, and the oldest entries of
threads holding more than `worker.stream_length`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any, Literal

from sqlalchemy import Insert, Select, and_, bindparam, delete, exists, func, insert, select
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from ..protocol.fencing import Lease
from .dialect import db_now
from .engine import read_transaction, write_transaction
from .runs import Fenced, lock_fenced, read_now
from .tables import stream_entries

__all__ = (
    "NewStreamEntry",
    "StreamEntry",
    "TrimResult",
    "append_stream_entries",
    "insert_stream_entries",
    "read_stream",
    "oldest_stream_id",
    "trim_streams",
)

EntryType = Literal["delta", "boundary"]


@dataclass(frozen=True, kw_only=True, slots=True)
class NewStreamEntry:
    """What the worker appends: a delta (`event` = a pydantic-ai stream event as JSON) or a boundary."""

    type: EntryType
    sequence: int
    """Per attempt, from 1, in the order the attempt produced its entries."""
    event: Any = None
    checkpoint_seq: int | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class StreamEntry:
    """A stored entry as the stream endpoint sends it (§8.7)."""

    id: int
    run_id: str
    attempt: int
    sequence: int
    type: EntryType
    prev: int | None
    event: Any = None
    checkpoint_seq: int | None = None

    def data(self) -> dict[str, Any]:
        """The SSE `data` object of this entry's event."""
        base: dict[str, Any] = {"run_id": self.run_id, "attempt": self.attempt, "sequence": self.sequence}
        if self.type == "delta":
            return base | {"event": self.event}
        return base | {"checkpoint_seq": self.checkpoint_seq}


async def append_stream_entries(engine: AsyncEngine, lease: Lease, entries: Sequence[NewStreamEntry]) -> list[int]:
    """Append `entries` for the lease's run in one fenced transaction; raises `LeaseLost` and writes nothing when
    the lease is gone (§7.3). Returns the new ids, in order."""
    if not entries:
        return []
    async with write_transaction(engine) as conn:
        fenced = await lock_fenced(conn, lease)
        return await insert_stream_entries(conn, fenced, lease, entries)


async def insert_stream_entries(
    conn: AsyncConnection, fenced: Fenced, lease: Lease, entries: Sequence[NewStreamEntry]
) -> list[int]:
    """Insert `entries` inside a transaction that already passed the lease's fence (`fenced`, which holds the
    thread row lock, so ids and `prev` stay in commit order). The checkpoint commit uses it to write its
    `boundary` entry atomically with the checkpoint (§7.8 step 7). Returns the new ids, in order."""
    prev = (await conn.execute(_select_last_id(), {"thread_id": lease.thread_id})).scalar_one_or_none()
    params = {
        "workspace_id": fenced.run["workspace_id"], "thread_id": lease.thread_id, "run_id": lease.run_id,
        "attempt": lease.attempt_number,
    }  # fmt: skip
    statement = _insert_entry()
    ids: list[int] = []
    for entry in entries:
        payload: dict[str, Any] = {"prev": None if prev is None else int(prev)}
        if entry.type == "delta":
            payload["event"] = entry.event
        else:
            payload["checkpoint_seq"] = entry.checkpoint_seq
        values = params | {"sequence": entry.sequence, "type": entry.type, "payload": payload}
        prev = int((await conn.execute(statement, values)).scalar_one())
        ids.append(prev)
    return ids


@cache
def _insert_entry() -> Insert:
    """Built once (a constant statement keeps SQLAlchemy's compiled cache warm: no cache key per entry)."""
    c = stream_entries.c
    names = ("workspace_id", "thread_id", "run_id", "attempt", "sequence", "type", "payload")
    values: dict[str, Any] = {name: bindparam(name, type_=c[name].type) for name in names}
    return insert(stream_entries).values(**values, created_at=db_now()).returning(c.id)


@cache
def _select_last_id() -> Select[Any]:
    return select(func.max(stream_entries.c.id)).where(stream_entries.c.thread_id == bindparam("thread_id"))


def _entry(row: Any) -> StreamEntry:
    payload = row["payload"] or {}
    return StreamEntry(
        id=int(row["id"]), run_id=row["run_id"], attempt=int(row["attempt"]), sequence=int(row["sequence"]),
        type=row["type"], prev=payload.get("prev"), event=payload.get("event"),
        checkpoint_seq=payload.get("checkpoint_seq"),
    )  # fmt: skip


async def read_stream(
    engine: AsyncEngine, *, workspace_id: str, thread_id: str, after: int | None, limit: int = 500
) -> list[StreamEntry]:
    """The thread's retained entries with `id > after` (all when `after` is None), oldest first."""
    query = select(stream_entries).where(
        stream_entries.c.workspace_id == workspace_id, stream_entries.c.thread_id == thread_id
    )
    if after is not None:
        query = query.where(stream_entries.c.id > after)
    async with read_transaction(engine) as conn:
        rows = (await conn.execute(query.order_by(stream_entries.c.id).limit(limit))).mappings().all()
    return [_entry(row) for row in rows]


async def oldest_stream_id(engine: AsyncEngine, *, thread_id: str) -> int | None:
    async with read_transaction(engine) as conn:
        value = (
            await conn.execute(select(func.min(stream_entries.c.id)).where(stream_entries.c.thread_id == thread_id))
        ).scalar_one_or_none()
    return None if value is None else int(value)


@dataclass(frozen=True, kw_only=True, slots=True)
class TrimResult:
    covered: int
    expired: int
    overflow: int


async def trim_streams(
    engine: AsyncEngine, *, trim_seconds: float, ttl_seconds: float, length: int, batch: int = 1000
) -> TrimResult:
    """§8.7, S-105: remove covered, expired and overflowing entries (short transactions, at most `batch`
    overflowing threads per pass)."""
    boundary = stream_entries.alias("boundary")
    async with write_transaction(engine) as conn:
        now = await read_now(conn)
        covered = (
            await conn.execute(
                delete(stream_entries).where(
                    exists(
                        select(boundary.c.id).where(
                            and_(
                                boundary.c.run_id == stream_entries.c.run_id,
                                boundary.c.type == "boundary",
                                boundary.c.id >= stream_entries.c.id,
                                boundary.c.created_at <= now - trim_seconds,
                            )
                        )
                    )
                )
            )
        ).rowcount
    async with write_transaction(engine) as conn:
        now = await read_now(conn)
        expired = (
            await conn.execute(delete(stream_entries).where(stream_entries.c.created_at < now - ttl_seconds))
        ).rowcount
    overflow = 0
    async with read_transaction(engine) as conn:
        crowded = (
            await conn.execute(
                select(stream_entries.c.thread_id)
                .group_by(stream_entries.c.thread_id)
                .having(func.count() > length)
                .limit(batch)
            )
        ).scalars().all()
    for thread_id in crowded:
        async with write_transaction(engine) as conn:
            keep_from = (
                await conn.execute(
                    select(stream_entries.c.id)
                    .where(stream_entries.c.thread_id == thread_id)
                    .order_by(stream_entries.c.id.desc())
                    .offset(length - 1)
                    .limit(1)
                )
            ).scalar_one_or_none()
            if keep_from is None:
                continue
            overflow += (
                await conn.execute(
                    delete(stream_entries).where(
                        stream_entries.c.thread_id == thread_id, stream_entries.c.id < keep_from
                    )
                )
            ).rowcount
    return TrimResult(covered=int(covered or 0), expired=int(expired or 0), overflow=overflow)
