"""Claiming and settling outbox rows (§9.2), each in its own short transaction.

* `claim_rows` leases due rows of one kind, oldest `available_at` first, `FOR UPDATE SKIP LOCKED` on PostgreSQL
  and `BEGIN IMMEDIATE` on SQLite; a row already at `max_attempts` becomes `dead`/`unsettled` instead (S-110).
* `claim_rows_locked` and `settle_many_locked` do the same inside a caller's transaction: an in-database handler
  (checkpoint cleanup) claims, works and settles in one (outbox/delivery.py).
* `settle_many` settles a batch in one transaction, each row fenced by its own claim token (S-111); `settle` is
  the one-row form; `deferred` gives the attempt back (S-112).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from sqlalchemy import bindparam, or_, select, tuple_, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from ...protocol.backoff import is_unsettled_at_claim
from ...protocol.fencing import hash_lease_token, new_lease_token
from ..db.engine import nothing_to_commit, write_transaction
from ..schema.dialect import db_now
from ..schema.tables import outbox

__all__ = (
    "ClaimedRow",
    "Outcome",
    "claim_rows",
    "claim_rows_locked",
    "Settlement",
    "settlement_values",
    "group_settlements",
    "settle_many",
    "settle_many_locked",
    "settle",
)

Outcome = Literal["delivered", "dead", "retry", "deferred"]


@dataclass(frozen=True, kw_only=True, slots=True)
class ClaimedRow:
    """One leased outbox row; `token` fences its settle (S-111)."""

    id: str
    kind: str
    dedupe_key: str
    target: str | None
    payload: dict[str, Any]
    signing_secret: str | None
    subscription_id: str | None
    attempts: int
    created_at: float
    token: bytes


async def claim_rows(
    engine: AsyncEngine,
    *,
    kind: str,
    limit: int,
    lease_seconds: float,
    max_attempts: int,
    owner: str | None = None,
    randbytes: Callable[[int], bytes] = secrets.token_bytes,
) -> list[ClaimedRow]:
    """§9.2 in one transaction: lease up to `limit` due rows of `kind`, oldest `available_at` first.

    Each claim increments `attempts` and stores the hashed token with `lease_expires_at = now + lease_seconds`. A
    row already at `max_attempts` (its last claim lapsed without a settle) is settled `dead`/`unsettled` (S-110)
    and not returned.
    """
    if limit < 1:
        return []
    async with write_transaction(engine) as conn:
        return await claim_rows_locked(
            conn,
            kind=kind,
            limit=limit,
            lease_seconds=lease_seconds,
            max_attempts=max_attempts,
            owner=owner,
            randbytes=randbytes,
        )


async def claim_rows_locked(
    conn: AsyncConnection,
    *,
    kind: str,
    limit: int,
    lease_seconds: float,
    max_attempts: int,
    owner: str | None = None,
    randbytes: Callable[[int], bytes] = secrets.token_bytes,
) -> list[ClaimedRow]:
    """`claim_rows` inside the caller's write transaction (rows locked until it ends)."""
    o = outbox.c
    claimed: list[ClaimedRow] = []
    now = db_now()  # in the statements themselves: no round trip of its own to read the clock
    rows = (
        (
            await conn.execute(
                select(outbox)
                .where(
                    o.kind == kind,
                    o.status == "pending",
                    o.available_at <= now,
                    or_(o.lease_expires_at.is_(None), o.lease_expires_at <= now),
                )
                .order_by(o.available_at, o.id)
                .limit(limit)
                .with_for_update(skip_locked=True)
            )
        )
        .mappings()
        .all()
    )
    if not rows:
        nothing_to_commit(conn)  # an empty poll (the usual pass): no committed transaction for it
    lapsed = {row["id"] for row in rows if is_unsettled_at_claim(attempts=row["attempts"], max_attempts=max_attempts)}
    if lapsed:
        await conn.execute(
            update(outbox)
            .where(o.id.in_(sorted(lapsed)))
            .values(
                status="dead",
                last_error="unsettled",
                settled_at=now,
                lease_token_hash=None,
                lease_expires_at=None,
                lease_owner=None,
            )
        )
    leases: list[dict[str, Any]] = []
    for row in rows:
        if row["id"] in lapsed:
            continue
        token = new_lease_token(randbytes)
        leases.append({"claimed_id": row["id"], "claimed_hash": hash_lease_token(token)})
        claimed.append(
            ClaimedRow(
                id=row["id"],
                kind=row["kind"],
                dedupe_key=row["dedupe_key"],
                target=row["target"],
                payload=dict(row["payload"] or {}),
                signing_secret=row["signing_secret"],
                subscription_id=row["subscription_id"],
                attempts=row["attempts"] + 1,
                created_at=row["created_at"],
                token=token,
            )
        )
    if leases:  # one executemany (a single pipelined round trip on asyncpg), not one UPDATE per row
        await conn.execute(
            update(outbox)
            .where(o.id == bindparam("claimed_id"))
            .values(
                attempts=o.attempts + 1,
                lease_owner=owner,
                lease_token_hash=bindparam("claimed_hash"),
                lease_expires_at=now + lease_seconds,
            ),
            leases,
        )
    return claimed


