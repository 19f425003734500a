"""Lease upkeep (§7.4): what the supervisor reads and writes at every heartbeat.

The cancellation flags and principals of running runs with the facts of the `run` authority check of §4.3 for each
of their principals (one statement, read without locks), and the renewal of due leases (S-23). Renewal locks
attempt rows with `SKIP LOCKED`: a row held by a commit or a sweep simply waits for the next heartbeat.
"""

from __future__ import annotations

import hmac
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Select, Update, and_, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from ...errors import StoreUnavailable
from ...protocol.authority import AuthorityVerdict
from ...protocol.fencing import Lease, hash_lease_token
from ..db.engine import nothing_to_commit, read_transaction, write_transaction
from ..schema.tables import LIVE_ATTEMPT_STATUSES, run_attempts, runs
from ..workspaces.auth import authority_facts, check_run_authority, principals_authority
from .claims import read_now

__all__ = (
    "Supervision",
    "HeartbeatFacts",
    "select_renewable",
    "update_leases",
    "select_supervision",
    "renew_leases",
    "read_heartbeat_facts",
    "read_authority",
    "check_authority",
)


@dataclass(frozen=True, kw_only=True, slots=True)
class Supervision:
    """What the supervisor reads (without locks) for one running attempt's run (§7.4 step 1)."""

    run_id: str
    principal_id: str
    cancel_requested: bool


@dataclass(frozen=True, kw_only=True, slots=True)
class HeartbeatFacts:
    """What one heartbeat reads before deciding anything (§7.4 step 1)."""

    runs: dict[str, Supervision]
    """By run id; a run missing here was not found."""
    verdicts: dict[str, AuthorityVerdict]
    """The §4.3 authority check of each run's principal, by principal id."""


def select_renewable(*, attempt_ids: Collection[str], worker_id: str, now: float, lease_seconds: float) -> Select[Any]:
    """S-23: this worker's live, unexpired attempts that are current for a running run and have ≤ 2/3 remaining.

    `SKIP LOCKED`: an attempt row locked by a commit or a sweep waits for the next heartbeat (§7.4 step 2). The
    filter is `protocol.fencing.is_renewable` in SQL (it must run in the database to lock only the due rows);
    tests/integration/store/test_leases.py holds the two equal.
    """
    a = run_attempts.c
    return (
        select(a.id, a.lease_token_hash)
        .join(runs, and_(runs.c.id == a.run_id, runs.c.current_attempt_id == a.id))
        .where(
            a.id.in_(sorted(attempt_ids)),
            a.worker_id == worker_id,
            a.status.in_(LIVE_ATTEMPT_STATUSES),
            runs.c.status == "running",
            a.lease_expires_at > now,
            # remaining ≤ 2/3 of the lease, as in protocol.fencing.should_renew
            (a.lease_expires_at - now) * 3 <= lease_seconds * 2,
        )
        .with_for_update(skip_locked=True, key_share=True, of=run_attempts)
    )


def update_leases(*, attempt_ids: Collection[str], now: float, lease_seconds: float) -> Update:
    """S-23: the new expiry is `now + lease_seconds`; the S-9 trigger refuses an expired lease anyway."""
    a = run_attempts.c
    return (
        update(run_attempts)
        .where(a.id.in_(sorted(attempt_ids)), a.status.in_(LIVE_ATTEMPT_STATUSES), a.lease_expires_at > now)
        .values(lease_expires_at=now + lease_seconds, heartbeat_at=now, updated_at=now)
    )


_FACTS = "authority_"
_PRINCIPALS = principals_authority(_FACTS)


def select_supervision(run_ids: Collection[str]) -> Select[Any]:
    """The runs' cancellation flags and principals, each with its principal's §4.3 facts (outer join: a principal
    not found reads as missing, which the check refuses)."""
    return (
        select(runs.c.id, runs.c.principal_id, runs.c.cancel_requested_at, *_PRINCIPALS.c)
        .outerjoin(_PRINCIPALS, _PRINCIPALS.c[f"{_FACTS}principal_id"] == runs.c.principal_id)
        .where(runs.c.id.in_(sorted(run_ids)))
    )


async def renew_leases(engine: AsyncEngine, leases: Sequence[Lease], *, lease_seconds: float) -> set[str]:
    """§7.4 step 2 (S-23, S-9): push out each due lease of `leases` to `now + lease_seconds`.

    Returns the ids of the attempts whose lease was extended in this call. A lease with more than 2/3 remaining,
    one locked by another transaction, one no longer current or live, or one already expired is left alone. The
    stored token hash must match the one held in memory (S-21).
    """
    if not leases:
        return set()
    by_id = {lease.attempt_id: lease for lease in leases}
    worker_ids = {lease.worker_id for lease in leases}
    if len(worker_ids) != 1:
        raise ValueError("renew_leases takes the leases of one worker")
    async with write_transaction(engine) as conn:
        now = await read_now(conn)
        query = select_renewable(attempt_ids=by_id, worker_id=worker_ids.pop(), now=now, lease_seconds=lease_seconds)
        rows = (await conn.execute(query)).all()
        due = {row.id for row in rows if _token_matches(row.lease_token_hash, by_id[row.id])}
        if due:
            await conn.execute(update_leases(attempt_ids=due, now=now, lease_seconds=lease_seconds))
        else:
            nothing_to_commit(conn)  # most heartbeats renew nothing (a lease is due every lease_seconds / 3)
    return due


def _token_matches(stored_hash: str, lease: Lease) -> bool:
    return hmac.compare_digest(stored_hash.encode(), hash_lease_token(lease.token).encode())


async def read_heartbeat_facts(engine: AsyncEngine, run_ids: Collection[str]) -> HeartbeatFacts:
    """§7.4 step 1 in one statement: each run's flag and principal, with that principal's §4.3 facts.

    One round trip instead of one transaction per check: a worker heartbeats every `worker.authority_seconds`
    whether or not its runs make progress, so what a heartbeat costs is paid by every idle or waiting worker. A
    database that cannot answer raises `StoreUnavailable`, which fails the heartbeat like an *unavailable* check.
    """
    if not run_ids:
        return HeartbeatFacts(runs={}, verdicts={})
    async with read_transaction(engine) as conn:
        rows = (await conn.execute(select_supervision(run_ids))).mappings().all()
    return HeartbeatFacts(
        runs={
            row["id"]: Supervision(
                run_id=row["id"],
                principal_id=row["principal_id"],
                cancel_requested=row["cancel_requested_at"] is not None,
            )
            for row in rows
        },
        verdicts={row["principal_id"]: authority_facts(row, _FACTS).verdict() for row in rows},
    )


async def read_authority(engine: AsyncEngine, principal_id: str) -> AuthorityVerdict:
    """§4.3: the `run` authority check of a run's principal; raises `StoreUnavailable` when it cannot be read."""
    async with read_transaction(engine) as conn:
        return await check_run_authority(conn, principal_id)


async def check_authority(engine: AsyncEngine, principal_id: str) -> AuthorityVerdict:
    """§4.3: the `run` authority check of a run's principal; *unavailable* when the check itself fails."""
    try:
        return await read_authority(engine, principal_id)
    except StoreUnavailable:
        return "unavailable"
