"""Interrupt, archive and fork (§7.12, S-64, §8.3; conflict reasons of §12.2): S-58, S-59, S-60, S-64, S-128."""

from __future__ import annotations

from typing import Any

import pytest

from candor.service import commands
from candor.service.errors import Conflict, Disabled, PreconditionFailed, ServiceError
from candor.service.protocol.outcomes import CANCELLED_MESSAGE
from candor.service.protocol.requests import still_there
from candor.service.store.db.engine import write_transaction
from candor.service.store.schema.tables import run_attempts, runs
from candor.service.store.workspaces import auth as auth

from commands.helpers import TEXT, claim_run, count, entry_row, make_service, new_key, run_row, seal_run, text

ANSWERS = {"approvals": {"a1": {"action": "approve"}}, "calls": {"c1": {"status": "returned", "value": 1}}}


async def test_interrupt_accepted_run_cancels_at_once(db: Any) -> None:
    """S-58: an accepted run is sealed `cancelled` at once, no attempt is created, its entry fails `run_ended`."""
    service = make_service(db)
    key = await new_key(service)
    accepted = await commands.create_thread(service, key, agent="demo", input=TEXT, key="k")
    assert accepted.run is not None
    run = await commands.interrupt_run(service, key, accepted.run.id)
    assert run.status == "cancelled" and run.sealed_at is not None and run.version == 2
    assert run.failure == {"code": "cancelled", "message": CANCELLED_MESSAGE}
    assert await commands.list_attempts(service, key, run.id) == []
    assert await count(service, run_attempts) == 0
    thread = await commands.get_thread(service, key, accepted.thread.id)
    assert (thread.state, thread.current_run_id, thread.last_run_id) == ("paused", None, run.id)
    assert thread.version == accepted.thread.version + 1
    entry = await entry_row(service, key.workspace_id, accepted.entry.id)
    assert entry.status == "failed" and entry.failure is not None and entry.failure["code"] == "run_ended"
    # S-59: interrupting a cancelled run answers 200 and changes nothing.
    assert await commands.interrupt_run(service, key, run.id) == run


async def test_interrupt_running_run_requests_cancellation_once(db: Any) -> None:
    """S-60: a running run gets `cancel_requested_at`; a second interrupt keeps the first."""
    service = make_service(db)
    key = await new_key(service)
    accepted = await commands.create_thread(service, key, agent="demo", input=TEXT, key="k")
    assert accepted.run is not None
    await claim_run(service, accepted.run.id)
    first = await commands.interrupt_run(service, key, accepted.run.id)
    second = await commands.interrupt_run(service, key, accepted.run.id)
    assert first.status == "running" and first.cancel_requested_at is not None
    assert second.cancel_requested_at == first.cancel_requested_at and second.version == first.version


@pytest.mark.parametrize("status", ["completed", "waiting", "failed"])
async def test_interrupt_sealed_run_conflicts(db: Any, status: str) -> None:
    """S-59: interrupting a completed, waiting or failed run → 409 `run_<status>`, nothing changes."""
    service = make_service(db)
    key = await new_key(service)
    accepted = await commands.create_thread(service, key, agent="demo", input=TEXT, key="k")
    assert accepted.run is not None
    sealed = await seal_run(service, accepted.run.id, status)
    with pytest.raises(Conflict) as caught:
        await commands.interrupt_run(service, key, sealed.id)
    assert (caught.value.reason, caught.value.kind, caught.value.id) == (f"run_{status}", "run", sealed.id)
    assert await run_row(service, sealed.id) == sealed


async def test_archive_thread(db: Any) -> None:
    """S-64: archiving withdraws pending entries, interrupts the active run, is idempotent, and later posts,
    resumes and forks answer 409 `archived`."""
    service = make_service(db)
    key = await new_key(service)
    accepted = await commands.create_thread(service, key, agent="demo", input=TEXT, key="k")
    queued = await commands.post_input(service, key, accepted.thread.id, input=TEXT, key="q")
    with pytest.raises(PreconditionFailed) as stale:
        await commands.archive_thread(service, key, accepted.thread.id, expected_version=accepted.thread.version)
    assert stale.value.details == {"current_etag": f'"{accepted.thread.id}:{queued.thread.version}"'}
    archived = await commands.archive_thread(service, key, accepted.thread.id, expected_version=queued.thread.version)
    assert archived.state == "archived" and archived.archived_at is not None and archived.current_run_id is None
    assert (await entry_row(service, key.workspace_id, queued.entry.id)).status == "withdrawn"
    assert accepted.run is not None
    run = await run_row(service, accepted.run.id)
    assert run.status == "cancelled" and run.failure is not None and run.failure["code"] == "cancelled"
    again = await commands.archive_thread(service, key, accepted.thread.id, expected_version=1)
    assert again == archived
    with pytest.raises(Conflict) as caught:
        await commands.fork_run(service, key, run.id, input=TEXT, key="f")
    assert caught.value.reason == "archived"


