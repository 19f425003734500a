"""Runs of an agent bound to a real OpenAI chat model (`[agents.assistant.model]`) talking to the scripted provider
over TCP, through the worker on SQLite and PostgreSQL (§7.7–§7.9, §8.7, docs/providers.md).

Stream entries are read from the store: the SSE endpoint (§8.7) sends exactly these rows, and an ASGI test client
would buffer the response instead of showing when each entry appeared.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select, text

from candor.service import commands
from candor.service.protocol.authority import Principal
from candor.service.store.schema.tables import metadata
from candor.service.store.threads.streams import read_stream
from candor.service.worker import WorkerLoop

from model_provider.agents import AGENT, charges
from model_provider.scripted_openai import Reply, Request, ScriptedOpenAI, ToolCall, in_order, tool_results
from model_provider.support import provider_service
from worker.support import add_thread_run, attempt_rows, content, make_due, run_one_attempt, run_row

FINAL_TEXT = "Your card was charged 42 euros. Anything else?"


def billing(request: Request) -> Reply:
    """Charge first (streamed tool call), then a slowly streamed final text: 0.3 s between chunks."""
    if tool_results(request):
        return Reply(text=FINAL_TEXT, chunk_chars=8, chunk_delay=0.3)
    return Reply(text="Charging.", tool_calls=[ToolCall("charge_card", {"amount": 42}, "call_charge")])


def _text_deltas(entries: list[Any]) -> str:
    """The text the model streamed, joined from the `delta` entries (pydantic-ai part start/delta events)."""
    pieces = []
    for entry in entries:
        event = entry.event if entry.type == "delta" else None
        if not isinstance(event, dict):
            continue
        if event.get("event_kind") == "part_start" and event["part"].get("part_kind") == "text":
            pieces.append(event["part"]["content"])
        elif event.get("event_kind") == "part_delta" and event["delta"].get("part_delta_kind") == "text":
            pieces.append(event["delta"]["content_delta"])
    return "".join(pieces)


def _principal(tenant: Any) -> Principal:
    return Principal(id=tenant.principal_id, workspace_id=tenant.workspace_id, permissions=frozenset({"read", "run"}))


async def test_text_deltas_reach_the_thread_stream_while_the_provider_streams(db, tenant, api_key, tmp_path) -> None:
    """§7.7 step 7, §8.7: a thread created through the commands runs on the OpenAI model; the final answer's text
    deltas are on the thread stream while the provider is still sending it (0.3 s between chunks); the tool ran
    once, the output is the streamed text, usage is the provider's."""
    with ScriptedOpenAI(billing) as provider:
        service = provider_service(db, provider.base_url)
        accepted = await commands.create_thread(
            service,
            _principal(tenant),
            agent=AGENT,
            input=content("Charge my card 42 euros."),
            options={"workdir": str(tmp_path)},
            key="k1",
        )
        assert accepted.run is not None
        worker = asyncio.create_task(WorkerLoop(service).run_until_idle(timeout=60))
        seen_mid_stream: set[str] = set()
        while not worker.done():
            entries = await read_stream(
                db.engine, workspace_id=tenant.workspace_id, thread_id=accepted.thread.id, after=None, limit=10_000
            )
            # read first, then check: the counter only grows, so the entries were there before the end was sent
            if provider.streams_finished < 2:
                seen_mid_stream.add(_text_deltas(entries).removeprefix("Charging."))
            await asyncio.sleep(0.05)
        await worker

    # while the provider was still sending (6 text chunks, 0.3 s apart), the stream already held part of the answer
    # (deltas are coalesced for `worker.stream_coalesce_seconds`, so not every chunk shows up on its own)
    partial = {seen for seen in seen_mid_stream if seen and seen != FINAL_TEXT}
    assert all(FINAL_TEXT.startswith(seen) for seen in seen_mid_stream)
    assert partial, seen_mid_stream
    run = await run_row(db.engine, accepted.run.id)
    assert (run["status"], run["output"], run["attempts"]) == ("completed", FINAL_TEXT, 1)
    assert run["usage"]["input_tokens"] == 22 and run["usage"]["output_tokens"] == 14  # two scripted responses
    assert charges(tmp_path) == ["inproc call_charge 42"]
    requests = provider.recorded()
    assert [r.body["stream"] for r in requests] == [True, True]
    assert tool_results(requests[1]) == {"call_charge": "charged 42"}
    assert requests[0].headers["authorization"] == f"Bearer {api_key}"


