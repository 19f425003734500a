"""A plain step commit (§7.8): one fenced INSERT of the checkpoint row, rendered per backend.

A plain step (no entry incorporated, no seal, no steer entry pending) writes one `checkpoints` row holding its packed
messages and usage, and its stream entries with it, atomically; no row every step rewrites is touched (S-37): the
run's current checkpoint is its highest `seq` while it runs (`current_checkpoint.py`). The fence (§7.3, S-20, S-38)
is the INSERT's own `WHERE` (`_FENCED_ROW`); `unique(run_id, seq)` makes two commits of one `seq` exclusive (S-38,
S-39); the token hash is compared blinded (S-21). When nothing was inserted, `diagnose` says why.
"""

from __future__ import annotations

import asyncio
import json
import re
import secrets
import sqlite3
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any, Final

import asyncpg
from sqlalchemy import exists, select
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.util import greenlet_spawn

from ... import failpoints
from ...errors import LeaseLost, StoreUnavailable
from ...protocol.fencing import Lease, hash_lease_token
from ..checkpoints.incremental import (
    CheckpointWritten,
    EncodedEnvelope,
    EncodedMessage,
    kept_count,
    new_checkpoint_id,
    written_bytes,
)
from ..checkpoints.packed_messages import pack_messages
from ..db.dialect import DialectName, blind_hex, dialect_name
from ..db.engine import check_out, translate_errors, write_transaction
from ..db.pg_driver import pooled_asyncpg
from ..db.writer_gate import writer_turn
from ..runs.claims import lock_fenced
from ..schema.dialect import now_sql
from ..schema.tables import CHECKPOINT_FORMAT, LIVE_ATTEMPT_STATUSES, inbox_entries
from ..threads.streams import NewStreamEntry

__all__ = (
    "StepCommit",
    "RENDERERS",
    "commit_plain_step",
    "render_postgresql",
    "render_sqlite",
    "sqlite_stream_sql",
    "diagnose",
)

SQLITE_BLIND_FUNCTION: Final = "candor_blind"
"""`dialect.blind_hex` as the SQL function SQLite connections get (`dialect.install_connection_hooks`)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class StepCommit:
    """One plain step commit: everything the INSERT writes, checked before any statement is sent (on PostgreSQL
    the hot table has no CHECK constraints, migration 0007)."""

    lease: Lease
    checkpoint_id: str
    seq: int
    """The run's previous committed seq + 1 (S-39)."""
    base_id: str | None
    kept: int
    count: int
    messages: str
    """The `count − kept` new messages, packed (packed_messages.py)."""
    envelope: EncodedEnvelope
    usage: Mapping[str, Any] | None
    """The usage incurred since the attempt's previous record (a delta), or None."""
    stream_entries: tuple[NewStreamEntry, ...]
    bytes_written: int

    def __post_init__(self) -> None:
        if self.seq < 1 or self.lease.attempt_number < 1:
            raise ValueError("a run's checkpoint has seq >= 1 and an attempt number >= 1")
        if not 0 <= self.kept <= self.count:
            raise ValueError("kept must be between 0 and count")
        if self.base_id is None and self.kept:
            raise ValueError("a checkpoint without a base keeps no messages")

    @classmethod
    def of(
        cls,
        lease: Lease,
        *,
        expected_seq: int,
        base_id: str | None,
        base_encoded: Sequence[EncodedMessage],
        new_encoded: Sequence[EncodedMessage],
        envelope: EncodedEnvelope,
        usage: Mapping[str, Any] | None,
        stream_entries: Sequence[NewStreamEntry] = (),
        checkpoint_id: str | None = None,
    ) -> StepCommit:
        """The commit of `new_encoded` over the base history the attempt last committed or restored (§6)."""
        if base_id is None and base_encoded:
            raise ValueError("base_encoded must be empty when there is no base checkpoint")
        kept = kept_count(base_encoded, new_encoded)
        packed = pack_messages(new_encoded[kept:])
        return cls(
            lease=lease,
            checkpoint_id=checkpoint_id or new_checkpoint_id(),
            seq=expected_seq + 1,
            base_id=base_id,
            kept=kept,
            count=len(new_encoded),
            messages=packed,
            envelope=envelope,
            usage=dict(usage) if usage else None,
            stream_entries=tuple(stream_entries),
            bytes_written=written_bytes(envelope, packed),
        )

    @property
    def written(self) -> CheckpointWritten:
        return CheckpointWritten(
            id=self.checkpoint_id, kept=self.kept, count=self.count, bytes_written=self.bytes_written
        )

    def parameters(self, nonce: str) -> dict[str, Any]:
        """The named parameters of `render_step_sql` (pure, given the nonce)."""
        lease = self.lease
        entries = self.stream_entries
        return {
            "thread_id": lease.thread_id,
            "run_id": lease.run_id,
            "attempt_id": lease.attempt_id,
            "attempt_number": lease.attempt_number,
            "worker_id": lease.worker_id,
            "nonce": nonce,
            "blinded": blind_hex(hash_lease_token(lease.token) + nonce),
            "checkpoint_id": self.checkpoint_id,
            "seq": self.seq,
            "base_id": self.base_id,
            "kept": self.kept,
            "count": self.count,
            "envelope": self.envelope.text,
            "envelope_digest": self.envelope.digest,
            "messages": self.messages,
            "usage": json.dumps(dict(self.usage)) if self.usage else None,
            "stream_sequences": [entry.sequence for entry in entries],
            "stream_types": [entry.type for entry in entries],
            "stream_rests": [_stream_rest(entry) for entry in entries],
        }


