"""A subscription's webhook deliveries (§9.7): the list of its outbox rows and redelivery of a dead one.

* The list shows each row's id, event type, status, attempts and timestamps, newest first; never the payload's
  data, the URL copy or the signing secret.
* Redeliver (S-114) resets a `dead` row to `pending` with `attempts = 0`, `available_at = now` and
  `settled_at = NULL`, keeping its id, URL, payload and secret (`store.outbox_backlog.redeliver`); any other status →
  409 `conflict` reason `not_dead`, a secret the key ring cannot decrypt → reason `signing_secret_unavailable`.
  Each redelivery is audited: the log line "Outbox redelivered" names the delivery, its subscription and the
  principal who asked. A delivery of a deleted subscription cannot be reached here any more (404).
"""

from __future__ import annotations

from typing import Any

from ..core import Service
from ..errors import NotFound
from ..protocol.authority import Principal
from ..protocol.requests import require, still_there
from ..store import outbox as outbox_backlog
from ..store import outbox as store
from ..store.db import read_transaction, write_transaction
from ..store.outbox import DeliveryRow
from ._access import audit, recheck_admin
from .rules import checked_limit

__all__ = ("list_deliveries_page", "redeliver")


async def _require_subscription(conn: Any, principal: Principal, subscription_id: str) -> None:
    found = await store.get_subscription(conn, workspace_id=principal.workspace_id, subscription_id=subscription_id)
    if found is None:
        raise NotFound("subscription", subscription_id)


async def list_deliveries_page(
    service: Service,
    principal: Principal,
    subscription_id: str,
    *,
    limit: int = 50,
    before: tuple[float, str] | None = None,
) -> tuple[list[DeliveryRow], bool]:
    """The subscription's deliveries, newest first, and whether more follow the page (S-98)."""
    require(principal, "admin")
    checked_limit(limit)
    async with read_transaction(service.engine) as conn:
        await _require_subscription(conn, principal, subscription_id)
        rows = await store.list_deliveries(
            conn,
            workspace_id=principal.workspace_id,
            subscription_id=subscription_id,
            limit=limit + 1,
            before=before,
        )
    return rows[:limit], len(rows) > limit


async def redeliver(service: Service, principal: Principal, subscription_id: str, delivery_id: str) -> DeliveryRow:
    """S-114: a dead delivery of the subscription back to `pending`; returns it as it is now."""
    require(principal, "admin")
    scope = {"workspace_id": principal.workspace_id, "subscription_id": subscription_id, "delivery_id": delivery_id}
    async with write_transaction(service.engine) as conn:
        await recheck_admin(conn, principal, refuse_archived=True)
        await _require_subscription(conn, principal, subscription_id)
        if await store.get_delivery(conn, **scope) is None:
            raise NotFound("delivery", delivery_id)
        await outbox_backlog.redeliver(conn, delivery_id, workspace_id=principal.workspace_id)
        row = still_there(await store.get_delivery(conn, **scope), "delivery")
    audit("Outbox redelivered", principal, delivery_id=delivery_id, subscription_id=subscription_id)
    return row
