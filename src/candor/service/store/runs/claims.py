"""Runs and attempts under leases: claims (§7.2), the fence (§7.3) and the attempt start (S-16).

Every execution-dependent write locks thread → run → attempt, reads "now" from the database clock after the locks,
and asks `protocol.fencing.check_fence` before writing anything (S-20, S-21, S-22); `lock_fenced()` is that
preamble, and `seals.py` and `recovery.py` start every commit, seal and recovery with it. Locks are
`FOR NO KEY UPDATE` on PostgreSQL (they still exclude every other writer of the row, but let inserts that merely
reference it through a foreign key go on) and nothing on SQLite, where `BEGIN IMMEDIATE` already serializes
writers (§2.2); SQLAlchemy renders no locking clause for SQLite, so no statement here branches on the dialect.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from functools import cache
from typing import Any

from sqlalchemy import Select, Update, bindparam, func, insert, or_, select, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from ...errors import LeaseLost
from ...protocol.claiming import PreviousAttempt, StartReason, plan_claim
from ...protocol.fencing import (
    FenceSnapshot,
    Lease,
    check_fence,
    hash_lease_token,
    is_expired_for_recovery,
    new_lease_token,
)
from ...protocol.new_run import RunLineage, RunTrigger
from ...protocol.resume import ResumeAnswers, parse_stored_resume
from ...protocol.tool_recovery import ToolRecovery
from ...protocol.transitions import RunStatus
from ..db.engine import nothing_to_commit, write_transaction
from ..schema.dialect import db_now
from ..schema.tables import CHECKPOINT_FORMAT, checkpoints, run_attempts, runs, threads
from .outbox_staging import stage_run_transition, workspace_has_subscriptions


def _build() -> str:
    """What this process runs, recorded on every attempt it claims (`worker_build`, §5.1) for incident forensics."""

    def version(package: str) -> str:
        try:
            return importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            return "unknown"

    return f"candor/{version('candor')} pydantic-ai-slim/{version('pydantic-ai-slim')}"


WORKER_BUILD = _build()

__all__ = (
    "SUPPORTED_CHECKPOINT_FORMATS",
    "ClaimedRun",
    "Fenced",
    "FencedRun",
    "ThreadOrigin",
    "to_datetime",
    "select_now",
    "select_claimable",
    "select_previous_attempt",
    "insert_attempt",
    "update_run_claimed",
    "lock_thread",
    "lock_run",
    "lock_attempt",
    "lock_fenced_rows",
    "update_attempt_started",
    "claim_runs",
    "read_now",
    "lock_fenced",
    "fenced_from_row",
    "lock_for_expiry",
    "start_attempt",
)

SUPPORTED_CHECKPOINT_FORMATS: frozenset[int] = frozenset({CHECKPOINT_FORMAT})
"""Checkpoint formats this build reads (S-17: runs whose latest or start checkpoint has another format are skipped)."""

_FENCE_RUN_COLUMNS = (
    runs.c.id,
    runs.c.workspace_id,
    runs.c.thread_id,
    runs.c.status,
    runs.c.current_attempt_id,
    runs.c.checkpoint_id,
    runs.c.checkpoint_seq,
    runs.c.source_entry_id,
    runs.c.agent,
    runs.c.options_digest,
    runs.c.attempts,
    runs.c.max_attempts,
    runs.c.cancel_requested_at,
)
_FENCE_ATTEMPT_COLUMNS = (
    run_attempts.c.id,
    run_attempts.c.run_id,
    run_attempts.c.number,
    run_attempts.c.status,
    run_attempts.c.worker_id,
    run_attempts.c.lease_token_hash,
    run_attempts.c.lease_expires_at,
)
_ATTEMPT_PREFIX = "attempt_"
_CLAIM_RUN_COLUMNS = (
    *_FENCE_RUN_COLUMNS,
    runs.c.principal_id,
    runs.c.options,
    runs.c.tool_recovery,
    runs.c.resume,
    runs.c.trigger,
    runs.c.lineage,
    runs.c.parent_run_id,
    runs.c.start_checkpoint_id,
    runs.c.available_at,
    runs.c.created_at,
    runs.c.trace_context,
)


@dataclass(frozen=True, kw_only=True, slots=True)
class ClaimedRun:
    """One run a claim handed to this worker, with everything its attempt needs to start (§7.2, §7.7)."""

    lease: Lease
    start_reason: StartReason
    workspace_id: str
    agent: str
    principal_id: str
    options: dict[str, Any]
    options_digest: str
    tool_recovery: ToolRecovery
    """The run's `tool_recovery` mode, fixed at acceptance; the attempt hands it to the harness (which refuses
    any other value)."""
    source_entry_id: str | None
    resume: ResumeAnswers | None
    """The answers of a resume successor (§8.6), parsed once at the claim; None for every other run."""
    resume_problem: str | None
    """Why a resume successor's stored answers did not parse (corrupt data; its attempt fails), else None."""
    trigger: RunTrigger
    lineage: RunLineage
    parent_run_id: str | None
    checkpoint_id: str | None
    checkpoint_seq: int
    start_checkpoint_id: str | None
    cancel_requested: bool
    queue_wait_ms: int
    """Milliseconds between `available_at` and the claim ("Attempt claimed", §7.2)."""
    created_at: float = 0.0
    """When the run was accepted (epoch seconds): where its run span starts (docs/telemetry.md)."""
    trace_context: str | None = None
    """The `traceparent` the run was created in; its attempts are traced under it (docs/telemetry.md)."""