async def test_the_api_key_is_never_stored(db, tenant, api_key, tmp_path) -> None:
    """docs/providers.md: the key from the environment reaches the provider, and no row of any table holds it
    (checkpoints, messages, stream entries, runs, attempts, usage, inbox, outbox)."""
    with ScriptedOpenAI(billing) as provider:
        service = provider_service(db, provider.base_url)
        async with db.engine.begin() as conn:
            ref = await add_thread_run(conn, tenant, agent=AGENT, options={"workdir": str(tmp_path)})
        await WorkerLoop(service).run_until_idle(timeout=60)
    assert (await run_row(db.engine, ref.run_id))["status"] == "completed"
    assert all(r.headers["authorization"] == f"Bearer {api_key}" for r in provider.recorded())
    dumped = []
    async with db.engine.connect() as conn:
        for table in metadata.sorted_tables:
            rows = (await conn.execute(select(table))).all()
            dumped.append(json.dumps([list(map(str, row)) for row in rows]))
        if db.url.startswith("postgresql"):  # and nothing outside the known tables either
            raw = (await conn.execute(text("SELECT string_agg(t::text, '') FROM checkpoints t"))).scalar_one()
            dumped.append(raw or "")
    everything = "".join(dumped)
    assert "call_charge" in everything  # the dump does hold the run's data
    assert api_key not in everything and api_key.removeprefix("sk-") not in everything


@pytest.mark.parametrize(
    ("failing", "timeout"),
    [
        pytest.param(Reply(status=503), 60.0, id="5xx"),
        pytest.param(Reply(status=429, headers={"Retry-After": "0.2"}), 60.0, id="429"),
        pytest.param(Reply(hang=True), 0.3, id="timeout"),
    ],
)
async def test_an_unavailable_provider_fails_the_attempt_with_model_unavailable(
    db, tenant, api_key, failing: Reply, timeout: float
) -> None:
    """H-31, S-50, S-30, §7.9: after the client's retries (`max_retries = 1`: two requests per attempt) each attempt
    ends `failed` / `model_unavailable` (charged, backoff); the last of `max_attempts` seals the run `failed` with
    that code. Never `attempt_failed` or a crash."""
    with ScriptedOpenAI(in_order(failing)) as provider:
        service = provider_service(db, provider.base_url, max_retries=1, timeout=timeout)
        async with db.engine.begin() as conn:
            ref = await add_thread_run(conn, tenant, agent=AGENT, max_attempts=2)
        await run_one_attempt(service)
        run = await run_row(db.engine, ref.run_id)
        assert (run["status"], run["attempts"]) == ("accepted", 1)  # recovered: due again after the backoff
        await make_due(db.engine, ref.run_id)
        await WorkerLoop(service).run_until_idle(timeout=60)
        requests = len(provider.recorded())
    run = await run_row(db.engine, ref.run_id)
    assert (run["status"], run["attempts"], run["failure"]["code"]) == ("failed", 2, "model_unavailable")
    attempts = await attempt_rows(db.engine, ref.run_id)
    assert [(a["status"], a["failure"]["code"]) for a in attempts] == [("failed", "model_unavailable")] * 2
    assert requests == 4  # 2 attempts × (1 request + 1 client retry)


async def test_a_missing_key_seals_agent_unavailable(db, tenant, monkeypatch, tmp_path: Path) -> None:
    """S-49, docs/providers.md: without `base_url` OpenAI needs a key; when its variable is unset the run is sealed
    `failed` / `agent_unavailable` and the message names no value."""
    monkeypatch.delenv("SCRIPTED_OPENAI_KEY", raising=False)
    service = provider_service(db, None)
    async with db.engine.begin() as conn:
        ref = await add_thread_run(conn, tenant, agent=AGENT)
    await WorkerLoop(service).run_until_idle(timeout=30)
    run = await run_row(db.engine, ref.run_id)
    assert (run["status"], run["failure"]["code"], run["attempts"]) == ("failed", "agent_unavailable", 1)
