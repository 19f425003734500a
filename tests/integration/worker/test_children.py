"""Child runs end to end (§7.13, §9.5, S-118) on both dialects: the worker's `start_child_run` tool, the child's
seal staging its `child_result` row, the delivery loop entering it into the parent thread, the parent continuing.

The parent agent (`factory` below, agent `parent`) asks in its first response for one `start_child_run` call per
name in `options["children"]` (default `["child"]`); it answers with what the calls returned, and a later run
started by a child result answers with that result. Agent `child` is the echo agent of `support.py`.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from sqlalchemy import select

from candor import Harness
from candor.service.agents import AgentRegistry
from candor.service.core import Service
from candor.service.outbox.delivery import deliver_outbox, handle_child_result
from candor.service.protocol.children import CHILD_TOOL_NAME
from candor.service.runtime import SeededEntropy
from candor.service.store.schema.tables import inbox_entries, outbox, runs, threads
from candor.service.worker import WorkerLoop

from worker import support
from worker.support import add_thread_run, run_row

FACTORY = f"{__name__}:factory"


def _child_result(messages: list[ModelMessage]) -> dict[str, Any] | None:
    last = messages[-1]
    if isinstance(last, ModelRequest):
        for part in last.parts:
            if isinstance(part, UserPromptPart) and isinstance(part.content, str) and "child_run_id" in part.content:
                result: dict[str, Any] = json.loads(part.content)
                return result
    return None


def _answers(messages: list[ModelMessage]) -> list[str]:
    """What the latest request says about the spawn calls: `ok <run id>` or `refused <error>`, in call order.

    A tool's `ModelRetry` reaches the model as a return with `outcome = "retried"` holding the error text."""
    last = messages[-1]
    assert isinstance(last, ModelRequest)
    answers = []
    for part in last.parts:
        if not isinstance(part, ToolReturnPart) or part.tool_name != CHILD_TOOL_NAME:
            continue
        if part.outcome == "retried":
            answers.append(f"refused {part.content}")
        else:
            assert isinstance(part.content, dict)
            answers.append(f"ok {dict(part.content)['child_run_id']}")
    return answers


def note() -> str:
    """Take a note (a plain tool: its boundary is a commit that can hand steer entries to the run)."""
    return "noted"


def factory(options: dict[str, Any]) -> Harness[Any]:
    names = options.get("children", ["child"])
    waits = bool(options.get("wait"))

    async def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        support.CONTROL.model_calls += 1
        if (result := _child_result(messages)) is not None:
            return ModelResponse(parts=[TextPart(f"child {result['status']}: {result['output']}")])
        if not any(isinstance(m, ModelResponse) for m in messages):
            assert CHILD_TOOL_NAME in {tool.name for tool in info.function_tools}
            calls = [
                ToolCallPart(CHILD_TOOL_NAME, {"agent": name, "input": f"task {i}"}, tool_call_id=f"call_spawn_{i}")
                for i, name in enumerate(names)
            ]
            return ModelResponse(parts=calls)
        if waits and sum(isinstance(m, ModelResponse) for m in messages) == 1:
            # stay active until the test has delivered the child's result, then call a tool: the entry is
            # assigned at that tool boundary's commit and reaches the next request (§7.8 step 6)
            gate = support.CONTROL.tool_gate
            assert gate is not None
            await gate.wait()
            return ModelResponse(parts=[ToolCallPart("note", {}, tool_call_id="call_note")])
        return ModelResponse(parts=[TextPart("; ".join(_answers(messages)))])

    return Harness(Agent(FunctionModel(respond), tools=[note] if waits else []))


def make_registry() -> AgentRegistry:
    """Agent `parent` may start `child` and itself (§7.13 opt-in); `child` may start nothing."""
    return AgentRegistry({"parent": FACTORY, "child": support.FACTORY}, children={"parent": ["child", "parent"]})


def make_service(db: Any, **worker: Any) -> Service:
    return Service(
        settings=support.make_settings(db.url, **worker),
        engine=db.engine,
        agents=make_registry(),
        entropy=SeededEntropy(secrets.randbits(32)),
        wakeups=asyncio.Event(),
    )