@dataclass(frozen=True, slots=True)
class ThreadOrigin:
    """`threads.origin` and `origin_thread_id` (the parent thread of a child, §7.13)."""

    origin: str
    origin_thread_id: str | None


@dataclass(frozen=True, kw_only=True, slots=True)
class FencedRun:
    """The run's `_FENCE_RUN_COLUMNS`, as a fenced write read them under lock."""

    id: str
    workspace_id: str
    thread_id: str
    status: RunStatus
    current_attempt_id: str | None
    checkpoint_id: str | None
    checkpoint_seq: int
    source_entry_id: str | None
    agent: str
    options_digest: str
    attempts: int
    max_attempts: int
    cancel_requested_at: float | None

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> FencedRun:
        """From a row holding the `_FENCE_RUN_COLUMNS` under their own names."""
        return cls(**{column.name: row[column.name] for column in _FENCE_RUN_COLUMNS})


@dataclass(frozen=True, kw_only=True, slots=True)
class Fenced:
    """What a fenced write read under lock: the database clock, the run, and whether the thread is archived."""

    now: float
    """Database clock, epoch seconds, read after the locks were taken."""
    run: FencedRun
    thread_archived: bool
    thread_origin: ThreadOrigin | None = None
    """The thread's origin, when the fence read it (`lock_fenced`): a seal stages a child's result from it."""
    workspace_has_subscriptions: bool | None = None
    """Whether the workspace has an enabled subscription, when the fence read it (`lock_fenced`); None: unknown."""

    def with_checkpoint(self, checkpoint_id: str, seq: int) -> Fenced:
        """The same read with the run's checkpoint columns as `materialize_current_checkpoint` wrote them."""
        return replace(self, run=replace(self.run, checkpoint_id=checkpoint_id, checkpoint_seq=seq))


def to_datetime(timestamp: float) -> datetime:
    """A database timestamp (epoch seconds) as the aware datetime the protocol functions compare."""
    return datetime.fromtimestamp(timestamp, UTC)


# --- statements --------------------------------------------------------------------------------------------------


def select_now() -> Select[Any]:
    return select(db_now())


def select_claimable(*, agents: Collection[str], limit: int, now: float) -> Select[Any]:
    """S-11, S-17: due accepted runs of registered agents with a supported checkpoint, oldest first, skip locked."""
    latest = func.coalesce(runs.c.checkpoint_id, runs.c.start_checkpoint_id)
    checkpoint_format = select(checkpoints.c.format).where(checkpoints.c.id == latest).scalar_subquery()
    return (
        select(*_CLAIM_RUN_COLUMNS, workspace_has_subscriptions(runs.c.workspace_id))
        .where(
            runs.c.status == "accepted",
            runs.c.available_at <= now,
            runs.c.agent.in_(sorted(agents)),
            or_(latest.is_(None), checkpoint_format.in_(sorted(SUPPORTED_CHECKPOINT_FORMATS))),
        )
        .order_by(runs.c.available_at, runs.c.id)
        .limit(limit)
        .with_for_update(skip_locked=True, key_share=True, of=runs)
    )


def select_previous_attempt(run_id: str) -> Select[Any]:
    """The run's attempt with the highest number (§7.2)."""
    a = run_attempts.c
    return select(a.id, a.number, a.status).where(a.run_id == run_id).order_by(a.number.desc()).limit(1)


