"""Resume of a waiting run (§8.6): S-77–S-86, S-89, S-128."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import pytest
from sqlalchemy import event, insert, select

from candor.service import commands
from candor.service.commands import runs as runs_commands
from candor.service.errors import Conflict, Disabled, Forbidden, InvalidArgument, NotFound, RaceLost
from candor.service.protocol.pending import Pending, pending_problem
from candor.service.protocol.resume import ResumeAnswers, resume_refusal, successor_of
from candor.service.store.db.engine import read_transaction, write_transaction
from candor.service.store.schema.dialect import db_now
from candor.service.store.schema.tables import outbox, runs, subscriptions
from candor.service.store.threads.resume import read_resume
from candor.service.store.threads.submit import start_run
from candor.service.store.workspaces import auth as auth

from commands.helpers import TEXT, count, make_service, new_key, pending_of, run_row, seal_run, text, thread_row
from integration.store.test_round_trips import statements
from transactions import sent_in_transactions_on_driver

ANSWERS: dict[str, Any] = {
    "approvals": {"a1": {"action": "approve"}},
    "calls": {"c1": {"status": "returned", "value": 42}},
}


async def _waiting(service: Any, key: Any, request_key: str = "k", **pending: Any) -> Any:
    """A thread whose only run is sealed `waiting` with pending items (S-89 shape)."""
    accepted = await commands.create_thread(service, key, agent="demo", input=TEXT, options={"o": 1}, key=request_key)
    assert accepted.run is not None
    return await seal_run(service, accepted.run.id, "waiting", pending=pending_of(**pending) if pending else None)


async def _snapshot(service: Any, run: Any) -> tuple[Any, ...]:
    thread = await thread_row(service, run.thread_id)
    return (await run_row(service, run.id), thread, await count(service, runs))


async def test_waiting_run_pending_shape(db: Any) -> None:
    """S-89: 1–128 items with ids unique across both groups; wait_reason follows the groups."""
    service = make_service(db)
    key = await new_key(service)
    waiting = await _waiting(service, key)
    pending = Pending.model_validate(waiting.pending)
    assert pending_problem(pending.approvals, pending.calls) is None
    assert waiting.wait_reason == "multiple" and waiting.checkpoint_seq >= 1
    second = (await commands.create_thread(service, key, agent="demo", input=TEXT, key="k2")).run
    assert second is not None
    only_calls = await seal_run(
        service,
        second.id,
        "waiting",
        pending=pending_of(approvals=()),
    )
    assert only_calls.wait_reason == "call"
    assert (await commands.get_thread(service, key, waiting.thread_id)).state == "waiting"


async def test_resume_creates_the_successor(db: Any) -> None:
    """S-80, S-86: 201 with a successor (trigger resume, lineage continue, parent, same agent/options/principal/
    authority, resumed_by, body stored); the waiting run stays `waiting` and the thread stops waiting."""
    service = make_service(db, worker={"max_attempts": 4})
    owner = await new_key(service)
    helper = await new_key(service, owner.workspace_id, permissions=["read", "run"])
    waiting = await _waiting(service, owner)
    service.wakeups.clear()
    body = ANSWERS | {"input": text("go on")}
    successor, created = await commands.resume_run(service, helper, waiting.id, body, key="r")
    assert created and service.wakeups.is_set()
    assert (successor.status, successor.trigger, successor.lineage) == ("accepted", "resume", "continue")
    assert successor.parent_run_id == waiting.id and successor.resumed_by_id == helper.id
    assert (successor.agent, successor.options, successor.principal_id, successor.authority) == (
        waiting.agent,
        waiting.options,
        waiting.principal_id,
        waiting.authority,
    )
    assert successor.resume == body and successor.request_key == "r" and successor.source_entry_id is None
    assert successor.start_checkpoint_id == waiting.checkpoint_id and successor.max_attempts == 4
    assert (await run_row(service, waiting.id)).status == "waiting"
    thread = await commands.get_thread(service, owner, waiting.thread_id)
    assert thread.state == "active" and thread.current_run_id == successor.id
    # S-86: the thread does not go back to waiting when the successor fails.
    await seal_run(service, successor.id, "failed")
    assert (await commands.get_thread(service, owner, waiting.thread_id)).state == "paused"
    assert (await run_row(service, waiting.id)).status == "waiting"


async def test_resume_replay_even_after_the_successor_sealed(db: Any) -> None:
    """S-81: the same key and body → 200 with the original successor, also once it has been sealed."""
    service = make_service(db)
    key = await new_key(service)
    waiting = await _waiting(service, key)
    successor, _ = await commands.resume_run(service, key, waiting.id, ANSWERS, key="r")
    await seal_run(service, successor.id, "completed")
    again, created = await commands.resume_run(service, key, waiting.id, dict(ANSWERS), key="r")
    assert not created and again.id == successor.id and again.status == "completed"


async def test_resume_key_reuse_conflicts(db: Any) -> None:
    """S-82: a resume key reused for another body or another run → 409 `idempotency_key_reused`."""
    service = make_service(db)
    key = await new_key(service)
    waiting = await _waiting(service, key)
    await commands.resume_run(service, key, waiting.id, ANSWERS, key="r")
    other_body = {"approvals": {"a1": {"action": "deny"}}, "calls": ANSWERS["calls"]}
    for run_id, body in ((waiting.id, other_body), ("run_" + "0" * 32, ANSWERS)):
        with pytest.raises(Conflict) as caught:
            await commands.resume_run(service, key, run_id, body, key="r")
        assert caught.value.reason == "idempotency_key_reused"


async def test_racing_identical_resumes_create_one_successor(db: Any) -> None:
    """S-83: two identical resumes racing → one successor; one caller gets 201 and the other 200."""
    service = make_service(db)
    key = await new_key(service)
    waiting = await _waiting(service, key)
    results = await asyncio.gather(*(commands.resume_run(service, key, waiting.id, ANSWERS, key="r") for _ in range(2)))
    assert sorted(created for _, created in results) == [False, True]
    assert len({run.id for run, _ in results}) == 1
    assert await count(service, runs, runs.c.parent_run_id == waiting.id) == 1


async def test_racing_different_resumes_create_one_successor(db: Any) -> None:
    """S-1, S-77: two resumes with different keys racing → one successor, the other 409 `not_idle_waiting_run`."""
    service = make_service(db)
    key = await new_key(service)
    waiting = await _waiting(service, key)
    results = await asyncio.gather(
        *(commands.resume_run(service, key, waiting.id, ANSWERS, key=f"r{i}") for i in range(2)),
        return_exceptions=True,
    )
    errors = [r for r in results if isinstance(r, BaseException)]
    assert len(errors) == 1 and isinstance(errors[0], Conflict) and errors[0].reason == "not_idle_waiting_run"
    assert await count(service, runs, runs.c.parent_run_id == waiting.id) == 1


async def test_resume_needs_the_last_idle_waiting_run(db: Any) -> None:
    """S-77, S-85: a run that is not the thread's last, not waiting, or with an active run → 409, nothing changes."""
    service = make_service(db)
    key = await new_key(service)
    waiting = await _waiting(service, key)
    successor, _ = await commands.resume_run(service, key, waiting.id, ANSWERS, key="r")
    before = await _snapshot(service, waiting)
    with pytest.raises(Conflict) as caught:  # an active run on the thread
        await commands.resume_run(service, key, waiting.id, ANSWERS, key="r2")
    assert caught.value.reason == "not_idle_waiting_run"
    await seal_run(service, successor.id, "waiting")
    with pytest.raises(Conflict) as caught:  # no longer the thread's last run
        await commands.resume_run(service, key, waiting.id, ANSWERS, key="r3")
    assert caught.value.reason == "not_idle_waiting_run"
    done = (await commands.create_thread(service, key, agent="demo", input=TEXT, key="k9")).run
    assert done is not None
    await seal_run(service, done.id, "completed")
    with pytest.raises(Conflict) as caught:  # not waiting
        await commands.resume_run(service, key, done.id, ANSWERS, key="r4")
    assert caught.value.reason == "not_idle_waiting_run"
    assert (await run_row(service, waiting.id)).status == "waiting"
    assert before[2] + 1 == await count(service, runs)


