"""Creating threads and posting messages (§8.3, §8.5, §8.2): S-1, S-10, S-45, S-64–S-70, S-73, S-75, S-90–S-94,
S-128, S-129."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic_ai.messages import ModelRequest, ModelResponse, TextPart, UserPromptPart
from sqlalchemy import select

from candor.service import commands
from candor.service.errors import Conflict, Disabled, EntryTooLarge, Forbidden, InvalidArgument, RateLimited
from candor.service.store.checkpoints.incremental import load_state
from candor.service.store.db.engine import read_transaction, write_transaction
from candor.service.store.schema.tables import checkpoints, inbox_entries, runs, threads
from candor.service.store.threads.submit import NewEntry, advance_thread, append_entry, lock_thread
from candor.service.store.workspaces import auth as auth

from commands.helpers import TEXT, count, entry_row, make_service, new_key, run_row, seal_run, text, thread_row

_T = datetime(2025, 1, 1, tzinfo=UTC)


async def test_create_thread_starts_a_run(db: Any) -> None:
    """S-65, S-10: a new thread is idle, so its first message starts a run at once with max_attempts copied."""
    service = make_service(db, worker={"max_attempts": 5})
    key = await new_key(service)
    accepted = await commands.create_thread(service, key, agent="demo", input=TEXT, options={"t": 1}, key="k1")
    thread, entry, run = accepted.thread, accepted.entry, accepted.run
    assert accepted.created and run is not None
    assert (run.status, run.trigger, run.lineage, run.max_attempts) == ("accepted", "input", "root", 5)
    assert run.options == {"t": 1} and run.principal_id == key.id and run.source_entry_id == entry.id
    assert run.authority == {"principal_id": key.id, "permissions": ["admin", "read", "run"]}
    assert run.start_checkpoint_id is None and run.available_at is not None and run.attempts == 0
    assert (entry.kind, entry.delivery, entry.status) == ("message", "next_run", "assigned")
    assert entry.assigned_run_id == run.id and run.agent == "demo"
    assert entry.position == 1 and entry.payload == TEXT and entry.request_kind == "thread"
    assert (thread.state, thread.origin, thread.current_run_id, thread.agent) == ("active", "new", run.id, "demo")
    assert service.wakeups.is_set()
    # S-10: changing the setting later does not change existing runs.
    later = make_service(db, worker={"max_attempts": 2})
    assert (await run_row(later, run.id)).max_attempts == 5


async def test_message_history_is_the_seq_zero_checkpoint(db: Any) -> None:
    """S-45: message_history is stored once, as a seq-0 checkpoint without a run, where the first run starts."""
    service = make_service(db)
    key = await new_key(service)
    history = [
        ModelRequest(parts=[UserPromptPart(content="hi", timestamp=_T)]),
        ModelResponse(parts=[TextPart(content="hello")], timestamp=_T),
    ]
    accepted = await commands.create_thread(service, key, agent="demo", input=TEXT, message_history=history, key="k")
    assert accepted.run is not None
    base = accepted.thread.base_checkpoint_id
    assert base is not None and accepted.run.start_checkpoint_id == base
    async with read_transaction(service.engine) as conn:
        rows = (await conn.execute(select(checkpoints))).mappings().all()
        state = (await load_state(conn, base)).state
    assert [(r["id"], r["seq"], r["run_id"]) for r in rows] == [(base, 0, None)]
    assert list(state.message_history) == history and state.thread_id == accepted.thread.id


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"agent": "missing"}, "agent"),
        ({"options": {"blob": "x" * (64 * 1024)}}, "options"),
        ({"input": {"content": []}}, "input"),
        ({"input": {"content": [{"type": "image", "url": "x"}]}}, "input"),
        ({"message_history": [{"kind": "nonsense"}]}, "message_history"),
        ({"key": "bad key"}, "Idempotency-Key"),
    ],
)
async def test_create_thread_validation(db: Any, changes: dict[str, Any], field: str) -> None:
    """§8.5: an agent that is not configured → 400 field `agent`; options over 64 KiB, bad input, bad key → 400."""
    service = make_service(db)
    key = await new_key(service)
    request = {"agent": "demo", "input": TEXT, "key": "k"} | changes
    with pytest.raises(InvalidArgument) as caught:
        await commands.create_thread(service, key, **request)
    assert caught.value.fields[0][0] == field
    assert await count(service, threads) == 0


async def test_create_thread_needs_run_permission(db: Any) -> None:
    """S-101: a key without `run` is forbidden."""
    service = make_service(db)
    reader = await new_key(service, permissions=["read"])
    with pytest.raises(Forbidden):
        await commands.create_thread(service, reader, agent="demo", input=TEXT, key="k")


async def test_create_thread_replay_and_key_reuse(db: Any) -> None:
    """S-90, S-94: the same key and body → 200 with the original objects as they are now; another body → 409."""
    service = make_service(db)
    key = await new_key(service)
    first = await commands.create_thread(service, key, agent="demo", input=TEXT, key="k")
    assert first.run is not None
    await seal_run(service, first.run.id, "completed")
    service.wakeups.clear()
    again = await commands.create_thread(service, key, agent="demo", input=TEXT, key="k")
    assert not again.created and not service.wakeups.is_set()
    assert (again.thread.id, again.entry.id) == (first.thread.id, first.entry.id)
    assert again.run is not None and again.run.id == first.run.id and again.run.status == "completed"
    assert again.entry.status == "consumed" and again.thread.state == "idle"
    with pytest.raises(Conflict) as caught:
        await commands.create_thread(service, key, agent="demo", input=text("other"), key="k")
    assert caught.value.reason == "idempotency_key_reused"
    assert await count(service, threads) == 1


async def test_keys_are_scoped_per_principal_and_workspace(db: Any) -> None:
    """S-91, S-129: the same key from another principal, or from another workspace, creates new resources."""
    service = make_service(db)
    key = await new_key(service)
    colleague = await new_key(service, key.workspace_id)
    stranger = await new_key(service)
    made = [
        await commands.create_thread(service, p, agent="demo", input=TEXT, key="same")
        for p in (key, colleague, stranger)
    ]
    assert all(a.created for a in made)
    assert len({a.thread.id for a in made}) == 3
    assert made[2].thread.workspace_id == stranger.workspace_id != key.workspace_id


async def test_racing_identical_creates_make_one_thread(db: Any) -> None:
    """§8.2: when duplicates race, the unique index decides and the loser is answered as a replay."""
    service = make_service(db)
    key = await new_key(service)
    results = await asyncio.gather(
        *(commands.create_thread(service, key, agent="demo", input=TEXT, key="k") for _ in range(2))
    )
    assert sorted(a.created for a in results) == [False, True]
    assert len({a.thread.id for a in results}) == 1
    assert await count(service, threads) == 1 and await count(service, runs) == 1


async def test_archived_workspace_refuses_writes_but_reads_work(db: Any) -> None:
    """S-128: after archiving, creating threads and posting answer 422 `disabled`; GET keeps working."""
    service = make_service(db)
    key = await new_key(service)
    accepted = await commands.create_thread(service, key, agent="demo", input=TEXT, key="k")
    async with write_transaction(service.engine) as conn:
        await auth.archive_workspace(conn, key.workspace_id)
    with pytest.raises(Disabled):
        await commands.create_thread(service, key, agent="demo", input=TEXT, key="k2")
    with pytest.raises(Disabled):
        await commands.post_input(service, key, accepted.thread.id, input=TEXT, key="k3")
    assert (await commands.get_thread(service, key, accepted.thread.id)).id == accepted.thread.id
    # S-94: a replay is recognised before state validation.
    assert not (await commands.create_thread(service, key, agent="demo", input=TEXT, key="k")).created


async def _idle_thread(service: Any, key: Any) -> str:
    accepted = await commands.create_thread(service, key, agent="demo", input=TEXT, key="create")
    assert accepted.run is not None
    await seal_run(service, accepted.run.id, "completed")
    return accepted.thread.id


async def test_post_to_idle_thread_starts_a_run(db: Any) -> None:
    """S-65, §6: a message to an idle thread starts a run that continues from the last sealed run's checkpoint."""
    service = make_service(db)
    key = await new_key(service)
    thread_id = await _idle_thread(service, key)
    last = await run_row(service, (await thread_row(service, thread_id)).last_run_id or "")
    accepted = await commands.post_input(service, key, thread_id, input=text("again"), key="p")
    run = accepted.run
    assert accepted.created and run is not None
    assert (run.trigger, run.lineage, run.parent_run_id) == ("input", "continue", last.id)
    assert run.start_checkpoint_id == last.checkpoint_id is not None
    assert run.options == last.options and accepted.entry.position == 2
    assert accepted.thread.state == "active" and accepted.thread.current_run_id == run.id


