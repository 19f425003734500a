"""`/v1/keys`: manage the workspace's principals (API keys) (§4.2, §8.3)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Response

from ...admin import keys
from ..admin_schemas import CreatedKeyView, CreateKeyBody, KeyPage, KeyView, UpdateKeyBody
from ..cursors import issue_cursor, keyset, read_cursor
from ..dependencies import IfMatch, expected_version
from ..schemas import ErrorBody
from ._common import ERRORS, Admin, created_or_replayed, no_store, with_etag

__all__ = ("router",)

router = APIRouter(prefix="/v1/keys", tags=["keys"], responses=ERRORS)

_COLLECTION = "keys"


@router.get("", summary="List the workspace's keys, oldest first")
async def list_keys(
    caller: Admin,
    limit: Annotated[int, Query(ge=1, le=100)] = 50,
    cursor: Annotated[str | None, Query(description="`next_cursor` of the previous page.")] = None,
) -> KeyPage:
    scope = {"workspace_id": caller.principal.workspace_id}
    after = None if cursor is None else keyset(read_cursor(cursor, _COLLECTION, scope=scope, filters={}))
    rows, more = await keys.list_keys_page(caller.service, caller.principal, limit=limit, after=after)
    next_cursor = None
    if more:
        next_cursor = issue_cursor(_COLLECTION, scope=scope, filters={}, position=[rows[-1].created_at, rows[-1].id])
    return KeyPage(items=[KeyView.of(row) for row in rows], next_cursor=next_cursor)


@router.post(
    "",
    status_code=201,
    summary="Create a key",
    responses={
        200: {"model": CreatedKeyView, "description": "A replay: the key the first request made, `secret: null`."},
        409: {"model": ErrorBody, "description": "conflict `idempotency_key_reused`: other name or permissions"},
        422: {"model": ErrorBody, "description": "disabled: the workspace is archived"},
    },
)
async def create_key(
    body: CreateKeyBody,
    caller: Admin,
    response: Response,
    idempotency_key: Annotated[
        str | None,
        Header(
            alias="Idempotency-Key",
            description="Optional: a retry with the same key and body answers the "
            "key the first request made (200), without its secret, which is stored only as a hash.",
        ),
    ] = None,
) -> CreatedKeyView:
    """A new key of the caller's workspace. The answer holds its `secret`: the only time it is shown."""
    created = await keys.create_key(
        caller.service, caller.principal, name=body.name, permissions=body.permissions, idempotency_key=idempotency_key
    )
    created_or_replayed(response, created.created)
    no_store(response)
    with_etag(response, created.principal.id, created.principal.version)
    return CreatedKeyView.created(created)


_UPDATE: dict[int | str, dict[str, Any]] = {
    409: {"model": ErrorBody, "description": "conflict `last_admin_key`: no enabled admin key would be left"},
    412: {"model": ErrorBody, "description": "precondition_failed (`details.current_etag`)"},
    428: {"model": ErrorBody, "description": "precondition_required"},
}


@router.patch("/{key_id}", summary="Change a key's permissions or disable it", responses=_UPDATE)
async def update_key(
    key_id: str, body: UpdateKeyBody, caller: Admin, response: Response, if_match: IfMatch = None
) -> KeyView:
    """A disabled key authenticates no more (401) and its running runs fail `authority_revoked` at their next
    heartbeat; `"disabled": false` enables it again."""
    version = expected_version(if_match, key_id)
    row = await keys.update_key(caller.service, caller.principal, key_id, expected_version=version, **body.given())
    with_etag(response, row.id, row.version)
    return KeyView.of(row)
