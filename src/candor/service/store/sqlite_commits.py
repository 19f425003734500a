"""The checkpoint commit of a step (§7.8) on SQLite, in one call to the connection's thread (issue 12).

aiosqlite runs every statement in the connection's own thread: each one is a hand-over to that thread and a
wake-up of the event loop when it is done, and through SQLAlchemy an execution context too. A step commit was nine
of them (BEGIN IMMEDIATE, the fence, the checkpoint row, its message rows, the usage record, the run pointer, the
stream entries, COMMIT). Here the whole transaction is one function run in that thread, on the `sqlite3`
connection, with the same statements and the same order as `seals.commit_checkpoint`:

* `BEGIN IMMEDIATE` (§2.2: the single writer lock, waited for up to the engine's busy timeout), once the commit's
  turn among the process's writers has come (`writer_gate.py`);
* the fence is `runs.step_fence_rows()` compiled for SQLite, checked by the same `fenced_from_row` as every other
  fenced write before anything is written (S-20), then the compare-and-swap on `checkpoint_seq` (S-38);
* the checkpoint row, its new message rows, the usage record, the run pointer and the stream entries (`prev`
  chained in commit order, ids from `AUTOINCREMENT`, as `streams.insert_stream_entries` makes them);
* `COMMIT`, or `ROLLBACK` on any exception, so nothing of a failed commit is visible (S-37).

Like `pg_commits.py` it handles the usual boundary and a run's first one (which consumes the run's source entry
and then increments the thread's version), not a seal nor steer entries; a pending steer entry rolls it back and
returns None for the general path to assign it (step 6). A busy or locked database becomes `StoreUnavailable`, as
through SQLAlchemy.
"""

from __future__ import annotations

import asyncio
import functools
import json
import sqlite3
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from functools import cache
from typing import Any

from sqlalchemy.engine import Dialect
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.util import greenlet_spawn

from .. import failpoints
from ..errors import LeaseLost, StoreUnavailable
from ..protocol.fencing import Lease
from .checkpoints import CheckpointWritten, EncodedEnvelope, EncodedMessage, kept_count, new_checkpoint_id
from .dialect import now_sql
from .engine import check_out, translate_errors, unavailable
from .pg_commits import StepCommit
from .runs import fenced_from_row, step_fence_rows
from .streams import NewStreamEntry
from .tables import CHECKPOINT_FORMAT
from .writer_gate import writer_turn

__all__ = ("commit_step_sqlite", "pooled_aiosqlite")

_NOW = now_sql("sqlite")
_INSERT_CHECKPOINT = (
    "INSERT INTO checkpoints (id, workspace_id, thread_id, run_id, seq, attempt, format, base_id, kept, count, "
    "envelope, envelope_digest, created_at) "
    f"VALUES (?, (SELECT workspace_id FROM threads WHERE id = ?), ?, ?, ?, ?, {CHECKPOINT_FORMAT}, ?, ?, ?, ?, ?, "
    f"{_NOW})"
)
_INSERT_MESSAGE = 'INSERT INTO checkpoint_messages (checkpoint_id, "index", body, digest) VALUES (?, ?, ?, ?)'
_INSERT_USAGE = (
    "INSERT INTO usage_records (workspace_id, run_id, attempt_id, checkpoint_seq, usage, created_at) "
    f"VALUES (?, ?, ?, ?, ?, {_NOW})"
)
_MOVE_POINTER = "UPDATE runs SET checkpoint_id = ?, checkpoint_seq = ? WHERE id = ?"
_STEER_PENDING = (
    "SELECT EXISTS (SELECT 1 FROM inbox_entries WHERE thread_id = ? AND status = 'pending' AND delivery = 'steer')"
)
_LAST_STREAM_ID = "SELECT max(id) FROM stream_entries WHERE thread_id = ?"
_CONSUME_SOURCE = (
    "UPDATE inbox_entries SET status = 'consumed', incorporated_checkpoint_seq = ?, finished_at = ? "
    "WHERE id = ? AND assigned_run_id = ? AND status = 'assigned'"
)
_BUMP_THREAD = "UPDATE threads SET version = version + 1, updated_at = ? WHERE id = ?"
_INSERT_STREAM = (
    "INSERT INTO stream_entries (workspace_id, thread_id, run_id, attempt, sequence, type, payload, created_at) "
    f"VALUES (?, ?, ?, ?, ?, ?, ?, {_NOW})"
)