def _stream_rest(entry: NewStreamEntry) -> str:
    """An entry's stored payload without `prev` (the insert adds it)."""
    return json.dumps({"event": entry.event} if entry.type == "delta" else {"checkpoint_seq": entry.checkpoint_seq})


# --- rendering ---------------------------------------------------------------------------------------------------

_LIVE = ", ".join(f"'{status}'" for status in LIVE_ATTEMPT_STATUSES)

_FENCED_ROW = """
SELECT CAST(:checkpoint_id AS varchar(64)), f.workspace_id, f.thread_id, f.run_id, CAST(:seq AS integer), f.number,
       {format}, CAST(:base_id AS varchar(64)), CAST(:kept AS integer), CAST(:count AS integer),
       CAST(:envelope AS text), CAST(:envelope_digest AS varchar(64)), CAST(:messages AS text), {usage}, {now}
FROM (
    SELECT r.workspace_id, r.thread_id, r.id AS run_id, a.number, a.lease_expires_at
    FROM run_attempts a JOIN runs r ON r.id = a.run_id
    WHERE a.id = :attempt_id AND r.id = :run_id AND r.thread_id = :thread_id AND a.number = :attempt_number
      AND r.status = 'running' AND r.current_attempt_id = a.id AND a.status IN ({live})
      AND a.worker_id = :worker_id AND {token_check}
      AND (NOT EXISTS (
               SELECT 1 FROM inbox_entries e
               WHERE e.thread_id = :thread_id AND e.status = 'pending' AND e.delivery = 'steer')
           OR EXISTS (SELECT 1 FROM threads t WHERE t.id = :thread_id AND t.archived_at IS NOT NULL))
    {lock}
) AS f
WHERE f.lease_expires_at > {now}
"""
"""The checkpoint row, selected only while the fence predicate holds (§7.3, condition for condition with
`protocol.fencing.check_fence`) and no steer entry waits on a thread that is not archived (§7.8 step 6 is the
general path's; both lookups name the thread by parameter, so PostgreSQL runs each once, as an init plan). The
clock is compared above the locking subquery, whose `OFFSET 0` keeps PostgreSQL from pushing that condition down
into it: "now" is read once the attempt's row lock was granted (a commit that waited for it past the lease's expiry
writes nothing), as in every other fenced write.

Racing whatever ends the attempt (seal, recovery, the expiry sweep, handoff), which updates the attempt row in the
transaction that moves the run: on PostgreSQL the row is locked `FOR SHARE`, so the insert either commits first
(and the other transaction then sees the checkpoint) or waits and re-evaluates its `WHERE` on the row's new
version, which fails; on SQLite the single writer makes the read and the write one step."""

_COLUMNS = (
    "id, workspace_id, thread_id, run_id, seq, attempt, format, base_id, kept, count, envelope, envelope_digest, "
    "messages, usage, created_at"
)