def insert_attempt(
    *,
    attempt_id: str,
    workspace_id: str,
    run_id: str,
    number: int,
    start_reason: StartReason,
    replaces_attempt_id: str | None,
    worker_id: str,
    token_hash: str,
    now: float,
    lease_seconds: float,
) -> Any:
    """S-15: a `leased` attempt with `lease_expires_at = now + lease_seconds` and the token's hash only (S-21)."""
    return insert(run_attempts).values(
        id=attempt_id,
        workspace_id=workspace_id,
        run_id=run_id,
        number=number,
        status="leased",
        start_reason=start_reason,
        replaces_attempt_id=replaces_attempt_id,
        worker_id=worker_id,
        worker_build=WORKER_BUILD,
        lease_token_hash=token_hash,
        lease_expires_at=now + lease_seconds,
        heartbeat_at=now,
        created_at=now,
        updated_at=now,
    )


def update_run_claimed(*, run_id: str, attempt_id: str, attempts: int, first_claim: bool, now: float) -> Update:
    """S-14, S-15: run → `running` with its attempt; `started_at` only on the first claim."""
    values: dict[str, Any] = {
        "status": "running",
        "current_attempt_id": attempt_id,
        "attempts": attempts,
        "version": runs.c.version + 1,
    }
    if first_claim:
        values["started_at"] = func.coalesce(runs.c.started_at, now)
    return update(runs).where(runs.c.id == run_id, runs.c.status == "accepted").values(**values)


def lock_thread(thread_id: str, *, skip_locked: bool = False) -> Select[Any]:
    return (
        select(threads.c.id, threads.c.archived_at)
        .where(threads.c.id == thread_id)
        .with_for_update(key_share=True, skip_locked=skip_locked)
    )


def lock_run(run_id: str, *, skip_locked: bool = False) -> Select[Any]:
    query = select(*_FENCE_RUN_COLUMNS).where(runs.c.id == run_id)
    return query.with_for_update(key_share=True, skip_locked=skip_locked)


def lock_attempt(attempt_id: str, *, skip_locked: bool = False) -> Select[Any]:
    return (
        select(*_FENCE_ATTEMPT_COLUMNS)
        .where(run_attempts.c.id == attempt_id)
        .with_for_update(key_share=True, skip_locked=skip_locked)
    )


@cache
def lock_fenced_rows() -> Select[Any]:
    """The fence preamble (S-20) in one round trip; binds `thread_id`, `run_id` and `attempt_id`.

    Locks thread → run → attempt: PostgreSQL takes a statement's row locks in the order of `FOR … OF`, the order
    every other fenced write uses. The database clock is read by the outer query, above the locking subquery, so
    it is read only once every lock was granted (a commit that waited for a lock sees the time after the wait).
    One row: `thread_archived_at`, the thread's origin, the `_FENCE_RUN_COLUMNS`, the attempt's columns prefixed
    `attempt_`, `now` and `workspace_has_subscriptions` (so a transition's webhooks need no lookup of their own
    when there are none); no row when the thread, run or attempt does not exist or they do not belong together.
    Built once: a constant statement keeps SQLAlchemy's compiled-statement cache warm without rebuilding and
    re-keying it at every commit.
    """
    origin = (threads.c.origin.label("thread_origin"), threads.c.origin_thread_id.label("thread_origin_thread_id"))
    fenced = _fence_query(*origin).subquery("fenced")
    return select(fenced, db_now().label("now"), workspace_has_subscriptions(fenced.c.workspace_id))


def _fence_query(*thread_columns: Any) -> Select[Any]:
    return (
        select(
            threads.c.archived_at.label("thread_archived_at"),
            *thread_columns,
            *_FENCE_RUN_COLUMNS,
            *(column.label(_ATTEMPT_PREFIX + column.name) for column in _FENCE_ATTEMPT_COLUMNS),
        )
        .select_from(
            threads.join(runs, runs.c.thread_id == threads.c.id).join(run_attempts, run_attempts.c.run_id == runs.c.id)
        )
        .where(
            threads.c.id == bindparam("thread_id"),
            runs.c.id == bindparam("run_id"),
            run_attempts.c.id == bindparam("attempt_id"),
        )
        .with_for_update(key_share=True, of=[threads, runs, run_attempts])
    )