@cache
def _fence_sql(dialect: Dialect) -> tuple[str, tuple[str, ...]]:
    """`step_fence_rows()` as SQLite SQL (`?` parameters) and the names of its parameters in order."""
    compiled = step_fence_rows().compile(dialect=dialect)
    return compiled.string, tuple(compiled.positiontup or ())


async def commit_step_sqlite(
    engine: AsyncEngine,
    lease: Lease,
    *,
    expected_seq: int,
    base_id: str | None,
    base_encoded: Sequence[EncodedMessage],
    new_encoded: Sequence[EncodedMessage],
    envelope: EncodedEnvelope,
    usage: Mapping[str, Any] | None,
    stream_entries: Sequence[NewStreamEntry],
    consume_source: bool = False,
) -> StepCommit | None:
    """§7.8 steps 1–5, 7 in one fenced transaction, run in the connection's thread; raises `LeaseLost` when the
    fence or the compare-and-swap fails; None (nothing written) when a steer entry is pending and the thread is
    not archived."""
    if base_id is None and base_encoded:
        raise ValueError("base_encoded must be empty when there is no base checkpoint")
    kept = kept_count(base_encoded, new_encoded)
    step = _Step(
        lease=lease, expected_seq=expected_seq, checkpoint_id=new_checkpoint_id(), base_id=base_id, kept=kept,
        new_encoded=new_encoded, envelope=envelope, usage=usage, stream_entries=stream_entries,
        fence=_fence_sql(engine.dialect), consume_source=consume_source,
    )  # fmt: skip
    with translate_errors():
        async with writer_turn(engine), pooled_aiosqlite(engine) as aio:
            if aio._connection is None:  # closed: as aiosqlite's own calls check, nothing would run the call
                raise StoreUnavailable("database unavailable: the SQLite connection is closed")
            # aiosqlite's queue to its thread, as SQLAlchemy's own adapter uses it (`isolation_level`).
            done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
            aio._tx.put_nowait((done, functools.partial(step.run, aio._conn)))
            try:
                committed = await done
            except sqlite3.OperationalError as error:  # busy, locked, I/O: the database is not usable now
                raise unavailable(error) from error
    if not committed:
        return None
    fresh = new_encoded[kept:]
    written = len(envelope.text) + len(envelope.digest) + sum(len(m.body) + len(m.digest) for m in fresh)
    return StepCommit(
        written=CheckpointWritten(id=step.checkpoint_id, kept=kept, count=len(new_encoded), bytes_written=written),
        seq=expected_seq + 1,
    )


@asynccontextmanager
async def pooled_aiosqlite(engine: AsyncEngine) -> AsyncIterator[Any]:
    """A connection of the engine's pool, as the aiosqlite connection, checked out and returned through the pool
    itself (`engine.check_out`).

    The step commit ends its own transaction in the connection's thread (`_Step.run`: COMMIT or ROLLBACK, whatever
    happened), so after it the connection goes back to the pool as one whose transaction was already reset. The
    pool's own reset would roll back through aiosqlite's thread, one more hand-over and wake-up per commit; with
    `engine.connect()` that and SQLAlchemy's wrappers cost about 190 µs of a commit's CPU on the event loop,
    measured in one process alternating both (issue 12, docs/worker-cost.md). When the block ends with an
    exception, a cancellation included, the call may still be queued or running on the connection's thread: the
    connection then goes back the usual way, shielded, its rollback queued behind that call, as before.
    """
    pooled = await check_out(engine)
    aio: Any = pooled.driver_connection
    try:
        yield aio
    except BaseException:
        await asyncio.shield(greenlet_spawn(pooled.close))
        raise
    if aio._connection is not None and aio._connection.in_transaction:  # the call always ends its transaction
        await asyncio.shield(greenlet_spawn(pooled.close))
    else:  # no I/O unless the pool is over its size and closes the connection instead
        await greenlet_spawn(pooled._close_special, transaction_reset=True)