_PG_STEP = """
WITH ckp AS (
    INSERT INTO checkpoints ({columns})
    {fenced_row}
    RETURNING workspace_id, thread_id, run_id, attempt
), ids AS (
    SELECT id, row_number() OVER (ORDER BY id) AS n
    FROM (SELECT nextval(pg_get_serial_sequence('stream_entries', 'id')) AS id
          FROM ckp, unnest(CAST(:stream_sequences AS integer[]))) AS allocated
), entries AS (
    SELECT ids.id, e.sequence, e.type, e.rest, lag(ids.id) OVER (ORDER BY e.n) AS prev_new
    FROM unnest(CAST(:stream_sequences AS integer[]), CAST(:stream_types AS text[]), CAST(:stream_rests AS text[]))
         WITH ORDINALITY AS e(sequence, type, rest, n)
    JOIN ids ON ids.n = e.n
), stream AS (
    INSERT INTO stream_entries (id, workspace_id, thread_id, run_id, attempt, sequence, type, payload, created_at)
    SELECT entries.id, ckp.workspace_id, ckp.thread_id, ckp.run_id, ckp.attempt, entries.sequence, entries.type,
           CAST(entries.rest AS jsonb) || jsonb_build_object(
               'prev', coalesce(entries.prev_new,
                                (SELECT max(s.id) FROM stream_entries s WHERE s.thread_id = :thread_id))),
           {now}
    FROM ckp, entries
)
SELECT count(*) AS written FROM ckp
"""
"""PostgreSQL: the checkpoint and the step's stream entries in one statement (its own implicit transaction, all or
nothing, S-37). The stream entries select from the inserted row, so without it none is written; their ids come
from the table's sequence in increasing order, each `prev` the id before it and the first one's the thread's last
entry, as `streams.insert_stream_entries` makes them (only the current attempt of a thread's one running run
writes its entries, and its writes are sequential). Stream ids are allocated over `unnest` of a parameter array,
not `generate_series`, so the generic plan's estimate stays small and PostgreSQL keeps the statement's generic plan."""

_SQLITE_STEP = "INSERT INTO checkpoints ({columns}){fenced_row}"
_SQLITE_STREAM = (
    "INSERT INTO stream_entries (workspace_id, thread_id, run_id, attempt, sequence, type, payload, created_at) "
    "SELECT c.workspace_id, c.thread_id, c.run_id, c.attempt, :sequence, :type, "
    "json_insert(:rest, '$.prev', (SELECT max(s.id) FROM stream_entries s WHERE s.thread_id = c.thread_id)), {now} "
    "FROM checkpoints c WHERE c.id = :checkpoint_id"
)

_PG_TOKEN_CHECK = "encode(sha256(convert_to(a.lease_token_hash || CAST(:nonce AS text), 'UTF8')), 'hex') = :blinded"
_NAMED = re.compile(r"(?<![:\w]):([a-z_]+)\b")


@cache
def render_postgresql() -> tuple[str, tuple[str, ...]]:
    """The step's PostgreSQL statement, with asyncpg's `$n` placeholders (a constant text, which asyncpg keeps
    prepared), and the parameter names in placeholder order."""
    now = now_sql("postgresql")
    fenced = _FENCED_ROW.format(
        format=CHECKPOINT_FORMAT,
        usage="CAST(:usage AS jsonb)",
        now=now,
        live=_LIVE,
        token_check=_PG_TOKEN_CHECK,
        lock="OFFSET 0 FOR SHARE OF a",
    )
    sql = _PG_STEP.format(columns=_COLUMNS, fenced_row=fenced.strip().replace("\n", "\n    "), now=now)
    return _positional(sql)


@cache
def render_sqlite() -> tuple[str, tuple[str, ...]]:
    """The step's SQLite statement, with sqlite3's `:name` placeholders, and its parameter names."""
    now = now_sql("sqlite")
    fenced = _FENCED_ROW.format(
        format=CHECKPOINT_FORMAT,
        usage=":usage",
        now=now,
        live=_LIVE,
        token_check=f"{SQLITE_BLIND_FUNCTION}(a.lease_token_hash || :nonce) = :blinded",
        lock="",
    )
    sql = _SQLITE_STEP.format(columns=_COLUMNS, fenced_row=fenced.rstrip())
    return sql, tuple(dict.fromkeys(_NAMED.findall(sql)))


RENDERERS: Final[Mapping[DialectName, Callable[[], tuple[str, tuple[str, ...]]]]] = {
    "postgresql": render_postgresql,
    "sqlite": render_sqlite,
}
"""One renderer per backend: the step's SQL text and its parameter names in the driver's order."""


@cache
def sqlite_stream_sql() -> str:
    return _SQLITE_STREAM.format(now=now_sql("sqlite"))


def _positional(sql: str) -> tuple[str, tuple[str, ...]]:
    """`:name` parameters as `$1 …` in order of first appearance, and those names."""
    names: dict[str, int] = {}

    def number(match: re.Match[str]) -> str:
        return f"${names.setdefault(match.group(1), len(names) + 1)}"

    return _NAMED.sub(number, sql), tuple(names)


# --- execution ---------------------------------------------------------------------------------------------------


