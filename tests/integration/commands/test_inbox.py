"""Inbox entry management (§8.3, §8.5): list, read, edit, withdraw and reorder entries. S-68, S-73, S-74, S-75,
S-76, S-92, S-97, S-126, S-128."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import update

from candor.service import commands
from candor.service.errors import (
    Conflict,
    Disabled,
    EntryTooLarge,
    Forbidden,
    InvalidArgument,
    NotFound,
    NotSubmitter,
    PreconditionFailed,
    RateLimited,
)
from candor.service.store.db.engine import write_transaction
from candor.service.store.schema.tables import inbox_entries
from candor.service.store.threads.submit import options_digest, payload_size
from candor.service.store.workspaces import auth as auth

from commands.helpers import TEXT, entry_row, make_service, new_key, seal_run, text, thread_row


async def _waiting_thread(service: Any, key: Any, posts: int = 1) -> tuple[str, list[str]]:
    """A thread whose last run waits, so posted entries stay `pending` (S-69); the ids of `posts` such entries."""
    accepted = await commands.create_thread(service, key, agent="demo", input=TEXT, key="create")
    assert accepted.run is not None
    await seal_run(service, accepted.run.id, "waiting")
    entry_ids = []
    for i in range(posts):
        posted = await commands.post_input(service, key, accepted.thread.id, input=text(f"m{i}"), key=f"p{i}")
        entry_ids.append(posted.entry.id)
    return accepted.thread.id, entry_ids


async def _version(service: Any, thread_id: str) -> int:
    return (await thread_row(service, thread_id)).version


async def test_edit_replaces_the_given_fields_and_recomputes_size(db: Any) -> None:
    """§8.3, S-74, S-75: the submitter edits a pending entry; size and options digest follow the new content, the
    thread's version increments, and the post's key still replays (it answers the entry as it is now)."""
    service = make_service(db)
    key = await new_key(service)
    thread_id, (entry_id,) = await _waiting_thread(service, key)
    before = await entry_row(service, key.workspace_id, entry_id)
    version = await _version(service, thread_id)
    longer = text("a much longer message than before")
    changed = await commands.edit_entry(
        service,
        key,
        thread_id,
        entry_id,
        {"input": longer, "delivery": "steer", "agent": "other", "options": {"tone": "brief"}},
        expected_version=version,
    )
    entry = changed.entry
    assert (entry.payload, entry.delivery, entry.agent, entry.options) == (longer, "steer", "other", {"tone": "brief"})
    assert entry.size == payload_size(longer) > before.size
    assert entry.options_digest == options_digest({"tone": "brief"})
    assert (entry.status, entry.position, entry.request_digest) == ("pending", before.position, before.request_digest)
    assert changed.thread.version == version + 1 == await _version(service, thread_id)
    cleared = await commands.edit_entry(
        service, key, thread_id, entry_id, {"agent": None, "options": None}, expected_version=version + 1
    )
    assert (cleared.entry.agent, cleared.entry.options, cleared.entry.options_digest) == (None, None, None)
    assert cleared.entry.payload == longer and cleared.thread.version == version + 2
    replay = await commands.post_input(service, key, thread_id, input=text("m0"), key="p0")
    assert not replay.created and replay.entry.id == entry_id and replay.entry.payload == longer


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({}, "body"),
        ({"status": "consumed"}, "status"),
        ({"input": {"content": []}}, "input"),
        ({"input": None}, "input"),
        ({"delivery": "later"}, "delivery"),
        ({"agent": "missing"}, "agent"),
        ({"agent": ""}, "agent"),
        ({"options": {"blob": "x" * (64 * 1024)}}, "options"),
        ({"options": {"client_tools": [{"name": "1bad", "parameters": {}}]}}, "options.client_tools.0.name"),
    ],
)
async def test_edit_is_checked_like_a_post(db: Any, changes: dict[str, Any], field: str) -> None:
    """§8.5, S-74: an edit's fields are validated as a post's (400 naming the field); nothing changes."""
    service = make_service(db)
    key = await new_key(service)
    thread_id, (entry_id,) = await _waiting_thread(service, key)
    before, version = await entry_row(service, key.workspace_id, entry_id), await _version(service, thread_id)
    with pytest.raises(InvalidArgument) as caught:
        await commands.edit_entry(service, key, thread_id, entry_id, changes, expected_version=version)
    assert caught.value.fields[0][0] == field
    assert await entry_row(service, key.workspace_id, entry_id) == before
    assert await _version(service, thread_id) == version


async def test_only_pending_entries_change(db: Any) -> None:
    """S-74, S-76: editing or withdrawing an assigned, consumed, withdrawn or failed entry → 409 `entry_<status>`."""
    service = make_service(db)
    key = await new_key(service)
    accepted = await commands.create_thread(service, key, agent="demo", input=TEXT, key="create")
    thread_id, first = accepted.thread.id, accepted.entry.id
    with pytest.raises(Conflict) as caught:
        await commands.edit_entry(service, key, thread_id, first, {"input": TEXT})
    assert (caught.value.reason, caught.value.kind, caught.value.id) == ("entry_assigned", "entry", first)
    assert accepted.run is not None
    await seal_run(service, accepted.run.id, "waiting")
    posted = await commands.post_input(service, key, thread_id, input=TEXT, key="p")
    await commands.withdraw_entry(service, key, thread_id, posted.entry.id)
    failed = await commands.post_input(service, key, thread_id, input=TEXT, key="f")
    async with write_transaction(service.engine) as conn:  # as `advance_thread` fails an entry that cannot start
        await conn.execute(
            update(inbox_entries)
            .where(inbox_entries.c.id == failed.entry.id)
            .values(status="failed", failure={"code": "agent_unavailable", "message": "x"})
        )
    version = await _version(service, thread_id)
    cases = ((first, "entry_consumed"), (posted.entry.id, "entry_withdrawn"), (failed.entry.id, "entry_failed"))
    for entry_id, reason in cases:
        with pytest.raises(Conflict) as caught:
            await commands.withdraw_entry(service, key, thread_id, entry_id, expected_version=version)
        assert caught.value.reason == reason
        with pytest.raises(Conflict) as caught:
            await commands.edit_entry(service, key, thread_id, entry_id, {"input": TEXT}, expected_version=version)
        assert caught.value.reason == reason
    assert await _version(service, thread_id) == version


async def test_only_the_submitter_changes_an_entry(db: Any) -> None:
    """S-74: another key of the workspace (even an admin) → 403; a key without `run` → 403 before anything."""
    service = make_service(db)
    key = await new_key(service)
    thread_id, (entry_id,) = await _waiting_thread(service, key)
    other = await new_key(service, key.workspace_id)
    reader = await new_key(service, key.workspace_id, permissions=("read",))
    before = await entry_row(service, key.workspace_id, entry_id)
    for change in (
        commands.edit_entry(service, other, thread_id, entry_id, {"input": TEXT}),
        commands.withdraw_entry(service, other, thread_id, entry_id),
    ):
        with pytest.raises(NotSubmitter) as caught:
            await change
        assert caught.value.code == "forbidden" and caught.value.details["reason"] == "not_submitter"
    with pytest.raises(Forbidden) as denied:
        await commands.withdraw_entry(service, reader, thread_id, entry_id)
    assert denied.value.details == {"permission": "run"}
    assert await entry_row(service, key.workspace_id, entry_id) == before


async def test_stale_if_match_changes_nothing(db: Any) -> None:
    """S-97, S-75: every inbox change moves the thread's ETag, so an edit with the previous version → 412."""
    service = make_service(db)
    key = await new_key(service)
    thread_id, (first, second) = await _waiting_thread(service, key, posts=2)
    version = await _version(service, thread_id)
    await commands.withdraw_entry(service, key, thread_id, first, expected_version=version)
    with pytest.raises(PreconditionFailed) as caught:
        await commands.edit_entry(service, key, thread_id, second, {"input": text("x")}, expected_version=version)
    assert caught.value.details == {"current_etag": f'"{thread_id}:{version + 1}"'}
    with pytest.raises(PreconditionFailed):
        await commands.reorder_inbox(service, key, thread_id, [second], expected_version=version)
    assert (await entry_row(service, key.workspace_id, second)).payload == text("m1")


