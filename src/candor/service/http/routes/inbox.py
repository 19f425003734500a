"""`/v1/threads/{thread_id}/inbox`: list, read, edit, withdraw and reorder inbox entries (§8.3, §8.5).

Posting a message is `POST /v1/threads/{thread_id}/inbox` (routes/threads.py). Edits, withdrawals and reorders
need the **thread's** ETag in `If-Match` (§8.1) and answer with the thread's new ETag, so a client can chain them.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Response

from ... import commands
from ..cursors import index_keyset, issue_cursor, read_cursor
from ..dependencies import IfMatch, expected_version
from ..schemas import EditEntryBody, EntryOrderBody, EntryPage, EntryView, ErrorBody
from ._common import ERRORS, Reader, Runner, with_etag

__all__ = ("router",)

router = APIRouter(prefix="/v1/threads", tags=["inbox"], responses=ERRORS)

_CHANGE: dict[int | str, dict[str, Any]] = {
    409: {"model": ErrorBody, "description": "conflict: `entry_<status>` (not pending) or `archived`"},
    412: {"model": ErrorBody, "description": "precondition_failed: stale thread ETag (`details.current_etag`)"},
    422: {"model": ErrorBody, "description": "disabled: the workspace is archived"},
    428: {"model": ErrorBody, "description": "precondition_required"},
}
_EDIT: dict[int | str, dict[str, Any]] = _CHANGE | {
    409: {"model": ErrorBody, "description": "conflict: `entry_<status>`, `archived` or `run_configuration_immutable`"},
    429: {"model": ErrorBody, "description": "rate_limited: the edited entry does not fit the inbox"},
}

EntryStatus = Literal["pending", "assigned", "consumed", "failed", "withdrawn"]


@router.get("/{thread_id}/inbox", summary="List a thread's inbox entries in position order")
async def list_entries(
    thread_id: str,
    caller: Reader,
    status: Annotated[EntryStatus | None, Query(description="Only entries of this status.")] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 50,
    cursor: Annotated[str | None, Query(description="`next_cursor` of the previous page.")] = None,
) -> EntryPage:
    scope = {"workspace_id": caller.principal.workspace_id, "thread_id": thread_id}
    filters = {"status": status}
    after = None if cursor is None else index_keyset(read_cursor(cursor, "thread_inbox", scope=scope, filters=filters))
    rows, more = await commands.list_entries_page(
        caller.service, caller.principal, thread_id, status=status, limit=limit, after=after
    )
    next_cursor = None
    if more:
        next_cursor = issue_cursor("thread_inbox", scope=scope, filters=filters, position=[rows[-1].position])
    return EntryPage(items=[EntryView.of(row) for row in rows], next_cursor=next_cursor)


@router.put("/{thread_id}/inbox/order", summary="Reorder the pending entries", responses=_CHANGE)
async def reorder_inbox(
    thread_id: str, body: EntryOrderBody, caller: Runner, response: Response, if_match: IfMatch = None
) -> EntryPage:
    """`entry_ids` must list every pending entry exactly once (else 400 `invalid_argument`, `details.reason =
    "inbox_order_mismatch"` with `missing`, `unexpected` and `duplicated`); answers the pending entries in their
    new order (not paged)."""
    version = expected_version(if_match, thread_id)
    reordered = await commands.reorder_inbox(
        caller.service, caller.principal, thread_id, body.entry_ids, expected_version=version
    )
    with_etag(response, reordered.thread.id, reordered.thread.version)
    return EntryPage(items=[EntryView.of(row) for row in reordered.entries], next_cursor=None)


@router.get("/{thread_id}/inbox/{entry_id}", summary="Read an inbox entry")
async def get_entry(thread_id: str, entry_id: str, caller: Reader) -> EntryView:
    return EntryView.of(await commands.get_entry(caller.service, caller.principal, thread_id, entry_id))


@router.patch("/{thread_id}/inbox/{entry_id}", summary="Edit a pending entry", responses=_EDIT)
async def edit_entry(
    thread_id: str, entry_id: str, body: EditEntryBody, caller: Runner, response: Response, if_match: IfMatch = None
) -> EntryView:
    """Only its submitter may edit a pending entry (else 403); the changed fields are checked as a post's."""
    version = expected_version(if_match, thread_id)
    changed = await commands.edit_entry(
        caller.service, caller.principal, thread_id, entry_id, body.changes(), expected_version=version
    )
    with_etag(response, changed.thread.id, changed.thread.version)
    return EntryView.of(changed.entry)


@router.delete("/{thread_id}/inbox/{entry_id}", summary="Withdraw a pending entry", responses=_CHANGE)
async def withdraw_entry(
    thread_id: str, entry_id: str, caller: Runner, response: Response, if_match: IfMatch = None
) -> EntryView:
    """Only its submitter may withdraw a pending entry (else 403); it keeps its idempotency key (§8.2)."""
    version = expected_version(if_match, thread_id)
    changed = await commands.withdraw_entry(
        caller.service, caller.principal, thread_id, entry_id, expected_version=version
    )
    with_etag(response, changed.thread.id, changed.thread.version)
    return EntryView.of(changed.entry)
