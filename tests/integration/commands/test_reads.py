"""Reads and workspace scoping (§4.4, §8.3): S-126."""

from __future__ import annotations

from typing import Any

import pytest

from candor.service import commands
from candor.service.errors import Forbidden, InvalidArgument, NotFound

from commands.helpers import TEXT, claim_run, make_service, new_key, seal_run


async def test_lists_runs_newest_first_and_attempts_in_order(db: Any) -> None:
    """§8.3: runs newest first (keyset paging with `before`); attempts in number order."""
    service = make_service(db)
    key = await new_key(service)
    accepted = await commands.create_thread(service, key, agent="demo", input=TEXT, key="k")
    assert accepted.run is not None
    await seal_run(service, accepted.run.id, "completed")
    second = await commands.post_input(service, key, accepted.thread.id, input=TEXT, key="p")
    listed = await commands.list_runs(service, key, accepted.thread.id)
    assert second.run is not None
    assert [r.id for r in listed] == [second.run.id, accepted.run.id]
    page = await commands.list_runs(service, key, accepted.thread.id, limit=1)
    rest = await commands.list_runs(service, key, accepted.thread.id, before=(page[0].created_at, page[0].id))
    assert [r.id for r in page + rest] == [r.id for r in listed]
    await claim_run(service, second.run.id)
    attempts = await commands.list_attempts(service, key, second.run.id)
    assert [(a.number, a.status, a.start_reason) for a in attempts] == [(1, "leased", "initial")]
    with pytest.raises(InvalidArgument):
        await commands.list_runs(service, key, accepted.thread.id, limit=101)


async def test_other_workspaces_ids_are_not_found(db: Any) -> None:
    """S-126: every read or write with an id of another workspace answers 404 `not_found`, like an unknown id."""
    service = make_service(db)
    owner = await new_key(service)
    stranger = await new_key(service)
    accepted = await commands.create_thread(service, owner, agent="demo", input=TEXT, key="k")
    assert accepted.thread is not None
    assert accepted.run is not None
    thread_id, run_id = accepted.thread.id, accepted.run.id
    calls = [
        commands.get_thread(service, stranger, thread_id),
        commands.get_run(service, stranger, run_id),
        commands.list_runs(service, stranger, thread_id),
        commands.list_attempts(service, stranger, run_id),
        commands.post_input(service, stranger, thread_id, input=TEXT, key="k"),
        commands.interrupt_run(service, stranger, run_id),
        commands.archive_thread(service, stranger, thread_id),
        commands.fork_run(service, stranger, run_id, input=TEXT, key="f"),
        commands.resume_run(service, stranger, run_id, {"approvals": {}, "calls": {}}, key="r"),
    ]
    for call in calls:
        with pytest.raises(NotFound) as caught:
            await call
        assert caught.value.code == "not_found" and caught.value.id in (thread_id, run_id)
    unknown = "thr_" + "0" * 32
    with pytest.raises(NotFound) as caught:
        await commands.get_thread(service, owner, unknown)
    assert caught.value.details == {"kind": "thread", "id": unknown}
    assert (await commands.get_run(service, owner, run_id)).status == "accepted"


async def test_reads_need_read_permission(db: Any) -> None:
    """S-101: a key without `read` is forbidden to read."""
    service = make_service(db)
    owner = await new_key(service)
    runner = await new_key(service, owner.workspace_id, permissions=["run"])
    accepted = await commands.create_thread(service, owner, agent="demo", input=TEXT, key="k")
    with pytest.raises(Forbidden):
        await commands.get_thread(service, runner, accepted.thread.id)