async def _rows(db: Any, query: Any) -> list[Any]:
    async with db.engine.connect() as conn:
        return list((await conn.execute(query)).mappings().all())


async def _children_of(db: Any, run_id: str) -> list[Any]:
    return await _rows(db, select(threads).where(threads.c.origin_run_id == run_id).order_by(threads.c.created_at))


async def test_parent_starts_a_child_and_continues_with_its_result(db, tenant) -> None:
    """§7.13, §9.5, S-118: the spawn creates a child thread and an accepted `spawned` run acting for the parent's
    principal; the child's completed seal stages one `child_result` row; its delivery enters one steer entry into
    the idle parent thread, which starts a run with trigger `child_result` that sees the child's output."""
    service = make_service(db)
    async with db.engine.begin() as conn:
        parent = await add_thread_run(conn, tenant, agent="parent", script="spawn")
    await WorkerLoop(service, worker_id="w1").run_until_idle(timeout=30)

    (child_thread,) = await _children_of(db, parent.run_id)
    assert (child_thread["origin"], child_thread["origin_thread_id"], child_thread["origin_tool_call_id"]) == (
        "child",
        parent.thread_id,
        "call_spawn_0",
    )
    assert child_thread["agent"] == "child" and child_thread["workspace_id"] == tenant.workspace_id
    (child_run,) = await _rows(db, select(runs).where(runs.c.thread_id == child_thread["id"]))
    assert (child_run["trigger"], child_run["lineage"], child_run["parent_run_id"]) == ("spawned", "root", None)
    assert child_run["principal_id"] == tenant.principal_id
    first = await run_row(db.engine, parent.run_id)
    assert child_run["authority"] == first["authority"]  # §4.3: the parent's frozen authority, inherited
    assert (child_run["status"], child_run["output"]) == ("completed", "echo: task 0")
    assert (first["status"], first["output"]) == ("completed", f"ok {child_run['id']}")

    (row,) = await _rows(db, select(outbox).where(outbox.c.kind == "child_result"))  # S-118: exactly one row
    assert (row["dedupe_key"], row["target"], row["status"]) == (child_run["id"], parent.thread_id, "pending")

    settled = await deliver_outbox(service, handlers={"child_result": handle_child_result})
    assert settled == {"child_result": 1}
    (entry,) = await _rows(db, select(inbox_entries).where(inbox_entries.c.kind == "child_result"))
    assert (entry["thread_id"], entry["delivery"], entry["options"], entry["child_run_id"]) == (
        parent.thread_id,
        "steer",
        None,
        child_run["id"],
    )
    await WorkerLoop(service, worker_id="w2").run_until_idle(timeout=30)

    parent_runs = await _rows(db, select(runs).where(runs.c.thread_id == parent.thread_id).order_by(runs.c.created_at))
    assert [(r["trigger"], r["status"]) for r in parent_runs] == [("input", "completed"), ("child_result", "completed")]
    follow_up = parent_runs[1]
    assert follow_up["output"] == "child completed: echo: task 0"
    assert (follow_up["source_entry_id"], follow_up["lineage"], follow_up["parent_run_id"]) == (
        entry["id"],
        "continue",
        parent.run_id,
    )
    (consumed,) = await _rows(db, select(inbox_entries).where(inbox_entries.c.id == entry["id"]))
    assert consumed["status"] == "consumed"
    assert [r["status"] for r in await _rows(db, select(outbox).where(outbox.c.kind == "child_result"))] == [
        "delivered"
    ]


