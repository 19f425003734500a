"""The checkpoint commit of a step (§7.8) on PostgreSQL, straight on asyncpg: one statement, one round trip.

A durable step is two fenced commits; through SQLAlchemy each cost BEGIN, the fence, the combined writes, the
stream entries (one or two statements) and COMMIT, each a round trip plus SQLAlchemy's execution context: about
half of the worker's CPU per step (issue 12, docs/worker-cost.md). Here the whole commit is ONE statement, its own
implicit transaction (all or nothing, S-37), on the pooled connection's asyncpg connection, which keeps it
prepared:

1. `fence` is `runs.fence_rows()` (thread → run → attempt locked in that order, as every fenced write); `checked`
   reads the clock once the locks were granted;
2. `gate` has its one row exactly when the §7.3 fence predicate holds (condition for condition with
   `protocol.fencing.check_fence`; the token hash compared blinded, see `_STEP_SQL`), `checkpoint_seq` is the one
   this attempt last committed (S-38) and no steer entry is pending;
3. every write (checkpoint row, new message rows, usage record, the stream entries with their ids and `prev`
   chain as `streams.insert_stream_entries` makes them, run pointer) selects from `gate`: without its row nothing
   is written (S-20).

The statement is planned once per connection: after PostgreSQL's five trial custom plans it runs on its generic
plan, which it only picks while that plan's estimate is no dearer than a custom one's. Nothing in it may make the
generic estimate balloon: stream ids are allocated over `unnest` of a parameter array (estimated at 10 rows), not
`generate_series` over its cardinality (1,000 rows), which kept PostgreSQL re-planning at every commit (about 1 ms
of server CPU each, issue 12; `test_postgresql_plans_the_step_statement_once_per_connection`).

When nothing was written, `runs.fenced_from_row` over the returned row (the check every other fenced write makes)
names the `LeaseLost` reason; a pending steer entry returns None and the caller commits through the general path,
which assigns it (§7.8 step 6). It handles the usual boundary and a run's first one, which consumes the run's
source entry; not a seal, and not a commit that incorporates steer entries (`seals.commit_checkpoint` decides that
up front). One difference from a multi-statement transaction: the
statement's snapshot is taken before it waits for its locks, so a steer entry committed while this commit waited
for the thread lock is assigned by the attempt's next commit rather than this one (entries are assigned at "one of
its next commits", S-66; the final commit always takes the general path). Driver errors that mean "unavailable"
become `StoreUnavailable` as `engine.translate_errors` does for SQLAlchemy's; a connection left inside a
transaction (it cannot be here, but a cancelled call must never hand one back to the pool) is terminated.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

from sqlalchemy.engine import Dialect
from sqlalchemy.ext.asyncio import AsyncEngine

from .. import failpoints
from ..errors import LeaseLost
from ..protocol.fencing import Lease, hash_lease_token
from .checkpoints import CheckpointWritten, EncodedEnvelope, EncodedMessage, kept_count, new_checkpoint_id
from .dialect import now_sql
from .pg_driver import pooled_asyncpg
from .runs import fence_rows, fenced_from_row
from .streams import NewStreamEntry
from .tables import CHECKPOINT_FORMAT, LIVE_ATTEMPT_STATUSES

__all__ = ("StepCommit", "commit_step", "step_statement")


@dataclass(frozen=True, kw_only=True, slots=True)
class StepCommit:
    """What `commit_step` wrote."""

    written: CheckpointWritten
    seq: int


_NOW = now_sql("postgresql")
_LIVE = ", ".join(f"'{status}'" for status in LIVE_ATTEMPT_STATUSES)

_STEP_SQL = f"""
WITH fence AS MATERIALIZED (
    {{fence}}
), checked AS MATERIALIZED (
    SELECT fence.*, {_NOW} AS now FROM fence
), gate AS MATERIALIZED (
    SELECT c.workspace_id FROM checked c
    WHERE c.status = 'running' AND c.current_attempt_id = {{attempt}} AND c.attempt_status IN ({_LIVE})
      AND c.attempt_worker_id = $20::varchar
      AND sha256(convert_to(c.attempt_lease_token_hash || $21::text, 'UTF8')) = $22::bytea
      AND c.attempt_lease_expires_at > c.now AND c.checkpoint_seq = $19::integer
      AND (c.thread_archived_at IS NOT NULL OR NOT EXISTS (
          SELECT 1 FROM inbox_entries e
          WHERE e.thread_id = {{thread}} AND e.status = 'pending' AND e.delivery = 'steer'))
), ckp AS (
    INSERT INTO checkpoints (id, workspace_id, thread_id, run_id, seq, attempt, format, base_id, kept, count,
                             envelope, envelope_digest, created_at)
    SELECT $4::varchar, t.workspace_id, {{thread}}, {{run}}, $5::integer, $6::integer, {CHECKPOINT_FORMAT},
           $7::varchar, $8::integer, $9::integer, $10::text, $11::varchar, {_NOW}
    FROM threads t, gate WHERE t.id = {{thread}}
), msgs AS (
    INSERT INTO checkpoint_messages (checkpoint_id, "index", body, digest)
    SELECT $4::varchar, m.i, m.b, m.d FROM gate, unnest($12::integer[], $13::text[], $14::text[]) AS m(i, b, d)
), use_record AS (
    INSERT INTO usage_records (workspace_id, run_id, attempt_id, checkpoint_seq, usage, created_at)
    SELECT gate.workspace_id, {{run}}, {{attempt}}, $5::integer, CAST($15::text AS jsonb), {_NOW}
    FROM gate WHERE $15::text IS NOT NULL
), ids AS (
    SELECT id, row_number() OVER (ORDER BY id) AS n
    FROM (SELECT nextval(pg_get_serial_sequence('stream_entries', 'id')) AS id
          FROM gate, unnest($16::integer[])) AS allocated
), entries AS (
    SELECT ids.id, e.sequence, e.type, e.rest, lag(ids.id) OVER (ORDER BY e.n) AS prev_new
    FROM unnest($16::integer[], $17::text[], $18::text[]) WITH ORDINALITY AS e(sequence, type, rest, n)
    JOIN ids ON ids.n = e.n
), stream AS (
    INSERT INTO stream_entries (id, workspace_id, thread_id, run_id, attempt, sequence, type, payload, created_at)
    SELECT entries.id, gate.workspace_id, {{thread}}, {{run}}, $6::integer, entries.sequence, entries.type,
           CAST(entries.rest AS jsonb) || jsonb_build_object(
               'prev', coalesce(entries.prev_new,
                                (SELECT max(s.id) FROM stream_entries s WHERE s.thread_id = {{thread}}))),
           {_NOW}
    FROM gate, entries
), moved AS (
    UPDATE runs SET checkpoint_id = $4::varchar, checkpoint_seq = $5::integer
    WHERE id = {{run}} AND EXISTS (SELECT 1 FROM gate)
    RETURNING id
), consumed AS (
    UPDATE inbox_entries SET status = 'consumed', incorporated_checkpoint_seq = $5::integer, finished_at = {_NOW}
    WHERE $23::boolean AND id = (SELECT source_entry_id FROM checked) AND assigned_run_id = {{run}}
      AND status = 'assigned' AND EXISTS (SELECT 1 FROM gate)
    RETURNING id
), bumped AS (
    UPDATE threads SET version = version + 1, updated_at = {_NOW}
    WHERE id = {{thread}} AND EXISTS (SELECT 1 FROM consumed)
    RETURNING id
)
SELECT checked.*, EXISTS (SELECT 1 FROM gate) AS written, EXISTS (
    SELECT 1 FROM inbox_entries e WHERE e.thread_id = {{thread}} AND e.status = 'pending' AND e.delivery = 'steer'
) AS pending_steer
FROM checked
"""
"""One statement, one implicit transaction. `fence` is `runs.fence_rows()` (thread → run → attempt locked in that
order; its parameters are the thread, run and attempt ids), `checked` adds the clock read once the locks were
granted, `gate` has its one row exactly when the fence predicate of §7.3 holds (`protocol.fencing.check_fence`,
condition for condition; the token hash is compared blinded: SHA-256 of the stored hash and a fresh nonce against
the same of the expected one, so the comparison's timing says nothing about the stored value), the run's
`checkpoint_seq` is the one this attempt last committed (S-38) and no steer entry waits. Every write selects from
`gate`: without its row nothing is written. Other parameters: 4 checkpoint id, 5 seq, 6 attempt number, 7 base
id, 8 kept, 9 count, 10 envelope, 11 envelope digest, 12–14 the new message rows (index, body, digest), 15 usage
JSON (null: no usage record), 16–18 the stream entries (sequence, type, JSON payload without `prev`), 19 the
expected `checkpoint_seq`, 20 worker id, 21 nonce, 22 blinded hash, 23 whether this commit consumes the run's
source entry (a run's first commit, §7.8 step 4: `consumed` marks it consumed at this seq and `bumped` then
increments the thread's version, S-75, as `seals.consume_entries` and `bump_thread_version` do). The stream ids
come from the table's sequence in increasing order, matched to the entries in order, each `prev` the id before it
and the first one's the thread's last entry, as `streams.insert_stream_entries` makes them (no other writer can add
entries to the thread while this attempt's lease holds: every stream write is fenced)."""


@cache
def step_statement(dialect: Dialect) -> str:
    """The step commit's SQL, with the fence compiled in: one constant text, which asyncpg keeps prepared."""
    compiled = fence_rows().compile(dialect=dialect)
    names = tuple(compiled.positiontup or ())
    if names != ("thread_id", "run_id", "attempt_id"):
        raise AssertionError(f"unexpected fence parameters {names}")
    fence = compiled.string.replace("\n", "\n    ")
    return _STEP_SQL.format(fence=fence, thread="$1::varchar", run="$2::varchar", attempt="$3::varchar")


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
    consume_source: bool = False,
) -> StepCommit | None:
    """§7.8 steps 1–5, 7 in one statement (its own transaction); raises `LeaseLost` when the fence or the
    compare-and-swap fails; None (nothing written) when a steer entry is pending and the thread is not archived:
    step 6 is the general path's."""
    if base_id is None and base_encoded:
        raise ValueError("base_encoded must be empty when there is no base checkpoint")
    checkpoint_id = new_checkpoint_id()
    seq = expected_seq + 1
    kept = kept_count(base_encoded, new_encoded)
    fresh = new_encoded[kept:]
    written = len(envelope.text) + len(envelope.digest) + sum(len(m.body) + len(m.digest) for m in fresh)
    entries = _StreamEntryRows(stream_entries)
    nonce = secrets.token_hex(16)
    blinded = hashlib.sha256((hash_lease_token(lease.token) + nonce).encode()).digest()
    failpoints.hit(failpoints.CHECKPOINT_BEFORE_COMMIT)  # a crash here leaves nothing, as one inside the transaction
    async with pooled_asyncpg(engine) as pg:
        row = await pg.fetchrow(
            step_statement(engine.dialect),
            lease.thread_id, lease.run_id, lease.attempt_id, checkpoint_id, seq, lease.attempt_number,
            base_id, kept, len(new_encoded), envelope.text, envelope.digest,
            list(range(kept, len(new_encoded))), [m.body for m in fresh], [m.digest for m in fresh],
            json.dumps(dict(usage)) if usage else None,
            entries.sequences, entries.types, entries.rests,
            expected_seq, lease.worker_id, nonce, blinded, consume_source,
        )  # fmt: skip
    if row is not None and row["written"]:
        return StepCommit(
            written=CheckpointWritten(id=checkpoint_id, kept=kept, count=len(new_encoded), bytes_written=written),
            seq=seq,
        )
    fenced = fenced_from_row(row, lease)  # nothing was written: say why (the fence, in its own order of checks)
    if fenced.run["checkpoint_seq"] != expected_seq:
        raise LeaseLost("checkpoint_seq_changed")
    if row is not None and row["pending_steer"] and not fenced.thread_archived:
        return None
    raise LeaseLost("lease_expired")  # the database clock passed the expiry between the two comparisons
