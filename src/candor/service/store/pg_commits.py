"""The checkpoint commit of a step (§7.8) on PostgreSQL, straight on asyncpg: four round trips, no SQLAlchemy.

A durable step is two fenced commits; through SQLAlchemy each cost BEGIN, the fence, the combined writes, the
stream entries (one or two statements) and COMMIT, plus SQLAlchemy's execution context per statement: about half
of the worker's CPU per step (issue 12, docs/worker-cost.md). Here the same transaction is BEGIN, the fence, ONE
statement and COMMIT on the pooled connection's asyncpg connection, whose prepared statements asyncpg caches:

1. the fence is `runs.lock_fenced_rows()` itself (compiled once for asyncpg), checked in Python by the same
   `fenced_from_row` as every other fenced write (constant-time token comparison included), before anything is
   written (S-20); the compare-and-swap on `checkpoint_seq` follows (S-38);
2. the checkpoint row, its new message rows, the usage record, the stream entries (the buffered deltas and the
   `boundary` entry, ids and `prev` chain as `streams.insert_stream_entries` makes them) and the run pointer are
   data-modifying CTEs of one `UPDATE runs … RETURNING` whose value says whether a steer entry is pending.

It handles the usual boundary only: no seal, no inbox entry to consume, no steer entry to assign. `seals.
commit_checkpoint` decides that up front, except for a pending steer entry, which only the write statement sees:
then this transaction is rolled back whole and `None` returned, and the caller commits through the general path.
A failed fence or compare-and-swap raises `LeaseLost` from a transaction that wrote nothing. Driver errors that
mean "unavailable" become `StoreUnavailable` as `engine.translate_errors` does for SQLAlchemy's. If the block is
left while asyncpg still has the transaction open (cancelled mid-statement), the connection is terminated, so no
half-done transaction can go back to the pool.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

import asyncpg
from sqlalchemy.engine import Dialect
from sqlalchemy.ext.asyncio import AsyncEngine

from .. import failpoints
from ..errors import LeaseLost, StoreUnavailable
from ..protocol.fencing import Lease
from .checkpoints import CheckpointWritten, EncodedEnvelope, EncodedMessage, common_prefix_length, new_checkpoint_id
from .dialect import now_sql
from .engine import UNAVAILABLE_SQLSTATE_PREFIXES, UNAVAILABLE_SQLSTATES, translate_errors
from .runs import fenced_from_row, lock_fenced_rows
from .streams import NewStreamEntry
from .tables import CHECKPOINT_FORMAT

__all__ = ("StepCommit", "commit_step")


@dataclass(frozen=True, kw_only=True, slots=True)
class StepCommit:
    """What `commit_step` wrote."""

    written: CheckpointWritten
    seq: int


@cache
def _fence_sql(dialect: Dialect) -> tuple[str, tuple[str, ...]]:
    """`lock_fenced_rows()` as asyncpg SQL (`$n` parameters) and the names of its parameters in order."""
    compiled = lock_fenced_rows().compile(dialect=dialect)
    return compiled.string, tuple(compiled.positiontup or ())


_NOW = now_sql("postgresql")

_WRITE_SQL = f"""
WITH ckp AS (
    INSERT INTO checkpoints (id, workspace_id, thread_id, run_id, seq, attempt, format, base_id, kept, count,
                             envelope, envelope_digest, created_at)
    SELECT $1::varchar, t.workspace_id, $2::varchar, $3::varchar, $4::integer, $5::integer, {CHECKPOINT_FORMAT},
           $6::varchar, $7::integer, $8::integer, $9::text, $10::varchar, {_NOW}
    FROM threads t WHERE t.id = $2::varchar
), msgs AS (
    INSERT INTO checkpoint_messages (checkpoint_id, "index", body, digest)
    SELECT $1::varchar, m.i, m.b, m.d FROM unnest($11::integer[], $12::text[], $13::text[]) AS m(i, b, d)
), use_record AS (
    INSERT INTO usage_records (workspace_id, run_id, attempt_id, checkpoint_seq, usage, created_at)
    SELECT $14::varchar, $3::varchar, $15::varchar, $4::integer, CAST($16::text AS jsonb), {_NOW}
    WHERE $16::text IS NOT NULL
), ids AS (
    SELECT id, row_number() OVER (ORDER BY id) AS n
    FROM (SELECT nextval(pg_get_serial_sequence('stream_entries', 'id')) AS id
          FROM generate_series(1, cardinality($18::integer[]))) AS allocated
), entries AS (
    SELECT ids.id, e.sequence, e.type, e.rest, lag(ids.id) OVER (ORDER BY e.n) AS prev_new
    FROM unnest($18::integer[], $19::text[], $20::text[]) WITH ORDINALITY AS e(sequence, type, rest, n)
    JOIN ids ON ids.n = e.n
), stream AS (
    INSERT INTO stream_entries (id, workspace_id, thread_id, run_id, attempt, sequence, type, payload, created_at)
    SELECT id, $14::varchar, $2::varchar, $3::varchar, $17::integer, sequence, type,
           CAST(rest AS jsonb) || jsonb_build_object(
               'prev', coalesce(prev_new, (SELECT max(s.id) FROM stream_entries s WHERE s.thread_id = $2::varchar))),
           {_NOW}
    FROM entries
)
UPDATE runs SET checkpoint_id = $1::varchar, checkpoint_seq = $4::integer WHERE id = $3::varchar
RETURNING EXISTS (
    SELECT 1 FROM inbox_entries e WHERE e.thread_id = $2::varchar AND e.status = 'pending' AND e.delivery = 'steer'
) AS pending_steer
"""
"""Parameters: 1 checkpoint id, 2 thread, 3 run, 4 seq, 5 attempt number, 6 base id, 7 kept, 8 count, 9 envelope,
10 envelope digest, 11–13 the new message rows (index, body, digest), 14 the run's workspace, 15 attempt id,
16 usage JSON (null: no usage record), 17 attempt number for the stream, 18–20 the stream entries (sequence, type,
JSON payload without `prev`). Each statement of the CTEs sees the snapshot taken after the fence's locks were
granted, so `max(id)` is the thread's last committed entry (the thread row lock keeps others out meanwhile), as
in `streams.insert_stream_entries`; the sequence hands out the ids in increasing order, matched to the entries in
order."""


class _StreamEntryRows:
    """The stream entries as three parallel arrays (`sequence`, `type`, payload JSON without `prev`)."""

    def __init__(self, entries: Sequence[NewStreamEntry]) -> None:
        self.sequences = [entry.sequence for entry in entries]
        self.types = [entry.type for entry in entries]
        self.rests = [
            json.dumps({"event": entry.event} if entry.type == "delta" else {"checkpoint_seq": entry.checkpoint_seq})
            for entry in entries
        ]


async def commit_step(
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
) -> StepCommit | None:
    """§7.8 steps 1–3, 5, 7 in one fenced transaction; None (nothing written) when a steer entry is pending and the
    thread is not archived, which the general path must assign (step 6)."""
    if base_id is None and base_encoded:
        raise ValueError("base_encoded must be empty when there is no base checkpoint")
    checkpoint_id = new_checkpoint_id()
    seq = expected_seq + 1
    kept = common_prefix_length([m.digest for m in base_encoded], [m.digest for m in new_encoded])
    fresh = new_encoded[kept:]
    written = len(envelope.text) + len(envelope.digest) + sum(len(m.body) + len(m.digest) for m in fresh)
    entries = _StreamEntryRows(stream_entries)
    fence_sql, fence_names = _fence_sql(engine.dialect)
    fence_values = {"thread_id": lease.thread_id, "run_id": lease.run_id, "attempt_id": lease.attempt_id}
    with translate_errors():  # checkout and connection errors (SQLAlchemy's)
        async with engine.connect() as sa_conn:
            pg: asyncpg.Connection = (await sa_conn.get_raw_connection()).driver_connection
            try:
                async with pg.transaction():
                    row = await pg.fetchrow(fence_sql, *(fence_values[name] for name in fence_names))
                    fenced = fenced_from_row(row, lease)
                    if fenced.run["checkpoint_seq"] != expected_seq:
                        raise LeaseLost("checkpoint_seq_changed")
                    pending_steer = await pg.fetchval(
                        _WRITE_SQL,
                        checkpoint_id, lease.thread_id, lease.run_id, seq, lease.attempt_number, base_id, kept,
                        len(new_encoded), envelope.text, envelope.digest,
                        list(range(kept, len(new_encoded))), [m.body for m in fresh], [m.digest for m in fresh],
                        fenced.run["workspace_id"], lease.attempt_id, json.dumps(dict(usage)) if usage else None,
                        lease.attempt_number, entries.sequences, entries.types, entries.rests,
                    )  # fmt: skip
                    if pending_steer and not fenced.thread_archived:
                        raise _SteerPending
                    failpoints.hit(failpoints.CHECKPOINT_BEFORE_COMMIT)
            except _SteerPending:
                return None
            except (asyncpg.PostgresError, asyncpg.InterfaceError) as error:
                if _unavailable(error):
                    raise StoreUnavailable(f"database unavailable: {type(error).__name__}") from error
                raise
            finally:
                if not pg.is_closed() and pg.is_in_transaction():
                    pg.terminate()  # left mid-transaction (cancelled): never hand it back to the pool half done
    return StepCommit(
        written=CheckpointWritten(id=checkpoint_id, kept=kept, count=len(new_encoded), bytes_written=written),
        seq=seq,
    )


class _SteerPending(Exception):
    """Rolls the transaction back: a steer entry waits, the general path commits this boundary instead."""


def _unavailable(error: Exception) -> bool:
    """`engine.is_unavailable` for asyncpg's own errors: lost connections, timeouts, lock waits, busy servers."""
    if isinstance(error, asyncpg.InterfaceError):
        return True  # the connection is unusable (closed, or in an undefined state)
    sqlstate = getattr(error, "sqlstate", None) or ""
    return sqlstate in UNAVAILABLE_SQLSTATES or sqlstate.startswith(UNAVAILABLE_SQLSTATE_PREFIXES)
