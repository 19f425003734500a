"""How an attempt's work becomes durable: checkpoint commits (§7.8), seals (§7.10) and usage records.

Every write here but `record_usage` is fenced: it starts with `runs.lock_fenced()`, so nothing is written before
the fence passed, and a failed fence raises `LeaseLost` from an empty transaction (S-20). `seal_locked()` is the
seal itself, inside a transaction that already holds the locks (recovery.py uses it too).

Usage: every commit's checkpoint row (`checkpoints.usage`) and every `usage_records` row holds the usage an attempt
incurred *since its previous record* (a delta), so the sum of a run's deltas is what the run cost across all of
its attempts, lost leases included (S-51). A seal stores that sum as `runs.usage`.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any, Final, Literal

from pydantic import JsonValue, TypeAdapter
from pydantic_ai.usage import RunUsage
from sqlalchemy import (
    CompoundSelect,
    Exists,
    Select,
    Update,
    bindparam,
    case,
    exists,
    insert,
    select,
    union_all,
    update,
)
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from ... import failpoints
from ...errors import LeaseLost
from ...protocol.fencing import Lease
from ...protocol.inbox import SteerCandidate, select_steer_batch
from ...protocol.outcomes import CANCELLED_MESSAGE
from ...protocol.transitions import AttemptEnd, attempt_end
from ...runtime import Entropy
from ...settings import ServiceSettings
from ..checkpoints.incremental import EncodedEnvelope, EncodedMessage, checkpoint_writes
from ..db.engine import write_transaction
from ..db.statements import execute_together
from ..runs.claims import Fenced, lock_fenced
from ..runs.current_checkpoint import latest_checkpoint, materialize_current_checkpoint
from ..runs.outbox_staging import SealedRun, stage_seal_rows
from ..schema.dialect import db_now
from ..schema.tables import (
    LIVE_ATTEMPT_STATUSES,
    checkpoints,
    inbox_entries,
    run_attempts,
    runs,
    threads,
    usage_records,
)
from ..threads.interrupts import RUN_ENDED_MESSAGE
from ..threads.streams import NewStreamEntry, insert_stream_entries
from ..threads.submit import advance_thread
from .step_commit import StepCommit, commit_plain_step

__all__ = (
    "FAILURE_MESSAGES",
    "failure",
    "SealRequest",
    "AssignedEntry",
    "CommitResult",
    "insert_usage_record",
    "update_checkpoint_pointer",
    "consume_entries",
    "select_steer_candidates",
    "assign_entries",
    "select_entry_payloads",
    "finish_attempt",
    "seal_run_row",
    "update_thread_sealed",
    "release_entries",
    "bump_thread_version",
    "select_run_usage",
    "commit_checkpoint",
    "seal_locked",
    "seal_run",
    "record_usage",
    "advance_thread_after_seal",
    "sum_usage",
)

FAILURE_MESSAGES: Final[Mapping[str, str]] = {
    "lease_expired": "The attempt's lease expired before it finished.",
    "attempt_failed": "The attempt failed with a transient error.",
    "model_unavailable": "The model provider was unavailable.",
    "tool_unavailable": "A tool server the run needs was unavailable.",
    "authority_revoked": "The run's principal no longer holds the run permission.",
    "cancelled": CANCELLED_MESSAGE,
    "run_ended": RUN_ENDED_MESSAGE,
    "agent_unavailable": "The run's agent is unavailable.",
    "output_too_large": "The run's output is larger than worker.output_bytes.",
    "checkpoint_corrupt": "A checkpoint of the run failed its integrity check.",
    "checkpoint_envelope_too_large": "A checkpoint envelope is larger than worker.envelope_bytes.",
}
"""Default people-facing messages of the service's own failure codes (§12.3)."""

_usage_adapter: Final = TypeAdapter(RunUsage)


def failure(code: str, message: str | None = None) -> dict[str, str]:
    """A `failure` column value `{"code", "message"}` (§5.1)."""
    return {"code": code, "message": message or FAILURE_MESSAGES.get(code, "The run failed.")}


def sum_usage(records: Iterable[Mapping[str, Any] | None]) -> dict[str, Any]:
    """The sum of usage deltas (pydantic-ai `RunUsage` JSON) as `RunUsage` JSON."""
    total = RunUsage()
    for record in records:
        if record:
            total = total + _usage_adapter.validate_python(record)
    dumped: dict[str, Any] = _usage_adapter.dump_python(total, mode="json")
    return dumped