async def commit_plain_step(engine: AsyncEngine, step: StepCommit) -> CheckpointWritten | None:
    """Commit `step` (§7.8 steps 1, 2, 5 and 7): the written checkpoint; None (nothing written) when a steer entry
    is pending on a thread that is not archived; raises `LeaseLost` when the fence fails or the seq was taken
    (S-38), `StoreUnavailable` when the database cannot serve it."""
    nonce = secrets.token_hex(16)
    parameters = step.parameters(nonce)
    failpoints.hit(failpoints.CHECKPOINT_BEFORE_COMMIT)  # a crash here leaves nothing, as one inside the commit
    inserted = await _COMMITTERS[dialect_name(engine)](engine, parameters, bool(step.stream_entries))
    if inserted:
        return step.written
    await diagnose(engine, step.lease)  # raises LeaseLost unless a steer entry is pending
    return None


async def _commit_postgresql(engine: AsyncEngine, parameters: Mapping[str, Any], _has_stream: bool) -> bool:
    """PostgreSQL, on the pooled connection's asyncpg connection: one statement, its own transaction."""
    sql, names = render_postgresql()
    try:
        async with pooled_asyncpg(engine) as pg:
            written = await pg.fetchval(sql, *(parameters[name] for name in names))
    except asyncpg.UniqueViolationError as error:
        raise LeaseLost("checkpoint_seq_changed") from error
    return bool(written)


async def _commit_sqlite(engine: AsyncEngine, parameters: Mapping[str, Any], has_stream: bool) -> bool:
    """SQLite, on the pooled aiosqlite connection through its public API: autocommit for the checkpoint alone,
    else `BEGIN IMMEDIATE` … `COMMIT` around it and the stream entries (rolled back on any error)."""
    sql, names = render_sqlite()
    values = {name: parameters[name] for name in names}
    stream_rows = [
        {"checkpoint_id": parameters["checkpoint_id"], "sequence": sequence, "type": kind, "rest": rest}
        for sequence, kind, rest in zip(
            parameters["stream_sequences"], parameters["stream_types"], parameters["stream_rests"], strict=True
        )
    ]
    with translate_errors():
        async with writer_turn(engine):
            pooled = await check_out(engine)
            aio: Any = pooled.driver_connection
            try:
                inserted = await _sqlite_writes(aio, sql, values, stream_rows if has_stream else None)
            except BaseException:
                # Also when cancelled: the call may still run in the connection's thread; the rollback queues behind
                # it, and the connection goes back to the pool only then.
                await asyncio.shield(_rollback_and_return(aio, pooled))
                raise
            await greenlet_spawn(pooled.close)
    return inserted


async def _sqlite_writes(
    aio: Any, sql: str, values: Mapping[str, Any], stream_rows: list[dict[str, Any]] | None
) -> bool:
    try:
        if stream_rows is not None:
            await aio.execute("BEGIN IMMEDIATE")
        cursor = await aio.execute(sql, values)
        inserted = bool(cursor.rowcount == 1)
        if stream_rows is not None:
            if inserted:
                await aio.executemany(sqlite_stream_sql(), stream_rows)
            await aio.execute("COMMIT" if inserted else "ROLLBACK")
    except sqlite3.IntegrityError as error:
        if "UNIQUE" in str(error):  # another commit took this seq (S-38)
            raise LeaseLost("checkpoint_seq_changed") from error
        raise
    except sqlite3.OperationalError as error:  # busy, locked, I/O: the database is not usable now
        raise StoreUnavailable(f"database unavailable: {type(error).__name__}") from error
    return inserted


async def _rollback_and_return(aio: Any, pooled: Any) -> None:
    try:
        if aio.in_transaction:
            await aio.execute("ROLLBACK")
    finally:
        await greenlet_spawn(pooled.close)


_COMMITTERS: Final[Mapping[DialectName, Callable[[AsyncEngine, Mapping[str, Any], bool], Awaitable[bool]]]] = {
    "postgresql": _commit_postgresql,
    "sqlite": _commit_sqlite,
}


async def diagnose(engine: AsyncEngine, lease: Lease) -> None:
    """Why a plain step inserted nothing, read under the ordinary fence (S-20): `LeaseLost` with the failed
    condition; None when the fence holds and a steer entry is pending (the general path assigns it); otherwise the
    lease expired between the two reads of the clock."""
    async with write_transaction(engine) as conn:
        fenced = await lock_fenced(conn, lease)
        e = inbox_entries.c
        steer = select(exists().where(e.thread_id == lease.thread_id, e.status == "pending", e.delivery == "steer"))
        pending = not fenced.thread_archived and bool(await conn.scalar(steer))
    if not pending:
        raise LeaseLost("lease_expired")