async def test_withdraw_keeps_the_key_and_frees_the_inbox(db: Any) -> None:
    """§8.2, S-92, S-76, S-73: a withdrawn entry is final, keeps its key, and no longer counts against the inbox."""
    service = make_service(db, control={"inbox_count": 1})  # the first entry was consumed by the waiting run
    key = await new_key(service)
    thread_id, (entry_id,) = await _waiting_thread(service, key)
    with pytest.raises(RateLimited):
        await commands.post_input(service, key, thread_id, input=TEXT, key="full")
    withdrawn = await commands.withdraw_entry(service, key, thread_id, entry_id)
    assert withdrawn.entry.status == "withdrawn" and withdrawn.entry.finished_at is not None
    replay = await commands.post_input(service, key, thread_id, input=text("m0"), key="p0")
    assert not replay.created and replay.entry.id == entry_id and replay.entry.status == "withdrawn"
    assert (await commands.post_input(service, key, thread_id, input=TEXT, key="room")).created


async def test_edit_must_fit_the_inbox(db: Any) -> None:
    """S-73: an edit that would take the inbox over `inbox_bytes` → 429; one whose entry alone is larger → 413
    `EntryTooLarge` (issue 14); one that shrinks the entry is allowed."""
    service = make_service(db, control={"inbox_bytes": 300})
    key = await new_key(service)
    thread_id, (entry_id,) = await _waiting_thread(service, key)
    await commands.post_input(service, key, thread_id, input=TEXT, key="another")
    with pytest.raises(RateLimited):
        await commands.edit_entry(service, key, thread_id, entry_id, {"input": text("x" * 250)})
    with pytest.raises(EntryTooLarge):
        await commands.edit_entry(service, key, thread_id, entry_id, {"input": text("x" * 300)})
    strict = make_service(db, control={"inbox_bytes": 100})  # the limit was lowered below the current usage
    shrunk = await commands.edit_entry(strict, key, thread_id, entry_id, {"input": text("")})
    assert shrunk.entry.payload == text("")