@pytest.mark.parametrize(
    ("body", "field", "missing", "unexpected"),
    [
        ({"approvals": {}, "calls": ANSWERS["calls"]}, "approvals", ["a1"], []),
        (ANSWERS | {"calls": ANSWERS["calls"] | {"zz": {"status": "failed", "message": "m"}}}, "calls", [], ["zz"]),
        (
            {"approvals": {"a1": {"action": "approve"}, "c1": {"action": "approve"}}, "calls": {}},
            "body",
            ["c1"],
            ["c1"],
        ),
    ],
)
async def test_resume_coverage_mismatch(
    db: Any, body: Any, field: str, missing: list[str], unexpected: list[str]
) -> None:
    """S-78, S-85: missing, extra or wrong-category ids → 400 `pending_coverage_mismatch` naming every differing id
    of both maps in one error (`field` is `body` when both differ); nothing changes."""
    service = make_service(db)
    key = await new_key(service)
    waiting = await _waiting(service, key)
    before = await _snapshot(service, waiting)
    with pytest.raises(InvalidArgument) as caught:
        await commands.resume_run(service, key, waiting.id, body, key="r")
    details = caught.value.details
    assert {name: details[name] for name in ("field", "reason", "missing", "unexpected")} == {
        "field": field,
        "reason": "pending_coverage_mismatch",
        "missing": missing,
        "unexpected": unexpected,
    }
    assert details["misplaced"] == sorted(set(missing) & set(unexpected))
    assert await _snapshot(service, waiting) == before