async def test_active_parent_receives_the_result_at_a_later_commit(db, tenant, control) -> None:
    """§9.5, §8.5, S-118: while the parent run is still active, the delivered `child_result` entry stays pending and
    is steered into that same run at its next commit; no second parent run starts."""
    control.tool_gate = asyncio.Event()
    service = make_service(db)
    async with db.engine.begin() as conn:
        parent = await add_thread_run(conn, tenant, agent="parent", script="spawn", options={"wait": True})
    worker = asyncio.create_task(WorkerLoop(service, worker_id="w1").run_until_idle(timeout=30))
    try:

        async def child_sealed_and_parent_parked() -> bool:
            # The parent's second model call (parent 1, child 1, parent 2) waits on the gate: its spawn boundary is
            # committed. Delivering before that commit would let it take the entry at once (order-dependent).
            parked = control.model_calls >= 3
            return parked and len(await _rows(db, select(outbox).where(outbox.c.kind == "child_result"))) == 1

        await support.wait_for(child_sealed_and_parent_parked)
        assert await deliver_outbox(service, handlers={"child_result": handle_child_result}) == {"child_result": 1}
        (entry,) = await _rows(db, select(inbox_entries).where(inbox_entries.c.kind == "child_result"))
        assert (entry["status"], (await run_row(db.engine, parent.run_id))["status"]) == ("pending", "running")
        control.tool_gate.set()
        await worker
    finally:
        control.tool_gate.set()
        worker.cancel()

    run = await run_row(db.engine, parent.run_id)
    assert (run["status"], run["output"]) == ("completed", "child completed: echo: task 0"), run["failure"]
    (entry,) = await _rows(db, select(inbox_entries).where(inbox_entries.c.kind == "child_result"))
    assert (entry["status"], entry["assigned_run_id"]) == ("consumed", parent.run_id)
    assert len(await _rows(db, select(runs).where(runs.c.thread_id == parent.thread_id))) == 1


async def test_count_limit_refuses_visibly_and_creates_nothing_more(db, tenant) -> None:
    """§7.13: beyond `worker.child_count` the call fails visibly to the model and creates nothing."""
    service = make_service(db, child_count=2)
    async with db.engine.begin() as conn:
        parent = await add_thread_run(
            conn, tenant, agent="parent", script="spawn", options={"children": ["child", "child", "child"]}
        )
    await WorkerLoop(service, worker_id="w1").run_until_idle(timeout=30)

    run = await run_row(db.engine, parent.run_id)
    assert run["status"] == "completed", run["failure"]
    answers = run["output"].split("; ")
    assert sorted(answer.split(" ")[0] for answer in answers) == ["ok", "ok", "refused"], answers
    (refused,) = [answer for answer in answers if answer.startswith("refused")]
    assert "child_count_exceeded" in refused
    children = await _children_of(db, parent.run_id)
    assert len(children) == 2
    assert {child["origin_tool_call_id"] for child in children} < {"call_spawn_0", "call_spawn_1", "call_spawn_2"}


async def test_depth_limit_refuses_a_grandchild(db, tenant) -> None:
    """§7.13: a child nested deeper than `worker.child_depth` is refused to the (child) model; nothing is created."""
    service = make_service(db, child_depth=1)
    async with db.engine.begin() as conn:
        parent = await add_thread_run(conn, tenant, agent="parent", script="spawn", options={"children": ["parent"]})
    await WorkerLoop(service, worker_id="w1").run_until_idle(timeout=30)

    (child_thread,) = await _children_of(db, parent.run_id)
    (child_run,) = await _rows(db, select(runs).where(runs.c.thread_id == child_thread["id"]))
    assert child_run["status"] == "completed"
    assert child_run["output"].startswith("refused child_depth_exceeded: ")
    assert await _children_of(db, child_run["id"]) == []


async def test_agent_outside_the_opt_in_list_is_refused(db, tenant) -> None:
    """§7.13: only the agents named in `agents.<name>.children` can be started; anything else creates nothing."""
    service = make_service(db)
    async with db.engine.begin() as conn:
        parent = await add_thread_run(conn, tenant, agent="parent", script="spawn", options={"children": ["ghost"]})
    await WorkerLoop(service, worker_id="w1").run_until_idle(timeout=30)

    run = await run_row(db.engine, parent.run_id)
    assert run["status"] == "completed" and run["output"].startswith("refused child_agent_not_allowed: ")
    assert await _children_of(db, parent.run_id) == []


async def test_agents_without_children_get_no_spawn_tool(db, tenant) -> None:
    """§7.13: authority is explicit: an agent with no `children` list is never offered the tool."""
    service = make_service(db)
    async with db.engine.begin() as conn:
        ref = await add_thread_run(conn, tenant, agent="child", script="tools")
    await WorkerLoop(service, worker_id="w1").run_until_idle(timeout=30)
    run = await run_row(db.engine, ref.run_id)
    assert run["status"] == "completed"
    assert service.agents.children_of("child") == ()
