"""Webhook subscriptions of the caller's workspace (§9.3, §9.4, §8.3 `/v1/subscriptions`): list, create, read,
edit, delete.

* Creation draws a signing secret from the service's entropy, stores it encrypted with the key ring
  (`Service.key_ring`), and returns it once. With no key ring configured it answers 409 `conflict`, reason
  `signing_secret_unavailable` (kind `key_ring`), and writes nothing.
* The URL is checked against the outbound policy at every write (`control.webhook_allow_insecure`, §9.4).
* At most `control.subscriptions` subscriptions per workspace (409 `conflict`, reason `subscription_limit`);
  names are unique per workspace (409 `already_exists`).
* Edits and deletions take the subscription's ETag (`If-Match`). Rows already staged keep the URL and secret they
  copied, so neither affects them (S-119).
* In an archived workspace creating and editing answer 422 `disabled` (S-128); deleting stays possible.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..core import Service
from ..errors import Conflict, NotFound, PreconditionFailed
from ..protocol.authority import Principal
from ..protocol.requests import require
from ..store import outbox as store
from ..store.db import read_transaction, write_transaction
from ..store.outbox import SubscriptionChanges, SubscriptionRow
from ..store.workspaces import new_id
from ._access import audit, recheck_admin
from .rules import checked_events, checked_filter, checked_limit, checked_name, checked_url

__all__ = (
    "SIGNING_SECRET_PREFIX",
    "CreatedSubscription",
    "list_subscriptions_page",
    "create_subscription",
    "get_subscription",
    "update_subscription",
    "delete_subscription",
)

SIGNING_SECRET_PREFIX = "whsec_"


@dataclass(frozen=True, kw_only=True, slots=True)
class CreatedSubscription:
    subscription: SubscriptionRow
    signing_secret: str
    """Shown once; stored only encrypted."""


def _new_signing_secret(service: Service) -> str:
    return SIGNING_SECRET_PREFIX + base64.urlsafe_b64encode(service.entropy.token_bytes(32)).rstrip(b"=").decode()


def _stale(row: SubscriptionRow) -> PreconditionFailed:
    return PreconditionFailed(f'"{row.id}:{row.version}"')


async def list_subscriptions_page(
    service: Service, principal: Principal, *, limit: int = 50, after: tuple[float, str] | None = None
) -> tuple[list[SubscriptionRow], bool]:
    """The workspace's subscriptions, oldest first, and whether more follow the page (S-98)."""
    require(principal, "admin")
    checked_limit(limit)
    async with read_transaction(service.engine) as conn:
        rows = await store.list_subscriptions(conn, workspace_id=principal.workspace_id, limit=limit + 1, after=after)
    return rows[:limit], len(rows) > limit


async def create_subscription(
    service: Service,
    principal: Principal,
    *,
    name: str,
    url: str,
    events: Sequence[str],
    filter: Mapping[str, Any] | None = None,  # noqa: A002 - the spec's field name
    enabled: bool = True,
) -> CreatedSubscription:
    require(principal, "admin")
    control = service.settings.control
    name = checked_name(name)
    url = checked_url(url, allow_insecure=control.webhook_allow_insecure)
    wanted_events = checked_events(events)
    wanted_filter = checked_filter(filter)
    secret = _new_signing_secret(service)
    try:
        encrypted = service.key_ring.encrypt_secret(secret)
    except LookupError as exc:  # §9.3: no key ring, no subscription
        raise Conflict("signing_secret_unavailable", kind="key_ring", id="security.keys") from exc
    async with write_transaction(service.engine) as conn:
        await recheck_admin(conn, principal, refuse_archived=True)
        if await store.count_subscriptions(conn, workspace_id=principal.workspace_id) >= control.subscriptions:
            raise Conflict("subscription_limit", kind="workspace", id=principal.workspace_id)
        row = await store.insert_subscription(
            conn,
            subscription_id=new_id("sub", service.entropy),
            workspace_id=principal.workspace_id,
            principal_id=principal.id,
            name=name,
            url=url,
            events=wanted_events,
            filter=wanted_filter,
            enabled=enabled,
            encrypted_secret=encrypted,
        )
    audit("Subscription created", principal, subscription_id=row.id)
    return CreatedSubscription(subscription=row, signing_secret=secret)


async def get_subscription(service: Service, principal: Principal, subscription_id: str) -> SubscriptionRow:
    require(principal, "admin")
    async with read_transaction(service.engine) as conn:
        row = await store.get_subscription(conn, workspace_id=principal.workspace_id, subscription_id=subscription_id)
    if row is None:
        raise NotFound("subscription", subscription_id)
    return row


async def update_subscription(
    service: Service,
    principal: Principal,
    subscription_id: str,
    *,
    expected_version: int,
    name: str | None = None,
    url: str | None = None,
    events: Sequence[str] | None = None,
    filter: Mapping[str, Any] | None = None,  # noqa: A002 - the spec's field name
    enabled: bool | None = None,
) -> SubscriptionRow:
    """Change the given fields (`filter` is replaced whole; `{}` clears it); later transitions use the new values."""
    require(principal, "admin")
    changes = SubscriptionChanges(
        name=None if name is None else checked_name(name),
        url=None if url is None else checked_url(url, allow_insecure=service.settings.control.webhook_allow_insecure),
        events=None if events is None else checked_events(events),
        filter=None if filter is None else checked_filter(filter),
        enabled=enabled,
    )
    async with write_transaction(service.engine) as conn:
        await recheck_admin(conn, principal, refuse_archived=True)
        current = await _locked_at_version(conn, principal, subscription_id, expected_version)
        updated = await store.update_subscription(conn, current, principal_id=principal.id, changes=changes)
    if updated.version != current.version:
        audit("Subscription updated", principal, subscription_id=subscription_id)
    return updated


async def _locked_at_version(
    conn: Any, principal: Principal, subscription_id: str, expected_version: int
) -> SubscriptionRow:
    """The caller's subscription, locked, at the version its If-Match names (404 / 412 otherwise)."""
    current = await store.lock_subscription(conn, workspace_id=principal.workspace_id, subscription_id=subscription_id)
    if current is None:
        raise NotFound("subscription", subscription_id)
    if expected_version != current.version:
        raise _stale(current)
    return current


async def delete_subscription(
    service: Service, principal: Principal, subscription_id: str, *, expected_version: int
) -> None:
    """Remove the subscription; rows it already staged are still delivered and keep their history (S-119)."""
    require(principal, "admin")
    async with write_transaction(service.engine) as conn:
        await recheck_admin(conn, principal, refuse_archived=False)
        current = await _locked_at_version(conn, principal, subscription_id, expected_version)
        await store.delete_subscription(conn, current)
    audit("Subscription deleted", principal, subscription_id=subscription_id)
