"""`/v1/subscriptions`: webhook subscriptions, their deliveries and redelivery (§8.3, §9.4, §9.7)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Response

from ...admin import deliveries, subscriptions
from ..admin_schemas import (
    CreatedSubscriptionView,
    CreateSubscriptionBody,
    DeliveryPage,
    DeliveryView,
    SubscriptionPage,
    SubscriptionView,
    UpdateSubscriptionBody,
)
from ..cursors import issue_cursor, keyset, read_cursor
from ..dependencies import IfMatch, expected_version
from ..schemas import ErrorBody
from ._common import ERRORS, Admin, no_store, with_etag

__all__ = ("router",)

router = APIRouter(prefix="/v1/subscriptions", tags=["subscriptions"], responses=ERRORS)

Limit = Annotated[int, Query(ge=1, le=100)]
Cursor = Annotated[str | None, Query(description="`next_cursor` of the previous page.")]

_DISABLED: dict[int | str, dict[str, Any]] = {
    422: {"model": ErrorBody, "description": "disabled: the workspace is archived"},
}
_PRECONDITION: dict[int | str, dict[str, Any]] = {
    412: {"model": ErrorBody, "description": "precondition_failed (`details.current_etag`)"},
    428: {"model": ErrorBody, "description": "precondition_required"},
}
_CREATE: dict[int | str, dict[str, Any]] = _DISABLED | {
    409: {
        "model": ErrorBody,
        "description": "already_exists (the name is taken), or conflict "
        "`signing_secret_unavailable` (no key ring) or `subscription_limit` (`control.subscriptions`)",
    },
}
_UPDATE: dict[int | str, dict[str, Any]] = (
    _DISABLED
    | _PRECONDITION
    | {
        409: {"model": ErrorBody, "description": "already_exists: the name is taken"},
    }
)
_REDELIVER: dict[int | str, dict[str, Any]] = _DISABLED | {
    409: {"model": ErrorBody, "description": "conflict `not_dead` or `signing_secret_unavailable`"},
}


@router.get("", summary="List the workspace's subscriptions, oldest first")
async def list_subscriptions(caller: Admin, limit: Limit = 50, cursor: Cursor = None) -> SubscriptionPage:
    scope = {"workspace_id": caller.principal.workspace_id}
    after = None if cursor is None else keyset(read_cursor(cursor, "subscriptions", scope=scope, filters={}))
    rows, more = await subscriptions.list_subscriptions_page(caller.service, caller.principal, limit=limit, after=after)
    next_cursor = None
    if more:
        position = [rows[-1].created_at, rows[-1].id]
        next_cursor = issue_cursor("subscriptions", scope=scope, filters={}, position=position)
    return SubscriptionPage(items=[SubscriptionView.of(row) for row in rows], next_cursor=next_cursor)


@router.post("", status_code=201, summary="Create a subscription", responses=_CREATE)
async def create_subscription(
    body: CreateSubscriptionBody, caller: Admin, response: Response
) -> CreatedSubscriptionView:
    """The answer holds the `signing_secret` that signs every delivery: the only time it is shown (§9.3)."""
    created = await subscriptions.create_subscription(caller.service, caller.principal, **body.arguments())
    row = created.subscription
    no_store(response)
    with_etag(response, row.id, row.version)
    return CreatedSubscriptionView(**SubscriptionView.of(row).model_dump(), signing_secret=created.signing_secret)


@router.get("/{sub_id}", summary="Read a subscription")
async def get_subscription(sub_id: str, caller: Admin, response: Response) -> SubscriptionView:
    row = await subscriptions.get_subscription(caller.service, caller.principal, sub_id)
    with_etag(response, row.id, row.version)
    return SubscriptionView.of(row)


@router.patch("/{sub_id}", summary="Edit a subscription", responses=_UPDATE)
async def update_subscription(
    sub_id: str, body: UpdateSubscriptionBody, caller: Admin, response: Response, if_match: IfMatch = None
) -> SubscriptionView:
    """Later transitions use the new values; deliveries already staged keep theirs (S-119)."""
    version = expected_version(if_match, sub_id)
    row = await subscriptions.update_subscription(
        caller.service, caller.principal, sub_id, expected_version=version, **body.given()
    )
    with_etag(response, row.id, row.version)
    return SubscriptionView.of(row)


@router.delete(
    "/{sub_id}", status_code=204, response_class=Response, summary="Delete a subscription", responses=_PRECONDITION
)
async def delete_subscription(sub_id: str, caller: Admin, if_match: IfMatch = None) -> Response:
    """Deliveries already staged are still delivered (S-119)."""
    version = expected_version(if_match, sub_id)
    await subscriptions.delete_subscription(caller.service, caller.principal, sub_id, expected_version=version)
    return Response(status_code=204)


@router.get("/{sub_id}/deliveries", summary="List a subscription's deliveries, newest first")
async def list_deliveries(sub_id: str, caller: Admin, limit: Limit = 50, cursor: Cursor = None) -> DeliveryPage:
    scope = {"workspace_id": caller.principal.workspace_id, "subscription_id": sub_id}
    before = None if cursor is None else keyset(read_cursor(cursor, "deliveries", scope=scope, filters={}))
    rows, more = await deliveries.list_deliveries_page(
        caller.service, caller.principal, sub_id, limit=limit, before=before
    )
    next_cursor = None
    if more:
        position = [rows[-1].created_at, rows[-1].id]
        next_cursor = issue_cursor("deliveries", scope=scope, filters={}, position=position)
    return DeliveryPage(items=[DeliveryView.of(row) for row in rows], next_cursor=next_cursor)


@router.post("/{sub_id}/deliveries/{delivery_id}/redeliver", summary="Redeliver a dead delivery", responses=_REDELIVER)
async def redeliver(sub_id: str, delivery_id: str, caller: Admin) -> DeliveryView:
    """Only a `dead` delivery: back to `pending` with `attempts = 0`, same id, URL, payload and secret (S-114).
    Audited in the log ("Outbox redelivered", with the principal id)."""
    row = await deliveries.redeliver(caller.service, caller.principal, sub_id, delivery_id)
    return DeliveryView.of(row)