@dataclass(frozen=True, kw_only=True, slots=True)
class SealRequest:
    """How to seal a run (§7.10); the database's checks enforce the field combinations of S-4."""

    status: Literal["completed", "waiting", "failed", "cancelled"]
    output: JsonValue = None
    """The JSON output of a `completed` run."""
    pending: dict[str, Any] | None = None
    """`runs.pending` of a `waiting` run (§5.7)."""
    wait_reason: str | None = None
    failure: dict[str, str] | None = None
    """`{"code", "message"}` of a `failed` or `cancelled` run."""

    @property
    def attempt(self) -> AttemptEnd:
        """§5.3: how the attempt ends alongside this seal."""
        return attempt_end(self.status)


@dataclass(frozen=True, kw_only=True, slots=True)
class AssignedEntry:
    """A steer entry a commit assigned to the run; the worker passes it to `stream.steer(content, key=id)`."""

    id: str
    payload: dict[str, Any]


@dataclass(frozen=True, kw_only=True, slots=True)
class CommitResult:
    """What one checkpoint commit wrote."""

    checkpoint_id: str
    seq: int
    kept: int
    count: int
    bytes_written: int
    assigned: tuple[AssignedEntry, ...] = ()
    sealed: bool = False
    queued: bool = False
    """A `completed` seal left pending entries on the (not archived) thread: its next run is to be started (§8.5).
    Read in the sealing transaction, after the seal returned the run's unconsumed entries: a post that commits
    later finds the thread idle and starts its own run, so a False here needs no thread lock to be sure."""


# --- statements --------------------------------------------------------------------------------------------------


def insert_usage_record(
    *, run_id: str, attempt_id: str | None, checkpoint_seq: int | None, usage: Mapping[str, Any]
) -> Any:
    workspace = select(runs.c.workspace_id).where(runs.c.id == run_id).scalar_subquery()
    return insert(usage_records).values(
        workspace_id=workspace,
        run_id=run_id,
        attempt_id=attempt_id,
        checkpoint_seq=checkpoint_seq,
        usage=dict(usage),
        created_at=db_now(),
    )


@cache
def update_checkpoint_pointer() -> Update:
    """§7.8 step 3; returns `pending_steer`, whether step 6 has candidates, to save the commit a round trip.

    Binds the `ckp_run_id`, `ckp_thread_id`, `ckp_id` and `ckp_seq` of `checkpoint_writes()`. The commit holds the
    thread lock by then, and every inbox change moves the thread's version (S-75), so no steer entry can become
    pending between this statement and the end of the commit.
    """
    moved = (
        update(runs)
        .where(runs.c.id == bindparam("ckp_run_id"))
        .values(checkpoint_id=bindparam("ckp_id"), checkpoint_seq=bindparam("ckp_seq"))
    )
    return moved.returning(steer_pending(bindparam("ckp_thread_id")).label("pending_steer"))


def consume_entries(*, run_id: str, entry_ids: Sequence[str], seq: int, now: float) -> Update:
    """§7.8 step 4, S-76: assigned entries of the run become `consumed` at this checkpoint's seq."""
    e = inbox_entries.c
    return (
        update(inbox_entries)
        .where(e.id.in_(list(entry_ids)), e.assigned_run_id == run_id, e.status == "assigned")
        .values(status="consumed", incorporated_checkpoint_seq=seq, finished_at=now)
    )


def steer_pending(thread_id: Any) -> Exists:
    """Whether the thread has a pending steer entry (the condition of `select_steer_candidates`)."""
    e = inbox_entries.c
    return exists().where(e.thread_id == thread_id, e.status == "pending", e.delivery == "steer")


def select_steer_candidates(thread_id: str) -> Select[Any]:
    """§7.8 step 6: the thread's pending steer entries, in position order (bounded by `control.inbox_count`)."""
    e = inbox_entries.c
    return (
        select(e.id, e.position, e.size, e.agent, e.options_digest)
        .where(e.thread_id == thread_id, e.status == "pending", e.delivery == "steer")
        .order_by(e.position)
    )


def assign_entries(*, run_id: str, entry_ids: Sequence[str]) -> Update:
    e = inbox_entries.c
    return (
        update(inbox_entries)
        .where(e.id.in_(list(entry_ids)), e.status == "pending")
        .values(status="assigned", assigned_run_id=run_id)
    )


def select_entry_payloads(entry_ids: Sequence[str]) -> Select[Any]:
    e = inbox_entries.c
    return select(e.id, e.payload).where(e.id.in_(list(entry_ids))).order_by(e.position)


