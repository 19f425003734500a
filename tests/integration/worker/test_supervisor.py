"""Crash recovery, drain handoff, cancellation and revoked authority with a live worker loop (§7.4, §7.5 lease expiry, §7.11 drain, up to §7.12)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pydantic_ai.messages import ModelRequest, ToolReturnPart
from sqlalchemy import select, update

from candor.service.store.checkpoints.incremental import load_state
from candor.service.store.runs.claims import claim_runs
from candor.service.store.schema.dialect import db_now
from candor.service.store.schema.tables import checkpoints, principals, runs, workspaces
from candor.service.worker import WorkerLoop, drain
from candor.service.worker.attempt import run_attempt
from candor.service.worker.handle import AttemptHandle
from candor.tools import UNKNOWN_OUTCOME_CONTENT

from waiting import wait_until
from worker import support
from worker.support import add_thread_run, attempt_rows, run_row


async def _start(worker: WorkerLoop) -> asyncio.Task[None]:
    return asyncio.create_task(worker.run_forever())


async def _stop(worker: WorkerLoop, task: asyncio.Task[None]) -> None:
    worker.stop()
    await asyncio.wait_for(task, 10)
    await worker.wait_attempts(timeout=10)


_kill = support.kill_worker


def _returns(history: Any) -> dict[str, ToolReturnPart]:
    return {
        part.tool_call_id: part
        for message in history
        if isinstance(message, ModelRequest)
        for part in message.parts
        if isinstance(part, ToolReturnPart)
    }


async def test_dead_worker_recovers_from_last_checkpoint(db, tenant, control) -> None:
    """S-27, S-28, S-29, S-39: a worker dies inside its tools; after its 3 s lease expires the run continues from
    the tool-boundary checkpoint: the non-retry-safe call gets an unknown outcome, the retry-safe one runs again."""
    service = support.make_service(db.url, db.engine, lease_seconds=3)
    async with db.engine.begin() as conn:
        ref = await add_thread_run(conn, tenant, script="tools")
    control.tool_gate = asyncio.Event()  # the tools start, then hang: the worker "dies" there
    first = WorkerLoop(service, worker_id="dying")
    task = await _start(first)

    async def both_tools_started() -> bool:
        return len(control.ledger) == 2

    await support.wait_for(both_tools_started)
    await _kill(first, task)
    control.tool_gate = None

    await support.wait_for_lease_expiry(service)  # S-28: about lease_seconds + authority_seconds
    [dead] = await attempt_rows(db.engine, ref.run_id)
    assert (dead["status"], dead["failure"]["code"]) == ("failed", "lease_expired")
    await support.make_due(db.engine, ref.run_id)
    survivor = support.make_service(db.url, db.engine, lease_seconds=10)  # only the dead worker's lease is short
    await WorkerLoop(survivor, worker_id="second").run_until_idle(timeout=30)

    run = await run_row(db.engine, ref.run_id)
    assert (run["status"], run["output"], run["attempts"]) == ("completed", "done", 2)
    charges = [line for line in control.ledger if "charge" in line]
    lookups = [line for line in control.ledger if "lookup" in line]
    assert len(charges) == 1 and len(lookups) == 2  # charge never repeated; lookup replayed once
    async with db.engine.connect() as conn:
        loaded = await load_state(conn, run["checkpoint_id"])
        seqs = (
            await conn.execute(
                select(checkpoints.c.seq, checkpoints.c.attempt)
                .where(checkpoints.c.run_id == ref.run_id)
                .order_by(checkpoints.c.seq)
            )
        ).all()
    returns = _returns(loaded.state.message_history)
    assert returns["call_charge"].content == UNKNOWN_OUTCOME_CONTENT
    assert returns["call_charge"].outcome == "interrupted"
    assert returns["call_lookup"].content == "balance of acme: 10"
    # S-39: seq rises by one per commit across attempts; attempt 1 committed the two boundaries before the tools
    assert [tuple(r) for r in seqs] == [(1, 1), (2, 1), (3, 2), (4, 2)]
    attempts = await attempt_rows(db.engine, ref.run_id)
    assert [(a["status"], a["start_reason"]) for a in attempts] == [("failed", "initial"), ("succeeded", "recovery")]


async def test_drain_hands_off_at_a_model_boundary(db, service, tenant, control) -> None:
    """S-53, S-54, S-32: a draining attempt does not yield at the tool boundary it reaches; it yields right after
    committing the next model boundary; the next claim is a free `handoff`."""
    async with db.engine.begin() as conn:
        ref = await add_thread_run(conn, tenant, script="step")
    control.model_gate = asyncio.Event()
    worker = WorkerLoop(service, worker_id="draining")
    task = await _start(worker)
    await asyncio.wait_for(control.model_entered.wait(), 10)  # the first model request is in flight
    draining = asyncio.create_task(drain(worker, drain_seconds=10))
    await wait_until(lambda: not worker.claiming, 5)
    control.model_gate.set()  # → tool boundary (no yield there), the tool runs, → model boundary: yield
    assert await asyncio.wait_for(draining, 15) == 0
    await asyncio.wait_for(task, 10)

    assert control.ledger == ["step call_step"]
    assert control.model_calls == 1
    run = await run_row(db.engine, ref.run_id)
    assert (run["status"], run["attempts"], run["current_attempt_id"]) == ("accepted", 1, None)
    async with db.engine.connect() as conn:
        due_in = (
            await conn.execute(select(runs.c.available_at - db_now()).where(runs.c.id == ref.run_id))
        ).scalar_one()
        kinds = (
            (
                await conn.execute(
                    select(checkpoints.c.count).where(checkpoints.c.run_id == ref.run_id).order_by(checkpoints.c.seq)
                )
            )
            .scalars()
            .all()
        )
    assert due_in <= 0
    assert kinds == [1, 2, 3]  # model boundary, tool boundary, model boundary (committed, then yielded)
    [yielded] = await attempt_rows(db.engine, ref.run_id)
    assert (yielded["status"], yielded["yield_reason"]) == ("yielded", "handoff")

    await WorkerLoop(service, worker_id="next").run_until_idle(timeout=30)
    run = await run_row(db.engine, ref.run_id)
    assert (run["status"], run["attempts"]) == ("completed", 1)
    attempts = await attempt_rows(db.engine, ref.run_id)
    assert [a["start_reason"] for a in attempts] == ["initial", "handoff"]
    assert control.ledger == ["step call_step"]  # the tool did not run again


async def test_handoff_before_the_harness_starts_yields_at_once(db, service, tenant, control) -> None:
    """S-54: an attempt flagged before it started the harness yields without calling the agent."""
    async with db.engine.begin() as conn:
        ref = await add_thread_run(conn, tenant, script="echo")
    [claimed] = await claim_runs(
        db.engine,
        worker_id="w1",
        agents=("scripted",),
        limit=1,
        lease_seconds=30,
        randbytes=service.entropy.token_bytes,
    )
    handle = AttemptHandle(claimed=claimed, lease_seconds=30, sent_at=service.clock.monotonic())
    handle.request_handoff()
    await run_attempt(service, handle)
    assert control.model_calls == 0
    [attempt] = await attempt_rows(db.engine, ref.run_id)
    assert (attempt["status"], attempt["yield_reason"]) == ("yielded", "handoff")
    assert (await run_row(db.engine, ref.run_id))["status"] == "accepted"


async def test_drain_abandons_attempts_past_the_deadline(db, service, tenant, control) -> None:
    """S-55: an attempt still inside a tool at the drain deadline is abandoned without a seal; its lease stays."""
    async with db.engine.begin() as conn:
        ref = await add_thread_run(conn, tenant, script="step")
    control.tool_gate = asyncio.Event()
    worker = WorkerLoop(service, worker_id="slow")
    task = await _start(worker)
    await asyncio.wait_for(control.tool_entered.wait(), 10)
    assert await drain(worker, drain_seconds=0.3) == 1
    await asyncio.wait_for(task, 10)
    run = await run_row(db.engine, ref.run_id)
    [attempt] = await attempt_rows(db.engine, ref.run_id)
    assert run["status"] == "running" and attempt["status"] == "running"  # recovered after expiry, charged


async def test_cancel_request_stops_the_attempt(db, service, tenant, control) -> None:
    """S-57: after `cancel_requested_at` is set the attempt stops within about a heartbeat and seals `cancelled`."""
    async with db.engine.begin() as conn:
        ref = await add_thread_run(conn, tenant, script="step")
    control.tool_gate = asyncio.Event()  # never released: only the cancellation ends the tool
    worker = WorkerLoop(service)
    task = await _start(worker)
    try:
        await asyncio.wait_for(control.tool_entered.wait(), 10)
        async with db.engine.begin() as conn:
            await conn.execute(update(runs).where(runs.c.id == ref.run_id).values(cancel_requested_at=db_now()))

        async def sealed() -> bool:
            status: str = (await run_row(db.engine, ref.run_id))["status"]
            return status == "cancelled"

        await support.wait_for(sealed, timeout=5)
    finally:
        await _stop(worker, task)
    run = await run_row(db.engine, ref.run_id)
    assert run["failure"] == {"code": "cancelled", "message": "The run was interrupted"}
    [attempt] = await attempt_rows(db.engine, ref.run_id)
    assert (attempt["status"], attempt["failure"]["code"]) == ("cancelled", "cancelled")


@pytest.mark.parametrize("revocation", ["archive_workspace", "disable_principal", "remove_run_permission"])
async def test_revoked_authority_fails_the_running_run(db, service, tenant, control, revocation: str) -> None:
    """S-61, S-62, S-127: revoking authority mid-run fails the run `authority_revoked` at the next heartbeat, and
    the tool calls the model asked for are not started after the check refused."""
    async with db.engine.begin() as conn:
        ref = await add_thread_run(conn, tenant, script="step")
    control.model_gate = asyncio.Event()
    worker = WorkerLoop(service)
    task = await _start(worker)
    try:
        await asyncio.wait_for(control.model_entered.wait(), 10)
        async with db.engine.begin() as conn:
            if revocation == "archive_workspace":
                await conn.execute(
                    update(workspaces).where(workspaces.c.id == tenant.workspace_id).values(archived_at=db_now())
                )
            elif revocation == "disable_principal":
                await conn.execute(
                    update(principals).where(principals.c.id == tenant.principal_id).values(disabled_at=db_now())
                )
            else:
                await conn.execute(
                    update(principals).where(principals.c.id == tenant.principal_id).values(permissions=["read"])
                )

        async def sealed() -> bool:
            status: str = (await run_row(db.engine, ref.run_id))["status"]
            return status == "failed"

        await support.wait_for(sealed, timeout=5)
        control.model_gate.set()  # the model's tool call, if it still arrived, must not start a tool
        await wait_until(lambda: worker.busy == 0, 10)  # the attempt has ended: nothing more can start
    finally:
        await _stop(worker, task)
    run = await run_row(db.engine, ref.run_id)
    assert run["failure"]["code"] == "authority_revoked"
    assert control.ledger == []
    [attempt] = await attempt_rows(db.engine, ref.run_id)
    assert (attempt["status"], attempt["failure"]["code"]) == ("failed", "authority_revoked")