def update_attempt_started(*, attempt_id: str, harness_run_id: str, now: float) -> Update:
    """S-16: `leased → running` with the harness run id."""
    a = run_attempts.c
    return (
        update(run_attempts)
        .where(a.id == attempt_id, a.status == "leased")
        .values(status="running", harness_run_id=harness_run_id, started_at=now, updated_at=now)
    )


# --- operations --------------------------------------------------------------------------------------------------


async def read_now(conn: AsyncConnection) -> float:
    """The database clock (§2.2), read inside the caller's transaction."""
    return float((await conn.execute(select_now())).scalar_one())


async def claim_runs(
    engine: AsyncEngine,
    *,
    worker_id: str,
    agents: Collection[str],
    limit: int,
    lease_seconds: float,
    randbytes: Callable[[int], bytes],
) -> list[ClaimedRun]:
    """§7.2 in one transaction: lease up to `limit` due runs (S-11, S-13, S-14, S-15, S-17).

    PostgreSQL hands each run to one claimer through `FOR UPDATE SKIP LOCKED`; SQLite serializes claimers through
    `BEGIN IMMEDIATE`. Raises `StoreUnavailable` when the database cannot serve the claim.
    """
    if limit < 1 or not agents:
        return []
    claimed: list[ClaimedRun] = []
    async with write_transaction(engine) as conn:
        now = await read_now(conn)
        rows = (await conn.execute(select_claimable(agents=agents, limit=limit, now=now))).mappings().all()
        if not rows:
            nothing_to_commit(conn)  # an empty scan: no committed transaction for it
        for row in rows:
            previous_row = (await conn.execute(select_previous_attempt(row["id"]))).mappings().one_or_none()
            previous = None if previous_row is None else PreviousAttempt(**previous_row)
            plan = plan_claim(previous, attempts=row["attempts"], now=to_datetime(now), lease_seconds=lease_seconds)
            token = new_lease_token(randbytes)
            attempt_id = "att_" + randbytes(16).hex()
            await conn.execute(
                insert_attempt(
                    attempt_id=attempt_id,
                    workspace_id=row["workspace_id"],
                    run_id=row["id"],
                    number=plan.number,
                    start_reason=plan.start_reason,
                    replaces_attempt_id=plan.replaces_attempt_id,
                    worker_id=worker_id,
                    token_hash=hash_lease_token(token),
                    now=now,
                    lease_seconds=lease_seconds,
                )
            )
            await conn.execute(
                update_run_claimed(
                    run_id=row["id"],
                    attempt_id=attempt_id,
                    attempts=plan.attempts,
                    first_claim=plan.first_claim,
                    now=now,
                )
            )
            # S-15, S-106: the claim's webhooks in the claim transaction.
            await stage_run_transition(
                conn,
                run_id=row["id"],
                run_status="running",
                attempt_id=attempt_id,
                attempt_status="leased",
                workspace_id=row["workspace_id"],
                has_subscriptions=bool(row["workspace_has_subscriptions"]),
            )
            lease = Lease(
                run_id=row["id"],
                attempt_id=attempt_id,
                thread_id=row["thread_id"],
                attempt_number=plan.number,
                worker_id=worker_id,
                token=token,
            )
            claimed.append(_claimed(row, lease, plan.start_reason, now))
    return claimed


def _claimed(row: Mapping[str, Any], lease: Lease, start_reason: StartReason, now: float) -> ClaimedRun:
    stored_resume = parse_stored_resume(row["resume"])
    return ClaimedRun(
        lease=lease,
        start_reason=start_reason,
        workspace_id=row["workspace_id"],
        agent=row["agent"],
        principal_id=row["principal_id"],
        options=dict(row["options"] or {}),
        options_digest=row["options_digest"],
        tool_recovery=row["tool_recovery"],
        source_entry_id=row["source_entry_id"],
        resume=stored_resume.answers,
        resume_problem=stored_resume.problem,
        trigger=row["trigger"],
        lineage=row["lineage"],
        parent_run_id=row["parent_run_id"],
        checkpoint_id=row["checkpoint_id"],
        checkpoint_seq=row["checkpoint_seq"],
        start_checkpoint_id=row["start_checkpoint_id"],
        cancel_requested=row["cancel_requested_at"] is not None,
        queue_wait_ms=max(0, int((now - row["available_at"]) * 1000)),
        created_at=row["created_at"],
        trace_context=row["trace_context"],
    )


