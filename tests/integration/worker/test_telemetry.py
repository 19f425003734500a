"""OpenTelemetry traces of runs through the worker, with the SDK's in-memory exporter (docs/telemetry.md; issue 35
item 2): spans run → attempt → step (model request, tool call), Pydantic AI's own spans under the step spans, the
trace context of the request that created the run carried across the queue, and the recovery outcome of every call
recovery closed. On SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic_ai import Agent
from pydantic_ai.models.instrumented import InstrumentationSettings
from sqlalchemy import select, update
from sqlalchemy.exc import OperationalError

from candor.service.http import create_app
from candor.service.store.db.engine import write_transaction
from candor.service.store.schema.dialect import db_now
from candor.service.store.schema.tables import run_attempts, runs
from candor.service.store.workspaces import auth as auth
from candor.service.telemetry import Telemetry
from candor.service.telemetry.sdk import build_provider
from candor.service.worker import WorkerLoop

from worker import support
from worker.support import add_thread_run, run_row

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE}-{SPAN}-01"


@pytest.fixture
def exported() -> Iterator[tuple[Telemetry, InMemorySpanExporter]]:
    """A Telemetry exporting into memory, with Pydantic AI's instrumentation of every agent on the same provider."""
    exporter = InMemorySpanExporter()
    provider = build_provider(SimpleSpanProcessor(exporter))
    Agent.instrument_all(InstrumentationSettings(tracer_provider=provider))
    try:
        yield Telemetry(provider), exporter
    finally:
        Agent.instrument_all(False)
        provider.shutdown()


def _by_id(spans: tuple[ReadableSpan, ...]) -> dict[int, ReadableSpan]:
    return {span.context.span_id: span for span in spans}


def _ancestors(span: ReadableSpan, spans: dict[int, ReadableSpan]) -> list[str]:
    """Names of the span's ancestors that were exported, nearest first."""
    names: list[str] = []
    while span.parent is not None and span.parent.span_id in spans:
        span = spans[span.parent.span_id]
        names.append(span.name)
    return names


async def test_spans_run_attempt_steps_with_pydantic_ai_under_the_steps(db, tenant, exported) -> None:
    """A run created with a `traceparent`: its run span hangs under the request's span in the request's trace; the
    attempt under the run; a step span per model request and per tool call under the attempt; Pydantic AI's model
    request and tool spans under candor's step spans; ids on every candor span."""
    telemetry, exporter = exported
    service = support.make_service(db.url, db.engine)
    service.telemetry = telemetry
    async with db.engine.begin() as conn:
        ref = await add_thread_run(conn, tenant, script="tools", trace_context=TRACEPARENT)
    await WorkerLoop(service, worker_id="w1").run_until_idle(timeout=30)
    assert (await run_row(db.engine, ref.run_id))["status"] == "completed"

    spans = exporter.get_finished_spans()
    by_id = _by_id(spans)
    assert {f"{span.context.trace_id:032x}" for span in spans} == {TRACE}  # one trace: the request's
    (run,) = [span for span in spans if span.name == "candor.run"]
    assert run.parent is not None and f"{run.parent.span_id:016x}" == SPAN and run.parent.is_remote
    assert run.attributes["candor.run.id"] == ref.run_id and run.attributes["candor.run.status"] == "completed"
    assert run.attributes["candor.thread.id"] == ref.thread_id
    (attempt,) = [span for span in spans if span.name == "candor.attempt"]
    assert attempt.parent is not None and attempt.parent.span_id == run.context.span_id
    assert attempt.attributes["candor.attempt.number"] == 1
    assert attempt.attributes["candor.attempt.status"] == "completed"
    assert str(attempt.attributes["candor.attempt.id"]).startswith("att_")

    models = [span for span in spans if span.name == "candor.step model_request"]
    tools = [span for span in spans if span.name == "candor.step tool_call"]
    assert len(models) == 2
    assert sorted(span.attributes["candor.tool.name"] for span in tools) == ["charge", "lookup"]
    for step in (*models, *tools):
        assert "candor.attempt" in _ancestors(step, by_id)
        assert step.attributes["candor.run.id"] == ref.run_id
        assert step.attributes["candor.attempt.id"] == attempt.attributes["candor.attempt.id"]
    pydantic_ai = [span for span in spans if not span.name.startswith("candor.")]
    chats = [span for span in pydantic_ai if span.name.startswith("chat")]
    executions = [span for span in pydantic_ai if "tool" in span.name]
    assert len(chats) == 2 and len(executions) == 2, [span.name for span in pydantic_ai]
    for span in chats:
        assert by_id[span.parent.span_id].name == "candor.step model_request"
    for span in executions:
        assert by_id[span.parent.span_id].name == "candor.step tool_call"


async def _create_over_http(service: Any, workspace_id: str, headers: dict[str, str]) -> str:
    async with write_transaction(service.engine) as conn:
        key = await auth.create_principal(
            conn, workspace_id=workspace_id, permissions=["read", "run"], entropy=service.entropy
        )
    transport = httpx.ASGITransport(app=create_app(service, role="all"))
    body = {"agent": "scripted", "input": support.content("hi"), "options": {"script": "echo"}}
    async with httpx.AsyncClient(transport=transport, base_url="http://candor.test") as client:
        created = await client.post(
            "/v1/threads",
            json=body,
            headers={"Authorization": f"Bearer {key.secret}", "Idempotency-Key": "k", **headers},
        )
    assert created.status_code == 201, created.text
    return str(created.json()["run"]["id"])