async def test_concurrent_posts_start_one_run(db: Any) -> None:
    """S-1: two messages racing onto an idle thread start exactly one run; the other entry stays pending."""
    service = make_service(db)
    key = await new_key(service)
    thread_id = await _idle_thread(service, key)
    results = await asyncio.gather(
        *(commands.post_input(service, key, thread_id, input=text(str(i)), key=f"p{i}") for i in range(2))
    )
    assert sorted(a.run is not None for a in results) == [False, True]
    assert sorted(a.entry.status for a in results) == ["assigned", "pending"]
    assert await count(service, runs, runs.c.thread_id == thread_id, runs.c.status == "accepted") == 1


async def test_post_while_active_stays_pending_and_steer_must_match(db: Any) -> None:
    """S-66, S-68: a message to an active thread stays pending; a steer naming another agent or other options → 409."""
    service = make_service(db)
    key = await new_key(service)
    accepted = await commands.create_thread(service, key, agent="demo", input=TEXT, options={"o": 1}, key="k")
    thread_id = accepted.thread.id
    steer = await commands.post_input(service, key, thread_id, input=TEXT, delivery="steer", key="s1")
    same = await commands.post_input(
        service, key, thread_id, input=TEXT, delivery="steer", agent="demo", options={"o": 1}, key="s2"
    )
    queued = await commands.post_input(service, key, thread_id, input=TEXT, agent="other", key="n1")
    for result in (steer, same, queued):
        assert result.run is None and result.entry.status == "pending"
    assert steer.entry.agent is None and steer.entry.options is None
    for changes in ({"agent": "other"}, {"options": {"o": 2}}):
        with pytest.raises(Conflict) as caught:
            await commands.post_input(service, key, thread_id, input=TEXT, delivery="steer", key="bad", **changes)
        assert caught.value is not None
        assert accepted.run is not None
        assert caught.value.reason == "run_configuration_immutable" and caught.value.id == accepted.run.id
    assert await count(service, inbox_entries) == 4