async def test_steer_edit_must_match_the_active_run(db: Any) -> None:
    """S-68: while a run is active, making an entry a steer for another agent → 409 `run_configuration_immutable`."""
    service = make_service(db)
    key = await new_key(service)
    accepted = await commands.create_thread(service, key, agent="demo", input=TEXT, key="create")
    posted = await commands.post_input(service, key, accepted.thread.id, input=TEXT, agent="other", key="p")
    with pytest.raises(Conflict) as caught:
        await commands.edit_entry(service, key, accepted.thread.id, posted.entry.id, {"delivery": "steer"})
    assert caught.value.reason == "run_configuration_immutable"
    steer = await commands.edit_entry(
        service, key, accepted.thread.id, posted.entry.id, {"delivery": "steer", "agent": None}
    )
    assert (steer.entry.delivery, steer.entry.agent) == ("steer", None)


async def test_archived_thread_and_workspace(db: Any) -> None:
    """§8.5, S-128: inbox changes on an archived thread → 409 `archived`; in an archived workspace → 422."""
    service = make_service(db)
    key = await new_key(service)
    thread_id, (entry_id,) = await _waiting_thread(service, key)
    await commands.archive_thread(service, key, thread_id)
    for change in (
        commands.edit_entry(service, key, thread_id, entry_id, {"input": TEXT}),
        commands.withdraw_entry(service, key, thread_id, entry_id),
        commands.reorder_inbox(service, key, thread_id, []),
    ):
        with pytest.raises(Conflict) as caught:
            await change
        assert caught.value.reason == "archived"
    live = await new_key(service)
    live_thread, (live_entry,) = await _waiting_thread(service, live)
    async with write_transaction(service.engine) as conn:
        await auth.archive_workspace(conn, live.workspace_id)
    with pytest.raises(Disabled):
        await commands.withdraw_entry(service, live, live_thread, live_entry)


async def test_other_workspaces_and_threads_are_not_found(db: Any) -> None:
    """S-126: another workspace's thread, or an entry of another thread, → 404 for reads and changes."""
    service = make_service(db)
    key = await new_key(service)
    thread_id, (entry_id,) = await _waiting_thread(service, key)
    stranger = await new_key(service)
    for call in (
        commands.get_entry(service, stranger, thread_id, entry_id),
        commands.list_entries_page(service, stranger, thread_id),
        commands.edit_entry(service, stranger, thread_id, entry_id, {"input": TEXT}),
        commands.withdraw_entry(service, stranger, thread_id, entry_id),
        commands.reorder_inbox(service, stranger, thread_id, [entry_id]),
    ):
        with pytest.raises(NotFound) as caught:
            await call
        assert caught.value.details == {"kind": "thread", "id": thread_id}
    sibling = await commands.create_thread(service, key, agent="demo", input=TEXT, key="sibling")
    for call in (
        commands.get_entry(service, key, sibling.thread.id, entry_id),
        commands.withdraw_entry(service, key, sibling.thread.id, entry_id),
    ):
        with pytest.raises(NotFound) as caught:
            await call
        assert caught.value.details == {"kind": "entry", "id": entry_id}


