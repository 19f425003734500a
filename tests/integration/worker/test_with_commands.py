"""The worker behind the real commands: threads, queued messages and resume, executed end to end (§7.7–§7.10)."""

from __future__ import annotations

from pydantic_ai.messages import ModelRequest, UserPromptPart
from sqlalchemy import select

from candor.service import commands
from candor.service.protocol.authority import Principal
from candor.service.store.checkpoints.incremental import load_state
from candor.service.store.schema.tables import checkpoints
from candor.service.worker import WorkerLoop, attempt

from worker.support import content, run_row


def _principal(tenant) -> Principal:
    return Principal(id=tenant.principal_id, workspace_id=tenant.workspace_id, permissions=frozenset({"read", "run"}))


def _spy_on_advance(monkeypatch) -> list[str]:
    """The thread ids the worker tries to advance after a seal (the real advance still runs)."""
    calls: list[str] = []
    real = attempt.advance_thread_after_seal  # type: ignore[attr-defined]  # the module's own binding, which the test patches

    async def spy(engine, *, thread_id, **kwargs):
        calls.append(thread_id)
        return await real(engine, thread_id=thread_id, **kwargs)

    monkeypatch.setattr(attempt, "advance_thread_after_seal", spy)
    return calls


async def test_a_completed_seal_with_nothing_queued_advances_nothing(db, service, tenant, monkeypatch) -> None:
    """§7.8, S-65, issue 12: the sealing transaction reads whether the thread has pending entries; with none, the
    worker takes no thread lock and opens no transaction to start a next run."""
    calls = _spy_on_advance(monkeypatch)
    first = await commands.create_thread(
        service, _principal(tenant), agent="scripted", input=content("only"), options={"script": "echo"}, key="k1"
    )
    assert first.run is not None
    await WorkerLoop(service).run_until_idle(timeout=30)
    assert (await run_row(db.engine, first.run.id))["status"] == "completed"
    assert calls == []


async def test_queued_message_starts_after_the_completed_seal(db, service, tenant, monkeypatch) -> None:
    """§7.8, S-44, S-65: after a completed seal the worker starts the thread's next queued run, which continues
    from the sealed run's checkpoint instead of copying its messages."""
    calls = _spy_on_advance(monkeypatch)
    principal = _principal(tenant)
    first = await commands.create_thread(
        service, principal, agent="scripted", input=content("first"), options={"script": "echo"}, key="k1"
    )
    assert first.run is not None
    queued = await commands.post_input(service, principal, first.thread.id, input=content("second"), key="k2")
    assert queued.run is None  # the thread is active: the entry waits

    await WorkerLoop(service).run_until_idle(timeout=30)

    run1 = await run_row(db.engine, first.run.id)
    assert (run1["status"], run1["output"]) == ("completed", "echo: first")
    thread = await commands.get_thread(service, principal, first.thread.id)
    assert thread.last_run_id is not None
    run2 = await run_row(db.engine, thread.last_run_id)
    assert run2["id"] != run1["id"]
    assert (run2["status"], run2["trigger"], run2["output"]) == ("completed", "queued", "echo: second")
    assert calls == [first.thread.id]  # after the first seal only: nothing was queued behind the second
    assert run2["start_checkpoint_id"] == run1["checkpoint_id"]
    async with db.engine.connect() as conn:
        first_commit = (
            (await conn.execute(select(checkpoints).where(checkpoints.c.run_id == run2["id"], checkpoints.c.seq == 1)))
            .mappings()
            .one()
        )
        loaded = await load_state(conn, run2["checkpoint_id"])
    assert first_commit["base_id"] == run1["checkpoint_id"] and first_commit["kept"] == 2
    prompts = [
        p.content
        for m in loaded.state.message_history
        if isinstance(m, ModelRequest)
        for p in m.parts
        if isinstance(p, UserPromptPart)
    ]
    assert prompts == ["first", "second"]


async def test_waiting_run_resumed_through_the_command(db, service, tenant, control) -> None:
    """S-80, S-87, S-89: a waiting run's pending approval, answered through `resume_run`, is executed by the
    successor's first attempt."""
    principal = _principal(tenant)
    accepted = await commands.create_thread(
        service, principal, agent="scripted", input=content("clean up"), options={"script": "approval"}, key="k1"
    )
    worker = WorkerLoop(service)
    await worker.run_until_idle(timeout=30)
    assert accepted.run is not None
    waiting = await run_row(db.engine, accepted.run.id)
    assert waiting["status"] == "waiting" and waiting["wait_reason"] == "approval"

    successor, created = await commands.resume_run(
        service,
        principal,
        accepted.run.id,
        {"approvals": {"call_delete": {"action": "approve"}}, "calls": {}},
        key="k2",
    )
    assert created
    await worker.run_until_idle(timeout=30)
    run = await run_row(db.engine, successor.id)
    assert (run["status"], run["output"], run["trigger"]) == ("completed", "deleted", "resume")
    assert control.ledger == ["delete a.txt"]