async def test_post_while_waiting_queues(db: Any) -> None:
    """S-69: while the last run is waiting, posted messages queue (run null) and start nothing."""
    service = make_service(db)
    key = await new_key(service)
    accepted = await commands.create_thread(service, key, agent="demo", input=TEXT, key="k")
    assert accepted.run is not None
    await seal_run(service, accepted.run.id, "waiting")
    posted = await commands.post_input(service, key, accepted.thread.id, input=TEXT, key="p")
    assert posted.created and posted.run is None and posted.entry.status == "pending"
    assert posted.thread.state == "waiting"
    assert await count(service, runs) == 1


async def test_paused_thread_starts_new_message_and_queue_resumes_after(db: Any) -> None:
    """S-70: after a failed run queued entries do not start; a new message starts a run; the queue resumes after."""
    service = make_service(db)
    key = await new_key(service)
    accepted = await commands.create_thread(service, key, agent="demo", input=TEXT, key="k")
    thread_id = accepted.thread.id
    queued = await commands.post_input(service, key, thread_id, input=text("queued"), key="q")
    assert accepted.run is not None
    await seal_run(service, accepted.run.id, "failed")
    assert (await thread_row(service, thread_id)).state == "paused"
    assert await _advance(service, thread_id) is None
    fresh = await commands.post_input(service, key, thread_id, input=text("new"), key="n")
    assert fresh.run is not None and fresh.run.trigger == "input" and fresh.run.lineage == "continue"
    assert (await commands.get_thread(service, key, thread_id)).state == "active"
    await seal_run(service, fresh.run.id, "completed")
    started = await _advance(service, thread_id)
    run = await run_row(service, started or "")
    assert (run.trigger, run.source_entry_id, run.parent_run_id) == ("queued", queued.entry.id, fresh.run.id)


