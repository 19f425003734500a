"""Inbox commands (§8.3, §8.5): edit or withdraw a pending entry, reorder the pending entries.

Each runs in one write transaction under the thread's row lock and is fenced by the thread's ETag (`If-Match`,
§8.1: the **thread's** version). Order of checks: permission → request shape → the thread in the caller's
workspace (404, S-126) → archived workspace (422, S-128) → `If-Match` (412, S-97) → archived thread (409) → the
entry on that thread (404) → submitter (403, S-74) → entry status (409 `entry_<status>`, S-74) → the edited entry
checked like a post (S-68, S-73). A rejection changes nothing; every change increments the thread's version and so
its ETag (S-75).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..core import Service
from ..errors import Conflict, InvalidArgument, NotFound, NotSubmitter, PreconditionFailed
from ..protocol.authority import Principal
from ..protocol.inbox import entry_change_refusal, order_mismatch, reordered_positions
from ..protocol.requests import checked_entry_edit, checked_entry_order, require, still_there
from ..store import reads as views
from ..store import threads
from ..store import threads as inbox
from ..store import workspaces as auth
from ..store.db import write_transaction
from ..store.reads import EntryRow, ThreadRow
from ..store.threads import EntryEdit
from .acceptance import check_steer, checked_agent, checked_client_tool_names, may_write
from .threads import check_entry_fits, check_inbox_room, thread_etag

__all__ = ("EntryChanged", "InboxReordered", "edit_entry", "withdraw_entry", "reorder_inbox")


@dataclass(frozen=True, kw_only=True, slots=True)
class EntryChanged:
    """An edited or withdrawn entry and its thread, both as they are after the change (the new ETag)."""

    thread: ThreadRow
    entry: EntryRow


@dataclass(frozen=True, kw_only=True, slots=True)
class InboxReordered:
    """The thread after a reorder and its pending entries in their new order."""

    thread: ThreadRow
    entries: list[EntryRow]


async def _writable_thread(conn: Any, principal: Principal, thread_id: str, expected_version: int | None) -> ThreadRow:
    """The locked thread, once the workspace may write (422), `If-Match` holds (412) and it is not archived (409)."""
    thread = await threads.lock_thread(conn, thread_id=thread_id, workspace_id=principal.workspace_id)
    if thread is None:
        raise NotFound("thread", thread_id)
    may_write(await auth.read_authority(conn, principal.id), principal)
    if expected_version is not None and expected_version != thread.version:
        raise PreconditionFailed(thread_etag(thread))
    if thread.state == "archived":
        raise Conflict("archived", kind="thread", id=thread_id)
    return thread


async def _changeable_entry(conn: Any, principal: Principal, thread: ThreadRow, entry_id: str) -> EntryRow:
    """S-74: the thread's entry, submitted by the caller and still pending."""
    entry = await views.get_entry(conn, workspace_id=principal.workspace_id, entry_id=entry_id)
    if entry is None or entry.thread_id != thread.id:
        raise NotFound("entry", entry_id)
    return _unless_refused(entry, principal)


def _unless_refused(entry: EntryRow, principal: Principal) -> EntryRow:
    refusal = entry_change_refusal(status=entry.status, submitter_id=entry.principal_id, caller_id=principal.id)
    if refusal is None:
        return entry
    if refusal.kind == "not_submitter":
        raise NotSubmitter(entry.id)
    raise Conflict(refusal.reason, kind="entry", id=entry.id)


async def _changed(conn: Any, principal: Principal, thread_id: str, entry_id: str) -> EntryChanged:
    """Bump the thread's version (S-75) and read both rows as they are now."""
    await threads.touch_thread(conn, thread_id=thread_id, inbox_changed=True)
    thread = await views.get_thread(conn, workspace_id=principal.workspace_id, thread_id=thread_id)
    entry = await views.get_entry(conn, workspace_id=principal.workspace_id, entry_id=entry_id)
    return EntryChanged(thread=still_there(thread, "thread"), entry=still_there(entry, "entry"))


async def _no_longer_pending(conn: Any, principal: Principal, entry_id: str) -> Conflict:
    """The fenced update found the entry moved on (not possible under the thread lock, answered all the same)."""
    entry = still_there(await views.get_entry(conn, workspace_id=principal.workspace_id, entry_id=entry_id), "entry")
    return Conflict(f"entry_{entry.status}", kind="entry", id=entry_id)