@dataclass(frozen=True, kw_only=True, slots=True)
class Settlement:
    """How one claimed row is to be settled; `token` is the claim's token, which fences the settle (S-111)."""

    row_id: str
    token: bytes
    outcome: Outcome
    error: str | None = None
    delay_seconds: float = 0.0
    payload: Mapping[str, Any] | None = None


def settlement_values(settlement: Settlement, *, now: Any) -> dict[str, Any]:
    """The column values a settle writes (§9.2): the lease is cleared; `retry`/`deferred` make the row due after
    `delay_seconds` and `deferred` gives the attempt back (S-112); `error` is kept, `payload` replaces the stored
    one (a handler's cursor)."""
    values: dict[str, Any] = {"lease_token_hash": None, "lease_expires_at": None, "lease_owner": None}
    if settlement.error is not None:
        values["last_error"] = settlement.error[:1024]
    if settlement.payload is not None:
        values["payload"] = dict(settlement.payload)
    match settlement.outcome:
        case "delivered":
            values.update(status="delivered", delivered_at=now, settled_at=now)
        case "dead":
            values.update(status="dead", settled_at=now)
        case "retry":
            values.update(available_at=now + settlement.delay_seconds)
        case "deferred":
            values.update(available_at=now + settlement.delay_seconds, attempts=outbox.c.attempts - 1)
        case _:
            raise ValueError(f"unknown outcome {settlement.outcome!r}")
    return values


def group_settlements(settlements: Sequence[Settlement]) -> list[list[Settlement]]:
    """Settlements that write the same values, in first-seen order, so each group is one UPDATE.

    The common case, a batch of `delivered` rows, is one group. A settlement with a `payload` is its own group
    (payloads differ per row); retries usually differ in their random backoff. Within a group every row is still
    matched on its own `(id, token hash)` pair, so each settle stays fenced by its own token (S-111).
    """
    groups: dict[tuple[Any, ...], list[Settlement]] = {}
    for index, settlement in enumerate(settlements):
        key: tuple[Any, ...] = (settlement.outcome, settlement.error, settlement.delay_seconds)
        if settlement.payload is not None:
            key = ("payload", index)
        groups.setdefault(key, []).append(settlement)
    return list(groups.values())


async def settle_many(engine: AsyncEngine, settlements: Sequence[Settlement]) -> set[str]:
    """§9.2 for a batch in one transaction: settle each row only while it is `pending` and its own token is its
    current claim (S-111); a stale settlement changes nothing and the others still apply. Returns the ids of
    the rows that changed."""
    if not settlements:
        return set()
    async with write_transaction(engine) as conn:
        return await settle_many_locked(conn, settlements)


async def settle_many_locked(conn: AsyncConnection, settlements: Sequence[Settlement]) -> set[str]:
    """`settle_many` inside the caller's write transaction."""
    o = outbox.c
    now = db_now()
    changed: set[str] = set()
    for group in group_settlements(settlements):
        fences = [(item.row_id, hash_lease_token(item.token)) for item in group]
        result = await conn.execute(
            update(outbox)
            .where(o.status == "pending", tuple_(o.id, o.lease_token_hash).in_(fences))
            .values(**settlement_values(group[0], now=now))
            .returning(o.id)
        )
        changed.update(result.scalars().all())
    return changed


async def settle(
    engine: AsyncEngine,
    *,
    row_id: str,
    token: bytes,
    outcome: Outcome,
    error: str | None = None,
    delay_seconds: float = 0.0,
    payload: Mapping[str, Any] | None = None,
) -> bool:
    """§9.2: settle one claimed row; only while it is `pending` and `token` is its current claim (S-111).

    `retry` and `deferred` make it due again after `delay_seconds`; `deferred` also gives the attempt back (S-112).
    `payload`, when given, replaces the stored payload (a handler's cursor). Returns whether the row changed.
    """
    settlement = Settlement(
        row_id=row_id, token=token, outcome=outcome, error=error, delay_seconds=delay_seconds, payload=payload
    )
    return row_id in await settle_many(engine, [settlement])