def finish_attempt(
    *, attempt_id: str, end: AttemptEnd, attempt_failure: Mapping[str, str] | None, now: float
) -> Update:
    """§5.3: a live attempt becomes finished (immutable afterwards, S-8)."""
    a = run_attempts.c
    return (
        update(run_attempts)
        .where(a.id == attempt_id, a.status.in_(LIVE_ATTEMPT_STATUSES))
        .values(
            status=end.status, yield_reason=end.yield_reason, failure=attempt_failure, finished_at=now, updated_at=now
        )
    )


def seal_run_row(*, run_id: str, request: SealRequest, usage: Mapping[str, Any], now: float) -> Update:
    """§7.10: status, `sealed_at`, output, pending/wait_reason, failure, usage, `current_attempt_id = NULL`."""
    return (
        update(runs)
        .where(runs.c.id == run_id, runs.c.status == "running")
        .values(
            status=request.status,
            sealed_at=now,
            output=request.output,
            pending=request.pending,
            wait_reason=request.wait_reason,
            failure=request.failure,
            usage=dict(usage),
            current_attempt_id=None,
            version=runs.c.version + 1,
        )
    )


def update_thread_sealed(*, thread_id: str, run_id: str, now: float) -> Update:
    """§7.10: `current_run_id = NULL` (if it names the run), `last_run_id = run`; the thread's version moves."""
    t = threads.c
    return (
        update(threads)
        .where(t.id == thread_id)
        .values(
            current_run_id=case((t.current_run_id == run_id, None), else_=t.current_run_id),
            last_run_id=run_id,
            version=t.version + 1,
            updated_at=now,
        )
    )


def release_entries(*, run_id: str, status: Literal["pending", "withdrawn", "failed"], now: float) -> Update:
    """S-71: entries assigned to the run but not consumed go back to `pending`, or end `withdrawn` / `failed`."""
    e = inbox_entries.c
    values: dict[str, Any] = {"status": status}
    if status == "pending":
        values["assigned_run_id"] = None
    else:
        values["finished_at"] = now
    if status == "failed":
        values["failure"] = failure("run_ended")
    return update(inbox_entries).where(e.assigned_run_id == run_id, e.status == "assigned").values(**values)


def bump_thread_version(*, thread_id: str, now: float) -> Update:
    """S-75: any inbox change increments the thread's version."""
    return update(threads).where(threads.c.id == thread_id).values(version=threads.c.version + 1, updated_at=now)


def select_run_usage(run_id: str) -> CompoundSelect[Any]:
    """Every usage delta of the run: its commits' (on their checkpoint rows) and its `usage_records` (usage written
    without a commit: seals, recoveries, lost leases, and commits from before migration 0007)."""
    on_checkpoints = select(checkpoints.c.usage).where(checkpoints.c.run_id == run_id, checkpoints.c.usage.is_not(None))
    return union_all(on_checkpoints, select(usage_records.c.usage).where(usage_records.c.run_id == run_id))


# --- operations --------------------------------------------------------------------------------------------------