async def _advance(service: Any, thread_id: str, agent_names: Any = None) -> str | None:
    async with write_transaction(service.engine) as conn:
        return await advance_thread(
            conn,
            thread_id=thread_id,
            settings=service.settings,
            agent_names=service.agents.names() if agent_names is None else agent_names,
        )


async def test_entries_that_cannot_start_fail_and_later_ones_start(db: Any) -> None:
    """S-72, S-61, S-128: entries of a disabled key or a removed agent fail in place; the next entry starts."""
    service = make_service(db)
    key = await new_key(service)
    doomed = await new_key(service, key.workspace_id, permissions=["read", "run"])
    accepted = await commands.create_thread(service, key, agent="demo", input=TEXT, key="k")
    thread_id = accepted.thread.id
    revoked = await commands.post_input(service, doomed, thread_id, input=TEXT, key="a")
    removed = await commands.post_input(service, key, thread_id, input=TEXT, agent="other", key="b")
    good = await commands.post_input(service, key, thread_id, input=TEXT, key="c")
    async with write_transaction(service.engine) as conn:
        await auth.disable_principal(conn, principal_id=doomed.id)
    assert accepted.run is not None
    await seal_run(service, accepted.run.id, "completed")
    before = (await thread_row(service, thread_id)).version
    started = await _advance(service, thread_id, agent_names=("demo",))
    run = await run_row(service, started or "")
    assert run.source_entry_id == good.entry.id and run.trigger == "queued" and run.agent == "demo"
    entries = [await entry_row(service, key.workspace_id, x.entry.id) for x in (revoked, removed, good)]
    states = {e.id: (e.status, (e.failure or {}).get("code")) for e in entries}
    assert states == {
        revoked.entry.id: ("failed", "authority_revoked"),
        removed.entry.id: ("failed", "agent_unavailable"),
        good.entry.id: ("assigned", None),
    }
    assert (await thread_row(service, thread_id)).version == before + 1
    # S-128: in an archived workspace queued entries fail in place with `disabled`.
    last = await commands.post_input(service, key, thread_id, input=TEXT, key="d")
    await seal_run(service, run.id, "completed")
    async with write_transaction(service.engine) as conn:
        await auth.archive_workspace(conn, key.workspace_id)
    assert await _advance(service, thread_id) is None
    entry = await entry_row(service, key.workspace_id, last.entry.id)
    assert entry.status == "failed" and entry.failure is not None and entry.failure["code"] == "disabled"


async def test_inbox_limits(db: Any) -> None:
    """S-73: a post beyond `control.inbox_count` or `control.inbox_bytes` → 429 with the counts and limits."""
    service = make_service(db, control={"inbox_count": 2, "inbox_bytes": 400})
    key = await new_key(service)
    accepted = await commands.create_thread(service, key, agent="demo", input=TEXT, key="k")
    await commands.post_input(service, key, accepted.thread.id, input=TEXT, key="p1")
    with pytest.raises(RateLimited) as caught:
        await commands.post_input(service, key, accepted.thread.id, input=TEXT, key="p2")
    size = accepted.entry.size
    assert caught.value.details == {
        "count": 2,
        "bytes": 2 * size,
        "count_limit": 2,
        "bytes_limit": 400,
        "retry_after_seconds": 1,
    }
    roomy = make_service(db, control={"inbox_bytes": 400})
    with pytest.raises(RateLimited):
        await commands.post_input(roomy, key, accepted.thread.id, input=text("x" * 300), key="p3")
    with pytest.raises(EntryTooLarge):  # alone larger than the inbox: it could never fit (issue 14)
        await commands.post_input(roomy, key, accepted.thread.id, input=text("x" * 400), key="p4")
    assert await count(service, inbox_entries) == 2