class _Step:
    """One step commit's statements, run by `run()` in the connection's thread."""

    def __init__(
        self, *, lease: Lease, expected_seq: int, checkpoint_id: str, base_id: str | None, kept: int,
        new_encoded: Sequence[EncodedMessage], envelope: EncodedEnvelope, usage: Mapping[str, Any] | None,
        stream_entries: Sequence[NewStreamEntry], fence: tuple[str, tuple[str, ...]], consume_source: bool,
    ) -> None:  # fmt: skip
        self.lease, self.expected_seq, self.checkpoint_id = lease, expected_seq, checkpoint_id
        self.base_id, self.kept, self.new_encoded, self.envelope = base_id, kept, new_encoded, envelope
        self.usage, self.stream_entries, self.fence = usage, stream_entries, fence
        self.consume_source = consume_source

    def run(self, db: sqlite3.Connection) -> bool:
        """The transaction; True when it committed, False when it rolled back for a pending steer entry."""
        db.execute("BEGIN IMMEDIATE")
        try:
            committed = self._writes(db)
            db.execute("COMMIT" if committed else "ROLLBACK")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise
        return committed

    def _writes(self, db: sqlite3.Connection) -> bool:
        lease = self.lease
        sql, names = self.fence
        values = {"thread_id": lease.thread_id, "run_id": lease.run_id, "attempt_id": lease.attempt_id}
        cursor = db.execute(sql, [values[name] for name in names])
        found = cursor.fetchone()
        row = None if found is None else dict(zip((d[0] for d in cursor.description), found, strict=True))
        fenced = fenced_from_row(row, lease)
        if fenced.run["checkpoint_seq"] != self.expected_seq:
            raise LeaseLost("checkpoint_seq_changed")
        seq = self.expected_seq + 1
        count = len(self.new_encoded)
        db.execute(
            _INSERT_CHECKPOINT,
            (self.checkpoint_id, lease.thread_id, lease.thread_id, lease.run_id, seq, lease.attempt_number,
             self.base_id, self.kept, count, self.envelope.text, self.envelope.digest),
        )  # fmt: skip
        fresh = self.new_encoded[self.kept :]
        if fresh:
            db.executemany(
                _INSERT_MESSAGE,
                [(self.checkpoint_id, self.kept + n, m.body, m.digest) for n, m in enumerate(fresh)],
            )
        workspace_id = fenced.run["workspace_id"]
        if self.usage:
            db.execute(_INSERT_USAGE, (workspace_id, lease.run_id, lease.attempt_id, seq, json.dumps(dict(self.usage))))
        db.execute(_MOVE_POINTER, (self.checkpoint_id, seq, lease.run_id))
        if not fenced.thread_archived and db.execute(_STEER_PENDING, (lease.thread_id,)).fetchone()[0]:
            return False
        source = fenced.run["source_entry_id"] if self.consume_source else None
        # A run's first commit: §7.8 step 4, and S-75 when an entry changed.
        if source is not None and db.execute(_CONSUME_SOURCE, (seq, fenced.now, source, lease.run_id)).rowcount:
            db.execute(_BUMP_THREAD, (fenced.now, lease.thread_id))
        if self.stream_entries:
            prev = db.execute(_LAST_STREAM_ID, (lease.thread_id,)).fetchone()[0]
            for entry in self.stream_entries:
                payload: dict[str, Any] = {"prev": prev}
                if entry.type == "delta":
                    payload["event"] = entry.event
                else:
                    payload["checkpoint_seq"] = entry.checkpoint_seq
                inserted = db.execute(
                    _INSERT_STREAM,
                    (workspace_id, lease.thread_id, lease.run_id, lease.attempt_number, entry.sequence, entry.type,
                     json.dumps(payload)),
                )  # fmt: skip
                prev = inserted.lastrowid
        failpoints.hit(failpoints.CHECKPOINT_BEFORE_COMMIT)
        return True