async def commit_checkpoint(
    engine: AsyncEngine,
    lease: Lease,
    *,
    expected_seq: int,
    base_id: str | None,
    base_encoded: Sequence[EncodedMessage],
    new_encoded: Sequence[EncodedMessage],
    envelope: EncodedEnvelope,
    incorporated_keys: Sequence[str] = (),
    source_entry_consumed: bool = False,
    usage: Mapping[str, Any] | None = None,
    seal: SealRequest | None = None,
    delivery_count: int = 8,
    delivery_bytes: int = 256 * 1024,
    stream_entries: Sequence[NewStreamEntry] = (),
    boundary_sequence: int | None = None,
) -> CommitResult:
    """§7.8 steps 1–6 in one fenced transaction (S-35…S-41, S-5); nothing is visible if it rolls back (S-37).

    Raises `LeaseLost` when the fence fails or the run's latest committed seq is not `expected_seq` (S-38). A plain
    step (no entry incorporated, no seal, no steer entry pending) is one fenced INSERT (step_commit.py); the others
    lock, check and write here, moving `runs.checkpoint_id`/`checkpoint_seq` too. `seal` (status
    `completed` or `waiting`) seals the run in the same transaction; otherwise compatible pending steer entries are
    assigned to the run and returned (S-66, S-67). `boundary_sequence` (the attempt's next stream sequence) writes
    §7.8 step 7's `boundary` stream entry in the same transaction, so the final, sealing commit has one too;
    `stream_entries` (the attempt's buffered `delta` entries, §8.7) are inserted just before it, so a step costs
    no stream write of its own.
    """
    if seal is not None and seal.status not in ("completed", "waiting"):
        raise ValueError("a checkpoint commit seals only completed or waiting runs")
    entries = list(stream_entries)
    if boundary_sequence is not None:
        entries.append(NewStreamEntry(type="boundary", sequence=boundary_sequence, checkpoint_seq=expected_seq + 1))
    if seal is None and not incorporated_keys and not source_entry_consumed:
        # A plain step: one fenced INSERT (step_commit.py); None when a steer entry is pending, which only the path
        # below assigns.
        step = StepCommit.of(
            lease,
            expected_seq=expected_seq,
            base_id=base_id,
            base_encoded=base_encoded,
            new_encoded=new_encoded,
            envelope=envelope,
            usage=usage,
            stream_entries=entries,
        )
        committed = await commit_plain_step(engine, step)
        if committed is not None:
            return CommitResult(
                checkpoint_id=committed.id,
                seq=step.seq,
                kept=committed.kept,
                count=committed.count,
                bytes_written=committed.bytes_written,
            )
    async with write_transaction(engine) as conn:
        fenced = await lock_fenced(conn, lease)
        run = fenced.run
        latest = await latest_checkpoint(conn, lease.run_id)  # plain steps do not move `runs.checkpoint_seq`
        if max(run.checkpoint_seq, latest[1] if latest else 0) != expected_seq:
            raise LeaseLost("checkpoint_seq_changed")
        seq = expected_seq + 1
        writes, params, written = checkpoint_writes(
            thread_id=lease.thread_id,
            run_id=lease.run_id,
            seq=seq,
            attempt=lease.attempt_number,
            base_id=base_id,
            base_encoded=base_encoded,
            new_encoded=new_encoded,
            envelope=envelope,
            usage=usage,
        )
        # Steps 2, 3 and 5 in one round trip on PostgreSQL: these writes do not read each other's rows.
        (moved,) = await execute_together(conn, writes, update_checkpoint_pointer(), params)
        pending_steer = bool(moved["pending_steer"])
        consumed = list(incorporated_keys)
        if source_entry_consumed and run.source_entry_id is not None:
            consumed.append(run.source_entry_id)
        inbox_changed = False
        if consumed:
            statement = consume_entries(run_id=lease.run_id, entry_ids=consumed, seq=seq, now=fenced.now)
            result = await conn.execute(statement)
            inbox_changed = result.rowcount > 0
        assigned: tuple[AssignedEntry, ...] = ()
        queued = False
        if seal is not None:
            await seal_locked(conn, fenced, lease.attempt_id, seal)
            if seal.status == "completed" and not fenced.thread_archived:
                queued = bool((await conn.execute(select(_has_pending_entry(lease.thread_id)))).scalar())
        else:
            if pending_steer:
                assigned = await _assign_steer_batch(
                    conn, fenced, delivery_count=delivery_count, delivery_bytes=delivery_bytes
                )
            if inbox_changed or assigned:
                await conn.execute(bump_thread_version(thread_id=lease.thread_id, now=fenced.now))
        if entries:
            await insert_stream_entries(conn, fenced, lease, entries)
        failpoints.hit(failpoints.CHECKPOINT_BEFORE_COMMIT)
    return CommitResult(
        checkpoint_id=written.id,
        seq=seq,
        kept=written.kept,
        count=written.count,
        bytes_written=written.bytes_written,
        assigned=assigned,
        sealed=seal is not None,
        queued=queued,
    )


def _has_pending_entry(thread_id: str) -> Exists:
    e = inbox_entries.c
    return exists().where(e.thread_id == thread_id, e.status == "pending")


async def _assign_steer_batch(
    conn: AsyncConnection, fenced: Fenced, *, delivery_count: int, delivery_bytes: int
) -> tuple[AssignedEntry, ...]:
    if fenced.thread_archived:
        return ()
    run = fenced.run
    rows = (await conn.execute(select_steer_candidates(run.thread_id))).all()
    if not rows:
        return ()
    batch = select_steer_batch(
        (
            SteerCandidate(
                entry_id=r.id, position=r.position, size=r.size, agent=r.agent, options_digest=r.options_digest
            )
            for r in rows
        ),
        run_agent=run.agent,
        run_options_digest=run.options_digest,
        delivery_count=delivery_count,
        delivery_bytes=delivery_bytes,
    )
    if not batch.entry_ids:
        return ()
    await conn.execute(assign_entries(run_id=run.id, entry_ids=batch.entry_ids))
    payloads = (await conn.execute(select_entry_payloads(batch.entry_ids))).all()
    return tuple(AssignedEntry(id=row.id, payload=dict(row.payload or {})) for row in payloads)