def _snapshot(run: FencedRun, attempt: Mapping[str, Any]) -> FenceSnapshot:
    return FenceSnapshot(
        run_status=run.status,
        run_current_attempt_id=run.current_attempt_id,
        attempt_id=attempt["id"],
        attempt_status=attempt["status"],
        attempt_worker_id=attempt["worker_id"],
        lease_token_hash=attempt["lease_token_hash"],
        lease_expires_at=to_datetime(attempt["lease_expires_at"]),
    )


async def lock_fenced(conn: AsyncConnection, lease: Lease) -> Fenced:
    """S-20: lock thread → run → attempt, read now, and raise `LeaseLost` unless the fence predicate holds.

    Call it first in every execution-dependent write transaction; nothing may be written before it returns. One
    statement (`lock_fenced_rows()`): the commit path pays one round trip for the fence, not four.
    """
    params = {"thread_id": lease.thread_id, "run_id": lease.run_id, "attempt_id": lease.attempt_id}
    row = (await conn.execute(lock_fenced_rows(), params)).mappings().one_or_none()
    return fenced_from_row(row, lease)


def fenced_from_row(row: Mapping[str, Any] | None, lease: Lease) -> Fenced:
    """The fence predicate (S-20, S-21) over the one row of `lock_fenced_rows()` (None: no row); raises `LeaseLost`.

    Shared by `lock_fenced` and the PostgreSQL commit path that runs the same statement on asyncpg directly.
    """
    if row is None or row[_ATTEMPT_PREFIX + "run_id"] != lease.run_id:
        raise LeaseLost("attempt_not_current")
    run = FencedRun.from_row(row)
    attempt = {column.name: row[_ATTEMPT_PREFIX + column.name] for column in _FENCE_ATTEMPT_COLUMNS}
    now = float(row["now"])
    verdict = check_fence(_snapshot(run, attempt), lease, to_datetime(now))
    if not verdict.ok:
        raise LeaseLost(str(verdict.reason))
    has_subscriptions = row.get("workspace_has_subscriptions")  # the step commits' fence reads neither
    origin = row.get("thread_origin")
    return Fenced(
        now=now,
        run=run,
        thread_archived=row["thread_archived_at"] is not None,
        thread_origin=None if origin is None else ThreadOrigin(origin, row["thread_origin_thread_id"]),
        workspace_has_subscriptions=None if has_subscriptions is None else bool(has_subscriptions),
    )


async def lock_for_expiry(conn: AsyncConnection, *, run_id: str, attempt_id: str) -> Fenced | None:
    """S-27: lock thread → run → attempt with `SKIP LOCKED` and confirm the lease is still past due.

    Returns None when a row is locked by someone else, or when under lock the run is no longer running, the
    attempt no longer current and live, or its lease was renewed meanwhile.
    """
    thread_id = (await conn.execute(select(runs.c.thread_id).where(runs.c.id == run_id))).scalar_one_or_none()
    if thread_id is None:
        return None
    thread = (await conn.execute(lock_thread(thread_id, skip_locked=True))).mappings().one_or_none()
    if thread is None:
        return None
    run_row = (await conn.execute(lock_run(run_id, skip_locked=True))).mappings().one_or_none()
    if run_row is None:
        return None
    run = FencedRun.from_row(run_row)
    attempt = (await conn.execute(lock_attempt(attempt_id, skip_locked=True))).mappings().one_or_none()
    if attempt is None or attempt["run_id"] != run_id:
        return None
    now = await read_now(conn)
    if not is_expired_for_recovery(_snapshot(run, attempt), now=to_datetime(now)):
        return None
    return Fenced(now=now, run=run, thread_archived=thread["archived_at"] is not None)


async def start_attempt(engine: AsyncEngine, lease: Lease, *, harness_run_id: str) -> None:
    """S-16: fenced `leased → running` with `harness_run_id`; raises `LeaseLost` if the lease is gone."""
    async with write_transaction(engine) as conn:
        fenced = await lock_fenced(conn, lease)
        await conn.execute(
            update_attempt_started(attempt_id=lease.attempt_id, harness_run_id=harness_run_id, now=fenced.now)
        )
        # S-16, S-106: `run_attempt.running` in the same transaction.
        await stage_run_transition(
            conn,
            run_id=lease.run_id,
            run_status=None,
            attempt_id=lease.attempt_id,
            attempt_status="running",
            workspace_id=fenced.run.workspace_id,
            has_subscriptions=fenced.workspace_has_subscriptions,
        )