@pytest.mark.parametrize(
    "body",
    [
        {"approvals": {"x": {"action": "approve"}}, "calls": {"x": {"status": "returned", "value": 1}}},
        {"approvals": {f"a{i}": {"action": "approve"} for i in range(129)}, "calls": {}},
        {"approvals": {"a1": {"action": "approve"}}, "calls": {"c1": {"status": "returned", "value": "x" * 262144}}},
        {"approvals": {"a1": {"action": "approve"}}},
        {"approvals": {"a1": {"action": "maybe"}}, "calls": {}},
        ANSWERS | {"input": {"content": []}},
    ],
    ids=["overlap", "too_many", "too_large", "missing_map", "bad_answer", "bad_input"],
)
async def test_resume_shape_problems(db: Any, body: Any) -> None:
    """S-79, S-85: an id in both maps, more than 128 results or a body over 256 KiB → 400; nothing changes."""
    service = make_service(db)
    key = await new_key(service)
    waiting = await _waiting(service, key)
    before = await _snapshot(service, waiting)
    with pytest.raises(InvalidArgument) as caught:
        await commands.resume_run(service, key, waiting.id, body, key="r")
    assert caught.value.fields
    assert await _snapshot(service, waiting) == before


async def test_resume_on_archived_thread(db: Any) -> None:
    """S-84, S-85: a resume on an archived thread → 409 `archived`; the run stays waiting."""
    service = make_service(db)
    key = await new_key(service)
    waiting = await _waiting(service, key)
    await commands.archive_thread(service, key, waiting.thread_id)
    before = await _snapshot(service, waiting)
    with pytest.raises(Conflict) as caught:
        await commands.resume_run(service, key, waiting.id, ANSWERS, key="r")
    assert caught.value.reason == "archived"
    assert await _snapshot(service, waiting) == before


async def test_resume_in_archived_workspace_is_disabled(db: Any) -> None:
    """S-128: waiting runs stay waiting and can no longer be resumed (422 `disabled`)."""
    service = make_service(db)
    key = await new_key(service)
    waiting = await _waiting(service, key)
    async with write_transaction(service.engine) as conn:
        await auth.archive_workspace(conn, key.workspace_id)
    with pytest.raises(Disabled):
        await commands.resume_run(service, key, waiting.id, ANSWERS, key="r")
    assert (await commands.get_run(service, key, waiting.id)).status == "waiting"


async def test_resume_needs_run_now(db: Any) -> None:
    """§8.6 step 6, S-101: a key without `run` (or that lost it) is forbidden; another workspace's run is not found."""
    service = make_service(db)
    key = await new_key(service)
    waiting = await _waiting(service, key)
    reader = await new_key(service, key.workspace_id, permissions=["read"])
    with pytest.raises(Forbidden):
        await commands.resume_run(service, reader, waiting.id, ANSWERS, key="r")
    stale = replace(reader, permissions=frozenset({"read", "run"}))  # authenticated before the change
    with pytest.raises(Forbidden):
        await commands.resume_run(service, stale, waiting.id, ANSWERS, key="r")
    stranger = await new_key(service)
    with pytest.raises(NotFound):
        await commands.resume_run(service, stranger, waiting.id, ANSWERS, key="r")
    async with read_transaction(service.engine) as conn:
        assert (await conn.execute(select(runs.c.id))).scalars().all() == [waiting.id]