async def seal_locked(
    conn: AsyncConnection,
    fenced: Fenced,
    attempt_id: str,
    request: SealRequest,
    *,
    end: AttemptEnd | None = None,
    attempt_failure: Mapping[str, str] | None = None,
) -> None:
    """§7.10 inside a fenced transaction: attempt, run, thread pointers, entries (S-71)."""
    run_id, thread_id, now = fenced.run.id, fenced.run.thread_id, fenced.now
    # S-48: a failed or cancelled seal keeps the last commit
    fenced = await materialize_current_checkpoint(conn, fenced)
    if attempt_failure is None and request.status in ("failed", "cancelled"):
        attempt_failure = request.failure
    end = end or request.attempt
    await conn.execute(finish_attempt(attempt_id=attempt_id, end=end, attempt_failure=attempt_failure, now=now))
    usage = sum_usage(row.usage for row in (await conn.execute(select_run_usage(run_id))).all())
    await conn.execute(seal_run_row(run_id=run_id, request=request, usage=usage, now=now))
    await conn.execute(update_thread_sealed(thread_id=thread_id, run_id=run_id, now=now))
    if request.status in ("completed", "waiting"):
        released: Literal["pending", "withdrawn", "failed"] = "withdrawn" if fenced.thread_archived else "pending"
    else:
        released = "failed"
    await conn.execute(release_entries(run_id=run_id, status=released, now=now))
    # §7.10, S-106, S-118: run.<status> and run_attempt.<status> webhooks, the `checkpoint_cleanup` row and, on a
    # child thread and a status other than waiting, the `child_result` row (dedupe key = run id for both).
    await stage_seal_rows(conn, run_id=run_id, attempt_id=attempt_id, sealed=_sealed_run(fenced, request, end))


def _sealed_run(fenced: Fenced, request: SealRequest, end: AttemptEnd) -> SealedRun | None:
    """The sealed run as the writes above left it, when the fence read all of it (`lock_fenced`): under the fence
    the run was `running` and the attempt live, so both updates applied."""
    if fenced.thread_origin is None:
        return None  # fenced by the expiry sweep (`lock_for_expiry`), which reads less
    return SealedRun(
        workspace_id=fenced.run.workspace_id,
        thread_id=fenced.run.thread_id,
        status=request.status,
        failure=request.failure,
        wait_reason=request.wait_reason,
        attempt_status=end.status,
        thread_origin=fenced.thread_origin.origin,
        origin_thread_id=fenced.thread_origin.origin_thread_id,
        workspace_has_subscriptions=fenced.workspace_has_subscriptions,
    )


async def seal_run(
    engine: AsyncEngine,
    lease: Lease,
    request: SealRequest,
    *,
    usage: Mapping[str, Any] | None = None,
) -> None:
    """§7.10 without a final commit (a `failed` or `cancelled` seal, S-48): fenced; raises `LeaseLost`.

    `usage` (the attempt's unrecorded usage delta) is recorded in the same transaction.
    """
    async with write_transaction(engine) as conn:
        fenced = await lock_fenced(conn, lease)
        fenced = await materialize_current_checkpoint(conn, fenced)
        if usage:
            await conn.execute(
                insert_usage_record(
                    run_id=lease.run_id,
                    attempt_id=lease.attempt_id,
                    checkpoint_seq=fenced.run.checkpoint_seq,
                    usage=usage,
                )
            )
        await seal_locked(conn, fenced, lease.attempt_id, request)


async def record_usage(
    engine: AsyncEngine,
    *,
    run_id: str,
    attempt_id: str | None,
    usage: Mapping[str, Any],
    checkpoint_seq: int | None = None,
) -> None:
    """S-51: record usage an attempt incurred without the fence (after `LeaseLost` or a deadline cancellation)."""
    async with write_transaction(engine) as conn:
        await conn.execute(
            insert_usage_record(run_id=run_id, attempt_id=attempt_id, checkpoint_seq=checkpoint_seq, usage=usage)
        )


async def advance_thread_after_seal(
    engine: AsyncEngine,
    *,
    thread_id: str,
    settings: ServiceSettings,
    agent_names: Collection[str],
    entropy: Entropy | None = None,
) -> str | None:
    """§7.8: after a `completed`/`waiting` seal, start the thread's next queued run (§8.5) in its own transaction.

    Returns the started run's id, or None when the thread has nothing to start.
    """
    async with write_transaction(engine) as conn:
        return await advance_thread(
            conn, thread_id=thread_id, settings=settings, agent_names=agent_names, entropy=entropy, alone=True
        )
