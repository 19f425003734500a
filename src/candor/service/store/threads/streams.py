"""Thread stream entries (§8.7): fenced appends by the worker, reads by the SSE endpoint, and the trim sweep.

Entries are provisional live output. The worker writes its buffered `delta` entries and one `boundary` entry per
committed checkpoint in the checkpoint commit itself (`insert_stream_entries`), so a `boundary` entry exists exactly
when its checkpoint does; deltas that wait longer than `worker.stream_coalesce_seconds` are appended on their own
(`append_stream_entries`). Every write is fenced with the attempt's lease (S-20). Each payload carries `prev`, the id
of the thread's entry written just before it, so a reader can tell that entries were trimmed (`gap`, S-104).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any, Literal

from sqlalchemy import Insert, TextClause, and_, bindparam, delete, exists, func, insert, select, text
from sqlalchemy.engine import Dialect
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from ...protocol.fencing import Lease
from ..db.engine import nothing_to_commit, read_transaction, write_transaction
from ..runs.claims import Fenced, lock_fenced, read_now
from ..schema.dialect import allocate_stream_ids, db_now, json_with_key_sql
from ..schema.tables import stream_entries

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
    `boundary` entry atomically with the checkpoint (§7.8 step 7), also for the final commit that seals the run,
    after which the lease is gone and a separate fenced append would be refused. Returns the new ids, in order.

    Because the fence locks the thread row first, a thread's entries are inserted one transaction at a time and
    their ids increase in commit order on both backends. `prev` is null for a thread's first entry: a reader that
    has seen entry `n` and next receives one whose `prev` is not `n` knows the entries between were trimmed."""
    params = {
        "workspace_id": fenced.run.workspace_id,
        "thread_id": lease.thread_id,
        "run_id": lease.run_id,
        "attempt": lease.attempt_number,
    }
    if len(entries) == 1:  # the common case (a boundary alone): one statement reads `prev` and inserts
        entry = entries[0]
        rest = {"event": entry.event} if entry.type == "delta" else {"checkpoint_seq": entry.checkpoint_seq}
        values = params | {
            "sequence": entry.sequence,
            "type": entry.type,
            "rest": json.dumps(rest),
            "prev_thread_id": lease.thread_id,
        }
        return [int((await conn.execute(_insert_one(conn.dialect), values)).scalar_one())]
    # Several (deltas riding in a boundary commit): allocate their ids and read the previous one in one round
    # trip, then insert them all in one. Under the thread row lock (and on SQLite the single writer lock) nobody
    # else takes ids for this thread meanwhile, so the chain of `prev` ids is the commit order, as above.
    last, ids = await allocate_stream_ids(conn, lease.thread_id, len(entries))
    rows = []
    for entry, new_id in zip(entries, ids, strict=True):
        rows.append(params | _entry_values(entry, last) | {"id": new_id})
        last = new_id
    await conn.execute(_insert_entry_with_id(), rows)
    return ids


def _entry_values(entry: NewStreamEntry, prev: int | None) -> dict[str, Any]:
    payload: dict[str, Any] = {"prev": prev}
    if entry.type == "delta":
        payload["event"] = entry.event
    else:
        payload["checkpoint_seq"] = entry.checkpoint_seq
    return {"sequence": entry.sequence, "type": entry.type, "payload": payload}


@cache
def _insert_one(dialect: Dialect) -> TextClause:
    """One entry whose payload is `rest` plus `prev`, the thread's last entry id read by the same statement (each
    statement of a READ COMMITTED transaction sees every entry committed before it, and the caller holds the
    thread's row lock, so none can be committed meanwhile). Built once per dialect."""
    last = "(SELECT max(id) FROM stream_entries WHERE thread_id = :prev_thread_id)"
    payload = json_with_key_sql(dialect.name, json_param="rest", key="prev", value_sql=last)
    now = str(db_now().compile(dialect=dialect))
    return text(
        "INSERT INTO stream_entries (workspace_id, thread_id, run_id, attempt, sequence, type, payload, created_at) "
        f"VALUES (:workspace_id, :thread_id, :run_id, :attempt, :sequence, :type, {payload}, {now}) RETURNING id"
    )


@cache
def _insert_entry_with_id() -> Insert:
    return _insert_values(with_id=True)


def _insert_values(*, with_id: bool) -> Insert:
    c = stream_entries.c
    names = ("id",) * with_id + ("workspace_id", "thread_id", "run_id", "attempt", "sequence", "type", "payload")
    values: dict[str, Any] = {name: bindparam(name, type_=c[name].type) for name in names}
    return insert(stream_entries).values(**values, created_at=db_now())


def _entry(row: Any) -> StreamEntry:
    payload = row["payload"] or {}
    return StreamEntry(
        id=int(row["id"]),
        run_id=row["run_id"],
        attempt=int(row["attempt"]),
        sequence=int(row["sequence"]),
        type=row["type"],
        prev=payload.get("prev"),
        event=payload.get("event"),
        checkpoint_seq=payload.get("checkpoint_seq"),
    )


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
    overflowing threads per pass): entries covered by a boundary older than `trim_seconds`, entries older than
    `ttl_seconds`, and the oldest entries of threads holding more than `length`. The control role runs it every
    `worker.stream_trim_seconds`."""
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
        if not covered:
            nothing_to_commit(conn)  # a pass that removed nothing commits nothing
    async with write_transaction(engine) as conn:
        now = await read_now(conn)
        expired = (
            await conn.execute(delete(stream_entries).where(stream_entries.c.created_at < now - ttl_seconds))
        ).rowcount
        if not expired:
            nothing_to_commit(conn)
    overflow = 0
    async with read_transaction(engine) as conn:
        crowded = (
            (
                await conn.execute(
                    select(stream_entries.c.thread_id)
                    .group_by(stream_entries.c.thread_id)
                    .having(func.count() > length)
                    .limit(batch)
                )
            )
            .scalars()
            .all()
        )
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
