"""Recovery (§7.6) of attempts that failed, yielded or whose lease expired, and the `expire_leases` candidates.

A worker recovers its own attempt under its lease (transient failure, handoff; fenced like every execution write).
`expire_leases` recovers other workers' attempts without a lease: it locks thread → run → attempt with
`SKIP LOCKED` and re-checks under lock that the lease is still past due (S-27).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from sqlalchemy import Select, Update, and_, or_, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from ...protocol.fencing import Lease
from ...protocol.outcomes import RecoveryDecision, Requeue, SealAfterRecovery, recovery_decision
from ..db.engine import read_transaction, write_transaction
from ..runs.claims import Fenced, lock_fenced, lock_for_expiry
from ..runs.current_checkpoint import materialize_current_checkpoint
from ..runs.outbox_staging import stage_run_transition
from ..schema.dialect import db_now
from ..schema.tables import LIVE_ATTEMPT_STATUSES, run_attempts, runs
from .seals import SealRequest, failure, finish_attempt, insert_usage_record, seal_locked

__all__ = (
    "ExpiredAttempt",
    "requeue_run",
    "select_expired_attempts",
    "recover_attempt",
    "list_expired_attempts",
)


@dataclass(frozen=True, kw_only=True, slots=True)
class ExpiredAttempt:
    """A candidate of `expire_leases` (§7.5)."""

    run_id: str
    attempt_id: str
    lease_expires_at: float


def requeue_run(*, run_id: str, available_at: float) -> Update:
    """§7.6 step 3: run → `accepted`, no current attempt, due at `available_at`."""
    return (
        update(runs)
        .where(runs.c.id == run_id, runs.c.status == "running")
        .values(status="accepted", current_attempt_id=None, available_at=available_at, version=runs.c.version + 1)
    )


def select_expired_attempts(*, after: tuple[float, str] | None, limit: int) -> Select[Any]:
    """§7.5: live attempts that are their running run's current one and whose lease ran out, by (expiry, id)."""
    a = run_attempts.c
    query = (
        select(a.run_id, a.id, a.lease_expires_at)
        .join(runs, and_(runs.c.id == a.run_id, runs.c.current_attempt_id == a.id))
        .where(runs.c.status == "running", a.status.in_(LIVE_ATTEMPT_STATUSES), a.lease_expires_at < db_now())
        .order_by(a.lease_expires_at, a.id)
        .limit(limit)
    )
    if after is not None:
        expires, attempt_id = after
        query = query.where(or_(a.lease_expires_at > expires, and_(a.lease_expires_at == expires, a.id > attempt_id)))
    return query


async def recover_attempt(
    engine: AsyncEngine,
    *,
    run_id: str,
    attempt_id: str,
    outcome: Literal["failed", "yielded"],
    failure_code: str | None = None,
    failure_message: str | None = None,
    lease: Lease | None = None,
    usage: Mapping[str, Any] | None = None,
) -> RecoveryDecision | None:
    """§7.6: close an attempt that failed or yielded; seal the run or return it to `accepted` (S-30…S-34, S-53).

    With `lease` the write is fenced by that lease (the worker's own transient failure or handoff; raises
    `LeaseLost`). Without it the caller is `expire_leases`: the rows are locked with `SKIP LOCKED` and the lease
    must still be past due under lock, otherwise nothing happens and None is returned (S-27).
    """
    if outcome == "failed" and not failure_code:
        raise ValueError("a failed attempt needs its failure code")
    async with write_transaction(engine) as conn:
        if lease is not None:
            if (lease.run_id, lease.attempt_id) != (run_id, attempt_id):
                raise ValueError("the lease names another attempt")
            fenced: Fenced | None = await lock_fenced(conn, lease)
        else:
            fenced = await lock_for_expiry(conn, run_id=run_id, attempt_id=attempt_id)
        if fenced is None:
            return None
        # before the requeue: the next attempt starts from it
        fenced = await materialize_current_checkpoint(conn, fenced)
        run = fenced.run
        if usage:
            await conn.execute(
                insert_usage_record(
                    run_id=run_id, attempt_id=attempt_id, checkpoint_seq=run.checkpoint_seq, usage=usage
                )
            )
        decision = recovery_decision(
            outcome,
            cancel_requested=run.cancel_requested_at is not None,
            attempts=run.attempts,
            max_attempts=run.max_attempts,
            failure_code=failure_code,
        )
        attempt_failure = failure(failure_code, failure_message) if failure_code else None
        match decision:
            case SealAfterRecovery():
                message = failure_message if decision.failure_code == failure_code else None
                request = SealRequest(status=decision.status, failure=failure(decision.failure_code, message))
                await seal_locked(
                    conn, fenced, attempt_id, request, end=decision.attempt, attempt_failure=attempt_failure
                )
            case Requeue():
                await conn.execute(
                    finish_attempt(
                        attempt_id=attempt_id, end=decision.attempt, attempt_failure=attempt_failure, now=fenced.now
                    )
                )
                await conn.execute(requeue_run(run_id=run_id, available_at=fenced.now + decision.delay_seconds))
                # §7.6 step 3, S-106: `run.accepted` and `run_attempt.yielded|failed` in the same transaction.
                await stage_run_transition(
                    conn,
                    run_id=run_id,
                    run_status="accepted",
                    attempt_id=attempt_id,
                    attempt_status=decision.attempt.status,
                )
    return decision


async def list_expired_attempts(
    engine: AsyncEngine, *, after: tuple[float, str] | None, limit: int
) -> list[ExpiredAttempt]:
    """One page of `expire_leases` candidates (read without locks; each is re-checked under lock)."""
    async with read_transaction(engine) as conn:
        rows = (await conn.execute(select_expired_attempts(after=after, limit=limit))).all()
    return [ExpiredAttempt(run_id=r.run_id, attempt_id=r.id, lease_expires_at=r.lease_expires_at) for r in rows]