async def edit_entry(
    service: Service,
    principal: Principal,
    thread_id: str,
    entry_id: str,
    changes: Mapping[str, Any],
    *,
    expected_version: int | None = None,
) -> EntryChanged:
    """`PATCH /v1/threads/{id}/inbox/{entry_id}`: replace the given fields of a pending entry (`input`, `delivery`,
    `agent`, `options`; `null` agent or options: inherit them again), checked as a post checks them (§8.5); its
    size and options digest are recomputed. Its idempotency key and request digest stay those of the post."""
    require(principal, "run")
    checked = checked_entry_edit(changes)
    if (agent := checked.get("agent")) is not None:
        checked_agent(service, agent)
    if "input" in checked:
        check_entry_fits(service, threads.payload_size(checked["input"]))
    async with write_transaction(service.engine) as conn:
        thread = await _writable_thread(conn, principal, thread_id, expected_version)
        entry = await _changeable_entry(conn, principal, thread, entry_id)
        edit = EntryEdit(
            payload=checked.get("input", entry.payload),
            delivery=checked.get("delivery", entry.delivery),
            agent=checked.get("agent", entry.agent),
            options=checked.get("options", entry.options),
        )
        if "options" in checked or "agent" in checked:
            checked_client_tool_names(service, edit.agent or thread.agent, edit.options)
        if thread.state == "active" and edit.delivery == "steer":
            await check_steer(conn, thread, edit.agent, edit.options)  # S-68
        grown = threads.payload_size(edit.payload) - entry.size
        await check_inbox_room(service, conn, thread_id, added_count=0, added_bytes=grown)  # S-73
        if not await inbox.edit_pending_entry(conn, entry_id=entry_id, edit=edit):
            raise await _no_longer_pending(conn, principal, entry_id)
        return await _changed(conn, principal, thread_id, entry_id)


async def withdraw_entry(
    service: Service, principal: Principal, thread_id: str, entry_id: str, *, expected_version: int | None = None
) -> EntryChanged:
    """`DELETE /v1/threads/{id}/inbox/{entry_id}`: a pending entry becomes `withdrawn` (final, S-76); it keeps its
    idempotency key, so a replay of its post answers the withdrawn entry (S-92)."""
    require(principal, "run")
    async with write_transaction(service.engine) as conn:
        thread = await _writable_thread(conn, principal, thread_id, expected_version)
        await _changeable_entry(conn, principal, thread, entry_id)
        if not await inbox.withdraw_pending_entry(conn, entry_id=entry_id):
            raise await _no_longer_pending(conn, principal, entry_id)
        return await _changed(conn, principal, thread_id, entry_id)


async def reorder_inbox(
    service: Service, principal: Principal, thread_id: str, entry_ids: Any, *, expected_version: int | None = None
) -> InboxReordered:
    """`PUT /v1/threads/{id}/inbox/order`: `entry_ids` must list exactly the pending entries (else 400 with the
    missing, unexpected and duplicated ids, S-74); they take the positions the pending entries hold, in that order.
    A list that changes nothing leaves the version as it is."""
    require(principal, "run")
    order = checked_entry_order(entry_ids)
    async with write_transaction(service.engine) as conn:
        await _writable_thread(conn, principal, thread_id, expected_version)
        pending = await threads.pending_entries(conn, thread_id=thread_id)
        mismatch = order_mismatch([entry.id for entry in pending], order)
        if mismatch is not None:
            raise InvalidArgument(reason="inbox_order_mismatch", details=mismatch.details())
        moves = reordered_positions([(entry.id, entry.position) for entry in pending], order)
        if moves:
            await inbox.move_pending_entries(conn, thread_id=thread_id, moves=moves)
            await threads.touch_thread(conn, thread_id=thread_id, inbox_changed=True)  # S-75
        thread = still_there(
            await views.get_thread(conn, workspace_id=principal.workspace_id, thread_id=thread_id), "thread"
        )
        return InboxReordered(thread=thread, entries=await threads.pending_entries(conn, thread_id=thread_id))