async def test_unique_resume_index_decides_a_lost_race(db: Any) -> None:
    """S-83, §8.2: a duplicate (resumed_by_id, request_key) is rejected by `uq_runs_resume_request` as `RaceLost`,
    and a live successor by `uq_runs_live_thread`; the transaction rolls back and leaves nothing."""
    service = make_service(db)
    key = await new_key(service)
    waiting = await _waiting(service, key)
    successor, _ = await commands.resume_run(service, key, waiting.id, ANSWERS, key="r")
    twin = successor_of(
        waiting,
        answers=ResumeAnswers.model_validate(ANSWERS),
        resumed_by_id=key.id,
        key="r",
        digest=successor.request_digest or "",
        max_attempts=3,
    )
    with pytest.raises(RaceLost) as caught:
        async with write_transaction(service.engine) as conn:
            await start_run(conn, replace(twin, request_key="r2"), entropy=service.entropy)
    assert caught.value.constraint == "uq_runs_live_thread"
    await seal_run(service, successor.id, "failed")
    with pytest.raises(RaceLost) as caught:
        async with write_transaction(service.engine) as conn:
            await start_run(conn, twin, entropy=service.entropy)
    assert caught.value.constraint == "uq_runs_resume_request"
    assert await count(service, runs) == 2


@pytest.mark.parametrize("db_kind", ["postgresql"], indirect=True)  # SQLite: read and write in one BEGIN IMMEDIATE
@pytest.mark.parametrize("race", ["same_key", "other_key", "archive"])
async def test_a_resume_that_loses_its_guard_answers_from_the_winner(
    db: Any, monkeypatch: pytest.MonkeyPatch, race: str
) -> None:
    """S-81, S-83, S-84, §8.6 step 4 ("after checking for a replay again"): a request that changes the thread after a
    resume has read it and before it writes makes the resume's start lose; the resume reads again and answers from
    what the winner left: the twin's successor (200) for the same key and body, otherwise `not_idle_waiting_run` or
    `archived`. One successor at most, the waiting run stays waiting. PostgreSQL only: on SQLite nothing can write
    between the read and the write (one `BEGIN IMMEDIATE` transaction)."""
    service = make_service(db)
    key = await new_key(service)
    waiting = await _waiting(service, key)
    reads: list[Any] = []
    winner: list[Any] = []

    async def read_then_race(conn: Any, **lookup: Any) -> Any:
        read = await read_resume(conn, **lookup)
        reads.append(read)
        if len(reads) == 1:  # another request commits between this resume's read and its write
            if race == "archive":
                await commands.archive_thread(service, key, waiting.thread_id)
            else:
                winner.append(
                    await commands.resume_run(
                        service, key, waiting.id, ANSWERS, key="r" if race == "same_key" else "twin"
                    )
                )
        return read

    monkeypatch.setattr(runs_commands, "read_resume", read_then_race)
    if race == "same_key":
        replayed, created = await commands.resume_run(service, key, waiting.id, ANSWERS, key="r")
        assert not created and replayed.id == winner[0][0].id
    else:
        with pytest.raises(Conflict) as caught:
            await commands.resume_run(service, key, waiting.id, ANSWERS, key="r")
        assert caught.value.reason == ("archived" if race == "archive" else "not_idle_waiting_run")
    # The first read saw the thread waiting; the losing write made the resume read again (the racer's own resume
    # read once in between).
    assert reads[0].thread.state == "waiting" and len(reads) == (2 if race == "archive" else 3)
    assert await count(service, runs, runs.c.parent_run_id == waiting.id) == (0 if race == "archive" else 1)
    assert (await run_row(service, waiting.id)).status == "waiting"


async def test_resume_refusals_come_in_step_order(db: Any) -> None:
    """§8.6 steps 3–6 after the lock, first failure wins: S-128 archived workspace → S-84 archived thread → S-77
    not the last waiting run → S-78 coverage → §4.3 `run` no longer held; all pass → no refusal."""
    service = make_service(db)
    key = await new_key(service)
    waiting = await _waiting(service, key)
    thread = await thread_row(service, waiting.thread_id)
    allowed = auth.AuthorityFacts(
        principal_exists=True,
        principal_disabled=False,
        permissions=frozenset({"run"}),
        workspace_id=key.workspace_id,
        workspace_archived=False,
    )
    typed = ResumeAnswers.model_validate(ANSWERS)
    assert resume_refusal(thread, waiting, allowed, typed) is None
    lost_run = replace(allowed, permissions=frozenset({"read"}))
    uncovered = ResumeAnswers.model_validate({"approvals": {}, "calls": ANSWERS["calls"]})
    other_run = replace(thread, last_run_id="run_" + "0" * 32)
    archived_thread = replace(thread, state="archived")
    archived_workspace = replace(lost_run, workspace_archived=True)
    steps = [
        (archived_workspace, archived_thread, Disabled, None),
        (lost_run, archived_thread, Conflict, "archived"),
        (lost_run, other_run, Conflict, "not_idle_waiting_run"),
        (lost_run, thread, InvalidArgument, "pending_coverage_mismatch"),
    ]
    for facts, locked, error, reason in steps:
        refusal = resume_refusal(locked, waiting, facts, uncovered)
        assert isinstance(refusal, error) and getattr(refusal, "reason", None) == reason, refusal
    assert isinstance(resume_refusal(thread, waiting, lost_run, typed), Forbidden)


