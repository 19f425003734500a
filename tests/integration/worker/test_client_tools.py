"""Client tools in the worker (§8.8): S-131 (a call to a client tool ends the run `waiting` with the call in
`pending.calls`; no server code runs) and S-132 (the resume answer reaches the successor's model)."""

from __future__ import annotations

from typing import Any

import pytest

from candor.service.worker import WorkerLoop

from worker.support import add_thread_run, run_row

WEATHER = {
    "name": "get_weather",
    "description": "Local weather.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


async def _waiting_client_run(db: Any, service: Any, tenant: Any) -> tuple[Any, Any, WorkerLoop]:
    async with db.engine.begin() as conn:
        ref = await add_thread_run(conn, tenant, script="client", options={"client_tools": [WEATHER]})
    worker = WorkerLoop(service)
    await worker.run_until_idle(timeout=30)
    return ref, await run_row(db.engine, ref.run_id), worker


async def test_client_tool_call_ends_the_run_waiting(db, service, tenant, control) -> None:
    """S-131: the model's call to a client tool seals the run `waiting`, `wait_reason` `call`, the call (id,
    `tool_name`, `arguments`) in `pending.calls`; no tool code runs on the server."""
    _, run, _ = await _waiting_client_run(db, service, tenant)
    assert run["status"] == "waiting" and run["wait_reason"] == "call"
    assert run["pending"] == {
        "approvals": [],
        "calls": [
            {
                "tool_call_id": "call_weather",
                "tool_name": "get_weather",
                "arguments": {"city": "Paris"},
                "kind": "external",
                "metadata": {},
            }
        ],
    }
    assert control.ledger == [] and control.model_calls == 1


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ({"status": "returned", "value": {"temp_c": 21}}, "ToolReturnPart: {'temp_c': 21}"),
        ({"status": "failed", "message": "no network"}, "no network"),
    ],
)
async def test_resume_answer_reaches_the_successor_model(db, service, tenant, control, answer, expected) -> None:
    """S-132: `returned` → the successor's model receives the value as the call's return; `failed` → a failed
    return carrying the message."""
    ref, waiting, worker = await _waiting_client_run(db, service, tenant)
    async with db.engine.begin() as conn:
        successor = await add_thread_run(
            conn,
            tenant,
            script="client",
            options={"client_tools": [WEATHER]},
            text=None,
            thread_id=ref.thread_id,
            trigger="resume",
            lineage="continue",
            parent_run_id=ref.run_id,
            start_checkpoint_id=waiting["checkpoint_id"],
            resumed_by_id=tenant.principal_id,
            resume={"approvals": {}, "calls": {"call_weather": answer}},
        )
    await worker.run_until_idle(timeout=30)
    run = await run_row(db.engine, successor.run_id)
    assert run["status"] == "completed", run["failure"]
    assert expected in run["output"]
    if answer["status"] == "failed":
        assert not run["output"].startswith("ToolReturnPart: {")  # a failed return, not a value
    assert control.ledger == []


async def test_client_tool_named_like_an_agent_tool_seals_failed(db, service, tenant, control) -> None:
    """§8.8 / S-133 backstop: a collision not caught at post time (runs inserted directly here) seals the run
    `failed` with `client_tool_conflict` before the model is called."""
    async with db.engine.begin() as conn:
        ref = await add_thread_run(conn, tenant, script="step", options={"client_tools": [WEATHER | {"name": "step"}]})
    await WorkerLoop(service).run_until_idle(timeout=30)
    run = await run_row(db.engine, ref.run_id)
    assert (run["status"], run["failure"]["code"]) == ("failed", "client_tool_conflict")
    assert control.model_calls == 0
