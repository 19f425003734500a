"""Webhook subscriptions (§9.3) and the deliveries staged for them (§9.7): workspace-scoped rows and statements.

Every read and write takes the caller's `workspace_id`, so an id of another workspace reads exactly like an unknown
one (S-126). Rows never carry the encrypted signing secret: `SubscriptionRow` and `DeliveryRow` leave it out, and
only `insert_subscription` writes it. Staged outbox rows copy URL and secret (store/runs/outbox_staging.py), so
the updates and deletions here never touch them (S-119).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Select, delete, func, insert, select, update
from sqlalchemy import exc as sa_exc
from sqlalchemy.ext.asyncio import AsyncConnection

from ...errors import AlreadyExists
from ..schema.dialect import db_now, past_keyset
from ..schema.tables import outbox, subscriptions, workspaces

__all__ = (
    "SubscriptionRow",
    "DeliveryRow",
    "SubscriptionChanges",
    "select_subscriptions",
    "select_deliveries",
    "count_subscriptions",
    "insert_subscription",
    "get_subscription",
    "lock_subscription",
    "list_subscriptions",
    "update_subscription",
    "delete_subscription",
    "get_delivery",
    "list_deliveries",
)

Keyset = tuple[float, str]
"""`(created_at, id)` of the last item of the previous page."""


@dataclass(frozen=True, kw_only=True, slots=True)
class SubscriptionRow:
    """A subscription without its signing secret."""

    id: str
    workspace_id: str
    name: str
    url: str
    events: tuple[str, ...]
    filter: dict[str, Any]
    enabled: bool
    version: int
    created_by_id: str
    updated_by_id: str
    created_at: float
    updated_at: float

    @classmethod
    def from_mapping(cls, row: Mapping[Any, Any]) -> SubscriptionRow:
        return cls(
            id=row["id"],
            workspace_id=row["workspace_id"],
            name=row["name"],
            url=row["url"],
            events=tuple(row["events"] or ()),
            filter=dict(row["filter"] or {}),
            enabled=bool(row["enabled"]),
            version=row["version"],
            created_by_id=row["created_by_id"],
            updated_by_id=row["updated_by_id"],
            created_at=row["created_at"],
            updated_at=row["updated_at"],
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class DeliveryRow:
    """One webhook outbox row of a subscription, without its payload's data or its signing secret."""

    id: str
    subscription_id: str
    event_type: str
    status: str
    attempts: int
    available_at: float
    last_error: str | None
    created_at: float
    delivered_at: float | None
    settled_at: float | None

    @classmethod
    def from_mapping(cls, row: Mapping[Any, Any]) -> DeliveryRow:
        return cls(
            id=row["id"],
            subscription_id=row["subscription_id"],
            event_type=(row["payload"] or {}).get("type", ""),
            status=row["status"],
            attempts=row["attempts"],
            available_at=row["available_at"],
            last_error=row["last_error"],
            created_at=row["created_at"],
            delivered_at=row["delivered_at"],
            settled_at=row["settled_at"],
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class SubscriptionChanges:
    """The fields a PATCH sets; `None` leaves a field as it is (`filter` is replaced whole when given)."""

    name: str | None = None
    url: str | None = None
    events: Sequence[str] | None = None
    filter: Mapping[str, Any] | None = None
    enabled: bool | None = None

    def values(self) -> dict[str, Any]:
        chosen: dict[str, Any] = {
            "name": self.name,
            "url": self.url,
            "events": self.events,
            "filter": self.filter,
            "enabled": self.enabled,
        }
        return {
            name: (list(value) if name == "events" else dict(value) if name == "filter" else value)
            for name, value in chosen.items()
            if value is not None
        }


_PUBLIC_COLUMNS = [column for column in subscriptions.c if column.name != "signing_secret"]
_DELIVERY_COLUMNS = [
    outbox.c.id,
    outbox.c.subscription_id,
    outbox.c.payload,
    outbox.c.status,
    outbox.c.attempts,
    outbox.c.available_at,
    outbox.c.last_error,
    outbox.c.created_at,
    outbox.c.delivered_at,
    outbox.c.settled_at,
]


# --- statements --------------------------------------------------------------------------------------------------


def _one(workspace_id: str, subscription_id: str) -> Select[Any]:
    s = subscriptions.c
    return select(*_PUBLIC_COLUMNS).where(s.id == subscription_id, s.workspace_id == workspace_id)


def select_subscriptions(*, workspace_id: str, limit: int, after: Keyset | None = None) -> Select[Any]:
    """A workspace's subscriptions, oldest first (`created_at`, then `id`), optionally after the keyset `after`."""
    s = subscriptions.c
    query = select(*_PUBLIC_COLUMNS).where(s.workspace_id == workspace_id)
    if after is not None:
        query = query.where(past_keyset(s.created_at, s.id, after, newest_first=False))
    return query.order_by(s.created_at, s.id).limit(limit)


def select_deliveries(
    *, workspace_id: str, subscription_id: str, limit: int, before: Keyset | None = None
) -> Select[Any]:
    """A subscription's webhook rows, newest first (`created_at`, then `id`), optionally after the keyset `before`."""
    o = outbox.c
    query = select(*_DELIVERY_COLUMNS).where(
        o.workspace_id == workspace_id, o.subscription_id == subscription_id, o.kind == "webhook"
    )
    if before is not None:
        query = query.where(past_keyset(o.created_at, o.id, before, newest_first=True))
    return query.order_by(o.created_at.desc(), o.id.desc()).limit(limit)


# --- subscriptions -----------------------------------------------------------------------------------------------


async def count_subscriptions(conn: AsyncConnection, *, workspace_id: str) -> int:
    """How many subscriptions the workspace has, with its row locked so that concurrent creations cannot both pass
    the `control.subscriptions` limit (SQLite's writer lock does the same)."""
    await conn.execute(select(workspaces.c.id).where(workspaces.c.id == workspace_id).with_for_update())
    query = select(func.count()).select_from(subscriptions).where(subscriptions.c.workspace_id == workspace_id)
    return int((await conn.execute(query)).scalar_one())


async def _name_taken(conn: AsyncConnection, *, workspace_id: str, name: str, other_than: str | None = None) -> bool:
    s = subscriptions.c
    query = select(s.id).where(s.workspace_id == workspace_id, s.name == name)
    if other_than is not None:
        query = query.where(s.id != other_than)
    return (await conn.execute(query.limit(1))).first() is not None


async def insert_subscription(
    conn: AsyncConnection,
    *,
    subscription_id: str,
    workspace_id: str,
    principal_id: str,
    name: str,
    url: str,
    events: Sequence[str],
    filter: Mapping[str, Any],  # noqa: A002 - the spec's column name
    enabled: bool,
    encrypted_secret: str,
) -> SubscriptionRow:
    """A new subscription; a name the workspace already uses → `AlreadyExists("subscription")`."""
    if await _name_taken(conn, workspace_id=workspace_id, name=name):
        raise AlreadyExists("subscription")
    now = db_now()
    try:
        await conn.execute(
            insert(subscriptions).values(
                id=subscription_id,
                workspace_id=workspace_id,
                name=name,
                url=url,
                events=list(events),
                filter=dict(filter),
                enabled=enabled,
                signing_secret=encrypted_secret,
                version=1,
                created_by_id=principal_id,
                updated_by_id=principal_id,
                created_at=now,
                updated_at=now,
            )
        )
    except sa_exc.IntegrityError as exc:  # a concurrent create took the name
        raise AlreadyExists("subscription") from exc
    created = await get_subscription(conn, workspace_id=workspace_id, subscription_id=subscription_id)
    assert created is not None
    return created


async def get_subscription(conn: AsyncConnection, *, workspace_id: str, subscription_id: str) -> SubscriptionRow | None:
    row = (await conn.execute(_one(workspace_id, subscription_id))).mappings().first()
    return None if row is None else SubscriptionRow.from_mapping(row)


async def lock_subscription(
    conn: AsyncConnection, *, workspace_id: str, subscription_id: str
) -> SubscriptionRow | None:
    """The subscription, locked for the rest of the transaction (`FOR UPDATE`; SQLite's writer lock is held)."""
    row = (await conn.execute(_one(workspace_id, subscription_id).with_for_update())).mappings().first()
    return None if row is None else SubscriptionRow.from_mapping(row)


async def list_subscriptions(
    conn: AsyncConnection, *, workspace_id: str, limit: int, after: Keyset | None = None
) -> list[SubscriptionRow]:
    query = select_subscriptions(workspace_id=workspace_id, limit=limit, after=after)
    return [SubscriptionRow.from_mapping(row) for row in (await conn.execute(query)).mappings()]


async def update_subscription(
    conn: AsyncConnection, current: SubscriptionRow, *, principal_id: str, changes: SubscriptionChanges
) -> SubscriptionRow:
    """Apply `changes` to the locked `current` row and increment its version (no changes: the row as it is); a name
    taken by another subscription of the workspace → `AlreadyExists("subscription")`. Staged rows are not touched
    (S-119)."""
    if not changes.values():
        return current
    if changes.name is not None and await _name_taken(
        conn, workspace_id=current.workspace_id, name=changes.name, other_than=current.id
    ):
        raise AlreadyExists("subscription")
    s = subscriptions.c
    try:
        await conn.execute(
            update(subscriptions)
            .where(s.id == current.id, s.workspace_id == current.workspace_id)
            .values(**changes.values(), version=s.version + 1, updated_by_id=principal_id, updated_at=db_now())
        )
    except sa_exc.IntegrityError as exc:  # a concurrent write took the name
        raise AlreadyExists("subscription") from exc
    updated = await get_subscription(conn, workspace_id=current.workspace_id, subscription_id=current.id)
    assert updated is not None
    return updated


async def delete_subscription(conn: AsyncConnection, current: SubscriptionRow) -> None:
    """Remove the subscription; its staged outbox rows stay and are still delivered (S-119)."""
    s = subscriptions.c
    await conn.execute(delete(subscriptions).where(s.id == current.id, s.workspace_id == current.workspace_id))


# --- deliveries --------------------------------------------------------------------------------------------------


async def get_delivery(
    conn: AsyncConnection, *, workspace_id: str, subscription_id: str, delivery_id: str
) -> DeliveryRow | None:
    """The webhook row `delivery_id` if it was staged for `subscription_id` in `workspace_id`."""
    o = outbox.c
    query = select(*_DELIVERY_COLUMNS).where(
        o.id == delivery_id, o.workspace_id == workspace_id, o.subscription_id == subscription_id, o.kind == "webhook"
    )
    row = (await conn.execute(query)).mappings().first()
    return None if row is None else DeliveryRow.from_mapping(row)


async def list_deliveries(
    conn: AsyncConnection, *, workspace_id: str, subscription_id: str, limit: int, before: Keyset | None = None
) -> list[DeliveryRow]:
    query = select_deliveries(workspace_id=workspace_id, subscription_id=subscription_id, limit=limit, before=before)
    return [DeliveryRow.from_mapping(row) for row in (await conn.execute(query)).mappings()]