async def test_archive_thread_with_running_run_requests_cancellation(db: Any) -> None:
    """S-64, S-57: a running run is interrupted (cancellation requested for its worker)."""
    service = make_service(db)
    key = await new_key(service)
    accepted = await commands.create_thread(service, key, agent="demo", input=TEXT, key="k")
    assert accepted.run is not None
    await claim_run(service, accepted.run.id)
    await commands.archive_thread(service, key, accepted.thread.id)
    run = await run_row(service, accepted.run.id)
    assert run.status == "running" and run.cancel_requested_at is not None


@pytest.mark.parametrize("claimed", [False, True])
async def test_fork_of_unsealed_run_conflicts(db: Any, claimed: bool) -> None:
    """§8.3: the origin must be sealed, else 409 `run_accepted` / `run_running`."""
    service = make_service(db)
    key = await new_key(service)
    accepted = await commands.create_thread(service, key, agent="demo", input=TEXT, key="k")
    if claimed:
        assert accepted.run is not None
        await claim_run(service, accepted.run.id)
    with pytest.raises(Conflict) as caught:
        assert accepted.run is not None
        await commands.fork_run(service, key, accepted.run.id, input=TEXT, key="f")
    assert caught.value.reason == ("run_running" if claimed else "run_accepted")


async def test_a_waiting_run_is_not_forked(db: Any) -> None:
    """§8.3, issue 14 (overrides §6's "forking a waiting run passes no batch"): 409 `run_waiting`, since the fork
    could only close the never-approved calls as "may have partly taken effect"; the origin stays waiting and can
    be resumed, and its successor, once sealed, forks."""
    service = make_service(db)
    key = await new_key(service)
    accepted = await commands.create_thread(service, key, agent="demo", input=TEXT, key="k")
    assert accepted.run is not None
    origin = await seal_run(service, accepted.run.id, "waiting")
    with pytest.raises(Conflict) as caught:
        await commands.fork_run(service, key, origin.id, input=text("fork"), key="f")
    assert caught.value.reason == "run_waiting"
    assert (await commands.get_thread(service, key, origin.thread_id)).state == "waiting"
    successor, created = await commands.resume_run(service, key, origin.id, ANSWERS, key="r")
    assert created
    await seal_run(service, successor.id, "completed")
    fork = await commands.fork_run(service, key, successor.id, input=text("fork"), key="f")
    assert fork.created and fork.run is not None and fork.run.parent_run_id == successor.id


async def test_fork_starts_a_new_thread_from_the_origin_checkpoint(db: Any) -> None:
    """§6, §8.3: a fork is a new thread (origin `fork`) whose run (lineage `fork`) starts from the origin's
    checkpoint; a replay returns it; the origin thread is unchanged."""
    service = make_service(db)
    key = await new_key(service)
    accepted = await commands.create_thread(service, key, agent="demo", input=TEXT, options={"o": 1}, key="k")
    assert accepted.run is not None
    origin = await seal_run(service, accepted.run.id, "completed")
    fork = await commands.fork_run(service, key, origin.id, input=text("fork"), key="f")
    assert fork.created and fork.run is not None
    assert (fork.thread.origin, fork.thread.origin_thread_id, fork.thread.origin_run_id) == (
        "fork",
        origin.thread_id,
        origin.id,
    )
    assert fork.thread.id != origin.thread_id and fork.thread.state == "active"
    assert (fork.run.lineage, fork.run.trigger, fork.run.parent_run_id) == ("fork", "input", origin.id)
    assert fork.run.start_checkpoint_id == origin.checkpoint_id and fork.run.options == {"o": 1}
    assert fork.entry.request_kind == "fork" and fork.entry.status == "assigned"
    assert (await run_row(service, origin.id)).status == "completed"
    assert (await commands.get_thread(service, key, origin.thread_id)).state == "idle"
    replay = await commands.fork_run(service, key, origin.id, input=text("fork"), key="f")
    assert replay.run is not None
    assert fork.run is not None
    assert not replay.created and replay.run.id == fork.run.id
    with pytest.raises(Conflict) as caught:
        await commands.fork_run(service, key, origin.id, input=text("other"), key="f")
    assert caught.value.reason == "idempotency_key_reused"


async def test_fork_in_archived_workspace_is_disabled(db: Any) -> None:
    """S-128: forking answers 422 `disabled` once the workspace is archived."""
    service = make_service(db)
    key = await new_key(service)
    accepted = await commands.create_thread(service, key, agent="demo", input=TEXT, key="k")
    assert accepted.run is not None
    await seal_run(service, accepted.run.id, "completed")
    async with write_transaction(service.engine) as conn:
        await auth.archive_workspace(conn, key.workspace_id)
    with pytest.raises(Disabled):
        await commands.fork_run(service, key, accepted.run.id, input=TEXT, key="f")
    assert await count(service, runs) == 1


def test_a_row_gone_within_a_request_is_an_internal_error() -> None:
    """§12.2: a run or thread missing when read again in the same transaction is a stable `internal` error (HTTP
    500) with a message, not an `assert` that `python -O` skips."""
    assert still_there("row", "run") == "row"
    with pytest.raises(ServiceError) as raised:
        still_there(None, "thread")
    assert raised.value.code == "internal" and "thread" in raised.value.message