async def test_every_post_increments_the_thread_version(db: Any) -> None:
    """S-75: every inbox change increments the thread's version."""
    service = make_service(db)
    key = await new_key(service)
    accepted = await commands.create_thread(service, key, agent="demo", input=TEXT, key="k")
    versions = [accepted.thread.version]
    for i in range(3):
        posted = await commands.post_input(service, key, accepted.thread.id, input=TEXT, key=f"p{i}")
        versions.append(posted.thread.version)
    assert versions == [versions[0] + i for i in range(4)]


async def test_post_replay_and_key_reuse(db: Any) -> None:
    """S-90, S-94, S-82-like for messages: same key and body → replay even after the state moved on; other → 409."""
    service = make_service(db)
    key = await new_key(service)
    accepted = await commands.create_thread(service, key, agent="demo", input=TEXT, key="k")
    first = await commands.post_input(service, key, accepted.thread.id, input=TEXT, key="p")
    await commands.archive_thread(service, key, accepted.thread.id)
    again = await commands.post_input(service, key, accepted.thread.id, input=TEXT, key="p")
    assert not again.created and again.entry.id == first.entry.id
    assert again.entry.status == "withdrawn"  # S-92: a withdrawn entry keeps its key
    for changes in ({"input": text("other")}, {"delivery": "steer"}):
        with pytest.raises(Conflict) as caught:
            await commands.post_input(service, key, accepted.thread.id, **({"input": TEXT} | changes), key="p")
        assert caught.value.reason == "idempotency_key_reused"


async def test_post_to_archived_thread_conflicts(db: Any) -> None:
    """S-64: posting to an archived thread → 409 `archived`."""
    service = make_service(db)
    key = await new_key(service)
    accepted = await commands.create_thread(service, key, agent="demo", input=TEXT, key="k")
    await commands.archive_thread(service, key, accepted.thread.id)
    with pytest.raises(Conflict) as caught:
        await commands.post_input(service, key, accepted.thread.id, input=TEXT, key="p")
    assert caught.value.reason == "archived"


async def test_idle_thread_starts_child_results_and_undelivered_steers(db: Any) -> None:
    """S-72, §8.5, §9.5: on an idle thread every pending entry gets its turn in position order, steer entries left
    over by a completed run included; a child result starts a run (trigger `child_result`) under the last run's key."""
    service = make_service(db)
    key = await new_key(service)
    accepted = await commands.create_thread(service, key, agent="demo", input=TEXT, key="k")
    thread_id = accepted.thread.id
    async with write_transaction(service.engine) as conn:
        await lock_thread(conn, thread_id=thread_id, workspace_id=key.workspace_id)
        child = await append_entry(
            conn,
            NewEntry(
                workspace_id=key.workspace_id,
                thread_id=thread_id,
                kind="child_result",
                delivery="steer",
                payload=text("child"),
                principal_id=None,
                authority=None,
                child_run_id="run_" + "1" * 32,
            ),
            entropy=service.entropy,
        )
    steer = await commands.post_input(service, key, thread_id, input=TEXT, delivery="steer", key="s")
    assert accepted.run is not None
    await seal_run(service, accepted.run.id, "completed")
    first = await run_row(service, await _advance(service, thread_id) or "")
    assert (first.trigger, first.source_entry_id, first.principal_id) == ("child_result", child.id, key.id)
    assert await _advance(service, thread_id) is None  # active now
    await seal_run(service, first.id, "completed")
    second = await run_row(service, await _advance(service, thread_id) or "")
    assert (second.trigger, second.source_entry_id, second.parent_run_id) == ("queued", steer.entry.id, first.id)