async def test_resume_sends_few_statements(db: Any) -> None:
    """§8.2, §8.6, S-80: authenticating is one statement (on PostgreSQL sent on asyncpg directly, outside any
    transaction, so SQLAlchemy sees none: `test_a_request_authenticates_in_one_statement_outside_sqlalchemy_on_postgresql`);
    a resume reads everything it decides on in one statement, replay lookup included, and starts the successor in
    one guarded statement: on PostgreSQL two statements on asyncpg directly, outside any transaction (no BEGIN, no
    COMMIT); on SQLite one `BEGIN IMMEDIATE` transaction of three (the guarded UPDATE, then the INSERT)."""
    service = make_service(db)
    key = await new_key(service)
    waiting = await _waiting(service, key)
    async with write_transaction(service.engine) as conn:
        secret = (
            await auth.create_principal(
                conn, workspace_id=key.workspace_id, permissions=["run"], entropy=service.entropy
            )
        ).secret
    with statements(service.engine) as sent:
        assert await commands.authenticate(service, secret) is not None
    assert len(sent) == (0 if db.kind == "postgresql" else 1)
    on_driver: list[str] = []
    begun: list[Any] = []

    def began(conn: Any) -> None:
        begun.append(conn)

    event.listen(service.engine.sync_engine, "begin", began)
    try:
        with statements(service.engine) as sent, sent_in_transactions_on_driver(lambda _, s: on_driver.append(s)):
            _, created = await commands.resume_run(service, key, waiting.id, ANSWERS, key="r")
    finally:
        event.remove(service.engine.sync_engine, "begin", began)
    assert created
    by_key = [statement for statement, _ in sent if "request_key =" in statement and "INSERT" not in statement]
    assert len(by_key) == 1 and len(sent) == (2 if db.kind == "postgresql" else 3), sent
    # On PostgreSQL both go on asyncpg directly (`fetch_rows`), none through SQLAlchemy, and no transaction begins.
    assert len(on_driver) == (2 if db.kind == "postgresql" else 0), on_driver
    assert len(begun) == (0 if db.kind == "postgresql" else 1)


async def test_resume_stages_run_accepted_only_for_an_enabled_subscription(db: Any) -> None:
    """S-106: the successor's `run.accepted` webhook is staged in the resume's transaction when the workspace has an
    enabled subscription wanting it (read after the thread lock), and nothing is looked up or staged otherwise."""
    service = make_service(db)
    key = await new_key(service)
    quiet = await _waiting(service, key)
    await commands.resume_run(service, key, quiet.id, ANSWERS, key="r1")
    assert await count(service, outbox, outbox.c.kind == "webhook") == 0
    async with write_transaction(service.engine) as conn:
        await conn.execute(
            insert(subscriptions).values(
                id="sub_" + "1" * 32,
                workspace_id=key.workspace_id,
                name="hooks",
                url="http://127.0.0.1:9/h",
                events=["run.accepted"],
                filter={},
                enabled=True,
                signing_secret="not-decryptable",
                version=1,
                created_by_id=key.id,
                updated_by_id=key.id,
                created_at=db_now(),
                updated_at=db_now(),
            )
        )
    accepted = await commands.create_thread(service, key, agent="demo", input=TEXT, key="k2")
    assert accepted.run is not None
    watched = await seal_run(service, accepted.run.id, "waiting", pending=pending_of())
    before = await count(service, outbox, outbox.c.kind == "webhook")
    successor, created = await commands.resume_run(service, key, watched.id, ANSWERS, key="r2")
    assert created
    async with read_transaction(service.engine) as conn:
        staged = (await conn.execute(select(outbox).where(outbox.c.kind == "webhook"))).mappings().all()
    assert len(staged) == before + 1
    assert [
        row["payload"]["data"]["run"]["id"]
        for row in staged
        if row["payload"]["type"] == "run.accepted" and row["payload"]["data"]["run"]["id"] == successor.id
    ] == [successor.id]
