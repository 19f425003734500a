"""Settled and waiting outbox rows: purge after retention (S-115), redelivery of a dead row (S-114), and the
backlog gauges `report_backlog` refreshes (§10.4, S-116)."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import and_, delete, func, or_, select, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from ...errors import Conflict, NotFound
from ...protocol.transitions import is_redeliverable
from ..db.engine import key_ring_of, nothing_to_commit, read_transaction, write_transaction
from ..schema.dialect import db_now
from ..schema.tables import outbox, runs

__all__ = ("BACKLOG_COUNT_CAP", "Backlog", "purge", "redeliver", "read_backlog", "read_runs_backlog", "has_dead")

BACKLOG_COUNT_CAP = 10000
"""`candor_backlog_size` counts at most this many rows (§10.4)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Backlog:
    size: int
    """Due or leased pending rows, capped at `BACKLOG_COUNT_CAP`."""
    oldest_age_seconds: float


# --- retention and redelivery -----------------------------------------------------------------------------------------


async def purge(
    engine: AsyncEngine,
    *,
    kind: str,
    delivered_retention_seconds: float,
    dead_retention_seconds: float,
    batch: int,
) -> int:
    """S-115: delete at most `batch` settled rows of `kind` whose `settled_at` is older than their retention."""
    o = outbox.c
    async with write_transaction(engine) as conn:
        now = float((await conn.execute(select(db_now()))).scalar_one())
        expired = or_(
            and_(o.status == "delivered", o.settled_at < now - delivered_retention_seconds),
            and_(o.status == "dead", o.settled_at < now - dead_retention_seconds),
        )
        ids = (
            (
                await conn.execute(
                    select(o.id)
                    .where(o.kind == kind, o.status != "pending", expired)
                    .order_by(o.settled_at)
                    .limit(batch)
                )
            )
            .scalars()
            .all()
        )
        if not ids:
            nothing_to_commit(conn)  # the usual pass: nothing to purge, no committed transaction for it
            return 0
        result = await conn.execute(delete(outbox).where(o.id.in_(ids), o.status != "pending"))
    return int(result.rowcount or 0)


async def redeliver(conn: AsyncConnection, row_id: str, *, workspace_id: str | None = None) -> None:
    """S-114 (§9.7): a `dead` webhook row back to `pending` with `attempts = 0`, same id, URL, payload and secret.

    Raises `NotFound`, `Conflict("not_dead")`, or `Conflict("signing_secret_unavailable")`.
    """
    o = outbox.c
    query = select(o.id, o.kind, o.status, o.signing_secret, o.workspace_id).where(o.id == row_id)
    row = (await conn.execute(query.with_for_update())).mappings().one_or_none()
    if row is None or (workspace_id is not None and row["workspace_id"] != workspace_id):
        raise NotFound("delivery", row_id)
    if not is_redeliverable(row["kind"], row["status"]):
        raise Conflict("not_dead", kind="delivery", id=row_id)
    if key_ring_of(conn).decrypt_secret(row["signing_secret"]) is None:
        raise Conflict("signing_secret_unavailable", kind="delivery", id=row_id)
    await conn.execute(
        update(outbox)
        .where(o.id == row_id, o.status == "dead")
        .values(
            status="pending",
            attempts=0,
            available_at=db_now(),
            settled_at=None,
            delivered_at=None,
            lease_token_hash=None,
            lease_expires_at=None,
            lease_owner=None,
        )
    )


# --- backlog (report_backlog) ------------------------------------------------------------------------------------


async def read_backlog(engine: AsyncEngine, *, kind: str) -> Backlog:
    """Pending rows of `kind` that are due (count capped) and the age of the oldest one (§10.4)."""
    o = outbox.c
    async with read_transaction(engine) as conn:
        now = float((await conn.execute(select(db_now()))).scalar_one())
        due = select(o.available_at).where(o.kind == kind, o.status == "pending", o.available_at <= now)
        size = (await conn.execute(select(func.count()).select_from(due.limit(BACKLOG_COUNT_CAP).subquery()))).scalar()
        oldest = (
            await conn.execute(
                select(func.min(o.available_at)).where(o.kind == kind, o.status == "pending", o.available_at <= now)
            )
        ).scalar()
    return Backlog(size=int(size or 0), oldest_age_seconds=0.0 if oldest is None else max(0.0, now - oldest))


async def read_runs_backlog(engine: AsyncEngine) -> Backlog:
    """Accepted runs that are due (count capped) and the age of the oldest one (`queue="runs"`)."""
    r = runs.c
    async with read_transaction(engine) as conn:
        now = float((await conn.execute(select(db_now()))).scalar_one())
        due = select(r.id).where(r.status == "accepted", r.available_at <= now)
        size = (await conn.execute(select(func.count()).select_from(due.limit(BACKLOG_COUNT_CAP).subquery()))).scalar()
        oldest = (
            await conn.execute(select(func.min(r.available_at)).where(r.status == "accepted", r.available_at <= now))
        ).scalar()
    return Backlog(size=int(size or 0), oldest_age_seconds=0.0 if oldest is None else max(0.0, now - oldest))


async def has_dead(engine: AsyncEngine, *, kind: str) -> bool:
    """S-116: whether any `dead` row of `kind` is retained."""
    async with read_transaction(engine) as conn:
        found = (
            await conn.execute(select(outbox.c.id).where(outbox.c.kind == kind, outbox.c.status == "dead").limit(1))
        ).first()
    return found is not None