@pytest.mark.parametrize(
    ("header", "stored"),
    [(TRACEPARENT, TRACEPARENT), (TRACEPARENT.upper(), TRACEPARENT), ("00-nonsense", None)],
    ids=["valid", "uppercase", "invalid"],
)
async def test_the_request_traceparent_is_stored_with_the_run_and_parents_its_trace(
    db, tenant, exported, header: str, stored: str | None
) -> None:
    """The `traceparent` of the request that created the run is stored with it (normalized; an invalid one is
    ignored, the request still succeeds), and the worker, which reads it from the run, traces under it."""
    telemetry, exporter = exported
    service = support.make_service(db.url, db.engine)
    service.telemetry = telemetry
    run_id = await _create_over_http(service, tenant.workspace_id, {"traceparent": header})
    async with db.engine.connect() as conn:
        assert (await conn.execute(select(runs.c.trace_context).where(runs.c.id == run_id))).scalar_one() == stored
    await WorkerLoop(service, worker_id="w1").run_until_idle(timeout=30)
    (run,) = [span for span in exporter.get_finished_spans() if span.name == "candor.run"]
    if stored is None:
        assert run.parent is None  # a root span in a trace of its own
    else:
        assert (f"{run.context.trace_id:032x}", f"{run.parent.span_id:016x}") == (TRACE, SPAN)


async def test_without_telemetry_no_traceparent_is_recorded(db, tenant) -> None:
    """Off by default: the app does not read the header, the run records nothing, the worker exports nothing."""
    service = support.make_service(db.url, db.engine)
    assert not service.telemetry.enabled and not service.settings.telemetry.enabled
    run_id = await _create_over_http(service, tenant.workspace_id, {"traceparent": TRACEPARENT})
    async with db.engine.connect() as conn:
        assert (await conn.execute(select(runs.c.trace_context).where(runs.c.id == run_id))).scalar_one() is None
    await WorkerLoop(service, worker_id="w1").run_until_idle(timeout=30)
    assert (await run_row(db.engine, run_id))["status"] == "completed"


async def test_recovered_calls_carry_their_outcome_on_the_recovering_attempt(db, tenant, control, exported) -> None:
    """S-28, S-29, H-46, H-47: a worker dies inside four tool calls; the next attempt, in another worker, is traced
    under the same run span and its span carries one `candor.recovery` event per call: reconciled, rerun, unknown,
    replayed. The dead attempt's span ends as an error; the run span, exported once, counts two attempts."""
    telemetry, exporter = exported
    service = support.make_service(db.url, db.engine, lease_seconds=30)
    service.telemetry = telemetry
    async with db.engine.begin() as conn:
        ref = await add_thread_run(conn, tenant, script="pay", trace_context=TRACEPARENT)
    control.tool_gate = asyncio.Event()
    first = WorkerLoop(service, worker_id="dying")
    task = asyncio.create_task(first.run_forever())

    async def all_tools_started() -> bool:
        return len(control.ledger) == 4

    await support.wait_for(all_tools_started)
    await support.kill_worker(first, task)
    control.tool_gate = None

    async def lease_run_out() -> bool:
        try:
            async with db.engine.begin() as conn:
                await conn.execute(
                    update(run_attempts)
                    .where(run_attempts.c.run_id == ref.run_id)
                    .values(lease_expires_at=db_now() - 1)
                )
        except OperationalError as error:  # the "dead" worker's SQLite transaction may still be finishing
            if "locked" not in str(error):
                raise
            return False
        return True

    await support.wait_for(lease_run_out, timeout=30, interval=0.2)
    await support.wait_for_lease_expiry(service)
    await support.make_due(db.engine, ref.run_id)
    survivor = support.make_service(db.url, db.engine, lease_seconds=10)
    survivor.telemetry = telemetry
    await WorkerLoop(survivor, worker_id="second").run_until_idle(timeout=30)
    assert (await run_row(db.engine, ref.run_id))["status"] == "completed"

    spans = exporter.get_finished_spans()
    (run,) = [span for span in spans if span.name == "candor.run"]
    assert run.attributes["candor.run.attempts"] == 2
    dead, recovering = sorted(
        (span for span in spans if span.name == "candor.attempt"),
        key=lambda span: span.attributes["candor.attempt.number"],
    )
    for attempt in (dead, recovering):
        assert attempt.parent.span_id == run.context.span_id and attempt.context.trace_id == run.context.trace_id
    assert not dead.status.is_ok and dead.attributes["candor.attempt.status"] == "abandoned"
    assert recovering.attributes["candor.attempt.start_reason"] == "recovery"
    outcomes = {
        event.attributes["candor.tool_call.id"]: event.attributes["candor.recovery.outcome"]
        for event in recovering.events
        if event.name == "candor.recovery"
    }
    assert outcomes == {
        "call_charge": "reconciled",
        "call_refund": "rerun",
        "call_notify": "unknown",
        "call_lookup": "replayed",
    }
    assert not [event for event in dead.events if event.name == "candor.recovery"]