async def test_reorder_renumbers_the_pending_entries(db: Any) -> None:
    """S-74, S-75: a reorder listing exactly the pending entries gives them their positions in that order (unique
    and positive on both databases); later posts go to the end; the version increments."""
    service = make_service(db)
    key = await new_key(service)
    thread_id, ids = await _waiting_thread(service, key, posts=3)
    version = await _version(service, thread_id)
    order = [ids[2], ids[0], ids[1]]
    reordered = await commands.reorder_inbox(service, key, thread_id, order, expected_version=version)
    assert [entry.id for entry in reordered.entries] == order
    assert [entry.position for entry in reordered.entries] == [2, 3, 4]
    assert reordered.thread.version == version + 1
    same = await commands.reorder_inbox(service, key, thread_id, order, expected_version=version + 1)
    assert same.thread.version == version + 1  # nothing moved: no change
    posted = await commands.post_input(service, key, thread_id, input=TEXT, key="after")
    assert posted.entry.position == 5
    page, more = await commands.list_entries_page(service, key, thread_id, status="pending")
    assert [entry.id for entry in page] == [*order, posted.entry.id] and not more


@pytest.mark.parametrize(
    ("listed", "missing", "unexpected", "duplicated"),
    [
        (lambda ids: ids[:1], [1], [], []),
        (lambda ids: [*ids, "ent_nope"], [], ["ent_nope"], []),
        (lambda ids: [ids[0], ids[0], ids[1]], [], [], [0]),
    ],
)
async def test_reorder_must_list_exactly_the_pending_entries(
    db: Any, listed: Any, missing: list[int], unexpected: list[str], duplicated: list[int]
) -> None:
    """S-74: a reorder that does not list exactly the pending entries → 400 with what is missing or unexpected."""
    service = make_service(db)
    key = await new_key(service)
    thread_id, ids = await _waiting_thread(service, key, posts=2)
    version = await _version(service, thread_id)
    with pytest.raises(InvalidArgument) as caught:
        await commands.reorder_inbox(service, key, thread_id, listed(ids), expected_version=version)
    details = caught.value.details
    assert details["reason"] == "inbox_order_mismatch"
    assert details["missing"] == [ids[i] for i in missing] and details["unexpected"] == unexpected
    assert details["duplicated"] == [ids[i] for i in duplicated]
    assert await _version(service, thread_id) == version
    with pytest.raises(InvalidArgument) as shape:
        await commands.reorder_inbox(service, key, thread_id, "not a list", expected_version=version)
    assert shape.value.fields == (("entry_ids", "invalid"),)


async def test_list_and_read_entries(db: Any) -> None:
    """§8.3: a thread's entries in position order, paged after a position and filterable by status (§5.4)."""
    service = make_service(db)
    key = await new_key(service)
    thread_id, ids = await _waiting_thread(service, key, posts=3)
    first, more = await commands.list_entries_page(service, key, thread_id, limit=2)
    rest, last = await commands.list_entries_page(service, key, thread_id, limit=2, after=first[-1].position)
    assert more and not last
    assert [entry.position for entry in [*first, *rest]] == [1, 2, 3, 4]
    assert [entry.kind for entry in [*first, *rest]] == ["message"] * 4
    async with write_transaction(service.engine) as conn:
        await conn.execute(update(inbox_entries).where(inbox_entries.c.id == ids[1]).values(status="withdrawn"))
    pending, _ = await commands.list_entries_page(service, key, thread_id, status="pending")
    assert [entry.id for entry in pending] == [ids[0], ids[2]]
    assert (await commands.get_entry(service, key, thread_id, ids[1])).status == "withdrawn"
    with pytest.raises(InvalidArgument):
        await commands.list_entries_page(service, key, thread_id, status="nonsense")
    with pytest.raises(InvalidArgument):
        await commands.list_entries_page(service, key, thread_id, limit=0)
