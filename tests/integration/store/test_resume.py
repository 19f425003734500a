"""store/resume.py on every backend (§8.6): the resume's one-statement read and its guarded successor start (S-77,
S-81, S-83, S-84, S-85, S-126). Moved from the resume command's tests, whose `_waiting` runs they reuse."""

from __future__ import annotations

from typing import Any

import pytest

from candor.service import commands
from candor.service.errors import RaceLost
from candor.service.protocol.idempotency import resume_digest
from candor.service.protocol.resume import ResumeAnswers, split_resume_lookup, successor_of
from candor.service.store.db.engine import guarded_writes
from candor.service.store.schema.tables import runs
from candor.service.store.threads.resume import GUARD_LOST, read_resume, start_successor

from .test_round_trips import statements
from commands.helpers import count, make_service, new_key, run_row, seal_run, thread_row
from integration.commands.test_resume import ANSWERS, _waiting


async def test_replay_and_target_are_read_together(db: Any) -> None:
    """§8.2, S-81, S-126: one statement reads the key's successor, the run to resume, its thread and the key's
    authority; a run of another workspace is no target, and a successor resumed again with the key that created it
    is both."""
    service = make_service(db)
    key = await new_key(service)
    waiting = await _waiting(service, key)
    successor, _ = await commands.resume_run(service, key, waiting.id, ANSWERS, key="r")
    lookup = {"principal_id": key.id, "workspace_id": key.workspace_id}
    async with guarded_writes(service.engine) as conn:
        with statements(service.engine) as sent:
            found = await read_resume(conn, key="r", run_id=waiting.id, **lookup)
        assert len(sent) == 1
        assert (found.replay, found.target) == (successor, waiting)
        assert found.thread == await thread_row(service, waiting.thread_id) and found.thread is not None
        assert (found.thread.state, found.thread.current_run_id) == ("active", successor.id)
        assert found.authority is not None and found.authority.verdict() == "allowed"
        assert not found.workspace_has_subscriptions
        fresh = await read_resume(conn, key="other", run_id=waiting.id, **lookup)
        assert (fresh.replay, fresh.target, fresh.thread) == (None, waiting, found.thread)
        elsewhere = await read_resume(conn, principal_id=key.id, key="r", workspace_id="wsp_x", run_id=waiting.id)
        assert (elsewhere.replay, elsewhere.target, elsewhere.thread, elsewhere.authority) == (
            successor,
            None,
            None,
            None,
        )
    both = split_resume_lookup([waiting, successor], key="r", run_id=successor.id, **lookup)
    assert (both.replay, both.target) == (successor, successor)


async def _start_after(service: Any, key: Any, waiting: Any, *, request_key: str) -> Any:
    """The resume's guarded start of `waiting`'s successor, as a request that read the thread waiting would send it."""
    answers = ResumeAnswers.model_validate(ANSWERS)
    successor = successor_of(
        waiting,
        answers=answers,
        resumed_by_id=key.id,
        key=request_key,
        digest=resume_digest(waiting.id, answers.stored_json()),
        max_attempts=3,
    )
    async with guarded_writes(service.engine) as conn:
        return await start_successor(
            conn, successor, entropy=service.entropy, waiting_run_id=waiting.id, workspace_has_subscriptions=False
        )


async def _loses(service: Any, key: Any, waiting: Any, request_key: str) -> None:
    """The guarded start of `waiting`'s successor loses (`RaceLost`), and nothing is written."""
    before = await count(service, runs)
    with pytest.raises(RaceLost) as caught:
        await _start_after(service, key, waiting, request_key=request_key)
    assert caught.value.constraint == GUARD_LOST
    assert await count(service, runs) == before
    assert (await run_row(service, waiting.id)).status == "waiting"


async def test_the_successor_starts_only_while_the_thread_waits_on_the_run(db: Any) -> None:
    """S-77, S-83, S-84, S-85: the successor's start is guarded by what the resume read. After another resume won
    (with another key or the same one), after that winner was sealed (the thread waits on it now) or cancelled, and
    after an archive, the start loses (`RaceLost`) and writes nothing; on an untouched waiting thread it starts the
    successor as the thread's current run."""
    service = make_service(db)
    key = await new_key(service)
    waiting = await _waiting(service, key)
    winner, _ = await commands.resume_run(service, key, waiting.id, ANSWERS, key="w")
    await _loses(service, key, waiting, "r1")  # the winner is the thread's current run
    await _loses(service, key, waiting, "w")  # the same key: the guard decides before the key's index would
    await seal_run(service, winner.id, "waiting")
    await _loses(service, key, waiting, "r2")  # the thread now waits on the winner
    cancelled = await _waiting(service, key, "k2")
    successor, _ = await commands.resume_run(service, key, cancelled.id, ANSWERS, key="c")
    await commands.interrupt_run(service, key, successor.id)  # cancelled before it ran: the thread's last run now
    await _loses(service, key, cancelled, "r3")
    archived = await _waiting(service, key, "k3")
    await commands.archive_thread(service, key, archived.thread_id)
    await _loses(service, key, archived, "r4")
    fresh = await _waiting(service, key, "k4")
    started = await _start_after(service, key, fresh, request_key="r5")
    assert (started.parent_run_id, started.status) == (fresh.id, "accepted")
    assert (await thread_row(service, fresh.thread_id)).current_run_id == started.id