async def test_a_resume_successor_records_the_resume_request_traceparent(db, tenant, exported) -> None:
    """§8.6: the successor a resume creates records the `traceparent` of the resume request (not the waiting run's),
    so its run span hangs under the span of the request that resumed it."""
    telemetry, exporter = exported
    service = support.make_service(db.url, db.engine)
    service.telemetry = telemetry
    async with db.engine.begin() as conn:
        ref = await add_thread_run(conn, tenant, script="approval", trace_context=TRACEPARENT)
    await WorkerLoop(service, worker_id="w1").run_until_idle(timeout=30)
    assert (await run_row(db.engine, ref.run_id))["status"] == "waiting"
    async with write_transaction(service.engine) as conn:
        key = await auth.create_principal(
            conn, workspace_id=tenant.workspace_id, permissions=["read", "run"], entropy=service.entropy
        )
    resumed_by = f"00-{'1' * 32}-{'2' * 16}-01"
    transport = httpx.ASGITransport(app=create_app(service, role="all"))
    async with httpx.AsyncClient(transport=transport, base_url="http://candor.test") as client:
        answer = {"approvals": {"call_delete": {"action": "approve"}}, "calls": {}}
        resumed = await client.post(
            f"/v1/runs/{ref.run_id}/resume",
            json=answer,
            headers={"Authorization": f"Bearer {key.secret}", "Idempotency-Key": "r", "traceparent": resumed_by},
        )
    assert resumed.status_code == 201, resumed.text
    successor_id = resumed.json()["id"]
    async with db.engine.connect() as conn:
        stored = (await conn.execute(select(runs.c.trace_context).where(runs.c.id == successor_id))).scalar_one()
    assert stored == resumed_by
    await WorkerLoop(service, worker_id="w1").run_until_idle(timeout=30)
    run_spans = {
        span.attributes["candor.run.id"]: span for span in exporter.get_finished_spans() if span.name == "candor.run"
    }
    assert run_spans[ref.run_id].attributes["candor.run.status"] == "waiting"
    successor = run_spans[successor_id]
    assert (f"{successor.context.trace_id:032x}", f"{successor.parent.span_id:016x}") == ("1" * 32, "2" * 16)


async def test_a_child_run_continues_its_parent_trace_under_the_spawning_tool_call(db, tenant, exported) -> None:
    """§7.13: a child run started by a tool call records that call's step span as its trace context, so the child's
    run span sits in the parent's trace under the tool call that started it."""
    from candor.service.protocol.children import CHILD_TOOL_NAME

    from .test_children import make_service as make_parent_service

    telemetry, exporter = exported
    service = make_parent_service(db)
    service.telemetry = telemetry
    async with db.engine.begin() as conn:
        parent = await add_thread_run(conn, tenant, agent="parent", script="spawn", trace_context=TRACEPARENT)
    await WorkerLoop(service, worker_id="w1").run_until_idle(timeout=30)

    spans = exporter.get_finished_spans()
    (spawn,) = [
        span
        for span in spans
        if span.name == "candor.step tool_call" and span.attributes["candor.tool.name"] == CHILD_TOOL_NAME
    ]
    run_spans = [span for span in spans if span.name == "candor.run"]
    (child,) = [span for span in run_spans if span.attributes["candor.run.id"] != parent.run_id]
    assert child.context.trace_id == spawn.context.trace_id == int(TRACE, 16)
    assert child.parent is not None and child.parent.span_id == spawn.context.span_id
    async with db.engine.connect() as conn:
        stored = (
            await conn.execute(select(runs.c.trace_context).where(runs.c.id == child.attributes["candor.run.id"]))
        ).scalar_one()
    assert stored == f"00-{TRACE}-{spawn.context.span_id:016x}-01"


async def test_a_run_the_recovery_seals_failed_gets_its_run_span(db, tenant, exported) -> None:
    """S-30, §7.6: a model that stays unavailable on the run's last attempt: the recovery seals the run failed, and
    the run span is exported with the failure code, as an error."""
    telemetry, exporter = exported
    service = support.make_service(db.url, db.engine)
    service.telemetry = telemetry
    async with db.engine.begin() as conn:
        ref = await add_thread_run(conn, tenant, script="unavailable", max_attempts=1)
    await WorkerLoop(service, worker_id="w1").run_until_idle(timeout=30)
    assert (await run_row(db.engine, ref.run_id))["status"] == "failed"
    spans = exporter.get_finished_spans()
    (attempt,) = [span for span in spans if span.name == "candor.attempt"]
    (run,) = [span for span in spans if span.name == "candor.run"]
    assert attempt.attributes["candor.failure.code"] == "model_unavailable" and not attempt.status.is_ok
    assert run.parent is None  # created without a trace context: the root of its own trace
    assert run.attributes["candor.run.status"] == "failed"
    assert run.attributes["candor.failure.code"] == "model_unavailable" and not run.status.is_ok
