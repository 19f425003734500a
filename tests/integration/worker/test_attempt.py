"""Executing attempts end to end (§7.7–§7.10) on both dialects with scripted agents."""

from __future__ import annotations

import json
from typing import Any

from pydantic_ai.messages import ModelRequest, ModelResponse, ToolReturnPart, UserPromptPart
from sqlalchemy import func, select, update

from candor.service.store.attempts.seals import select_run_usage
from candor.service.store.checkpoints.incremental import (
    CheckpointEnvelope,
    EncodedMessage,
    insert_checkpoint,
    load_state,
)
from candor.service.store.checkpoints.packed_messages import unpack_messages
from candor.service.store.schema.dialect import db_now
from candor.service.store.schema.tables import (
    checkpoint_messages,
    checkpoints,
    inbox_entries,
    principals,
    run_attempts,
    runs,
    threads,
)
from candor.service.worker import WorkerLoop

from worker import support
from worker.support import add_thread_run, attempt_rows, run_row


async def _checkpoint_rows(engine: Any, run_id: str) -> list[Any]:
    async with engine.connect() as conn:
        query = select(checkpoints).where(checkpoints.c.run_id == run_id).order_by(checkpoints.c.seq)
        rows = list((await conn.execute(query)).mappings().all())
        legacy = select(func.count()).select_from(checkpoint_messages)
        assert (await conn.execute(legacy)).scalar_one() == 0  # new messages are packed in their checkpoint's row
    return [dict(row) | {"rows": _packed_count(row)} for row in rows]


def _packed_count(row: Any) -> int:
    """How many messages a checkpoint row holds itself (its new ones, packed)."""
    first, count = row["kept"], row["count"] - row["kept"]
    return len(unpack_messages(row["messages"], checkpoint_id=row["id"], first_index=first, count=count))


async def test_completed_run_commits_every_boundary(db, service, tenant, control) -> None:
    """S-35, S-37, S-39, S-41, S-5: one checkpoint per boundary, each writing only its new message; sealed completed."""
    async with db.engine.begin() as conn:
        ref = await add_thread_run(conn, tenant, script="tools")
    seen_counts: list[int] = []

    async def on_tool(name: str) -> None:
        # S-36: the tool-boundary commit holding this response is durable before any tool starts.
        async with db.engine.connect() as conn:
            seen_counts.append(
                (
                    await conn.execute(select(func.max(checkpoints.c.count)).where(checkpoints.c.run_id == ref.run_id))
                ).scalar_one()
            )

    control.on_tool = on_tool
    await WorkerLoop(service, worker_id="w1").run_until_idle(timeout=30)

    run = await run_row(db.engine, ref.run_id)
    assert run["status"] == "completed"
    assert run["output"] == "done"
    assert run["current_attempt_id"] is None and run["sealed_at"] is not None
    rows = await _checkpoint_rows(db.engine, ref.run_id)
    # model boundary (prompt), tool boundary (response), model boundary (returns), final commit (answer)
    assert [r["seq"] for r in rows] == [1, 2, 3, 4]
    assert [r["count"] for r in rows] == [1, 2, 3, 4]
    assert [r["kept"] for r in rows] == [0, 1, 2, 3]
    assert [r["rows"] for r in rows] == [1, 1, 1, 1]
    assert all(r["attempt"] == 1 for r in rows)
    assert rows[0]["base_id"] is None and [r["base_id"] for r in rows[1:]] == [r["id"] for r in rows[:-1]]
    assert run["checkpoint_id"] == rows[-1]["id"] and run["checkpoint_seq"] == 4
    assert seen_counts and min(seen_counts) >= 2
    async with db.engine.connect() as conn:
        loaded = await load_state(conn, run["checkpoint_id"])
        entry = (await conn.execute(select(inbox_entries).where(inbox_entries.c.id == ref.entry_id))).mappings().one()
        thread = (await conn.execute(select(threads).where(threads.c.id == ref.thread_id))).mappings().one()
        usage = (await conn.execute(select_run_usage(ref.run_id))).all()  # on the checkpoints and in usage_records
    history = loaded.state.message_history
    assert [type(m) for m in history] == [ModelRequest, ModelResponse, ModelRequest, ModelResponse]
    assert loaded.state.thread_id == ref.thread_id
    # S-76: the source entry is consumed by the first commit
    assert entry["status"] == "consumed" and entry["incorporated_checkpoint_seq"] == 1
    assert thread["current_run_id"] is None and thread["last_run_id"] == ref.run_id
    assert sorted(control.ledger) == ["inproc call_charge charge 42", "inproc call_lookup lookup acme"]
    # usage records are deltas; the run's usage is their sum
    assert sum(row.usage["requests"] for row in usage) == run["usage"]["requests"] == 2
    attempts = await attempt_rows(db.engine, ref.run_id)
    assert [(a["number"], a["status"], a["start_reason"]) for a in attempts] == [(1, "succeeded", "initial")]
    assert attempts[0]["harness_run_id"].startswith("run_") and attempts[0]["started_at"] is not None


async def test_waiting_run_has_pending_items(db, service, tenant) -> None:
    """S-5, S-89: a suspended harness run seals `waiting` at its final commit with `pending` and `wait_reason`."""
    async with db.engine.begin() as conn:
        ref = await add_thread_run(conn, tenant, script="approval")
    await WorkerLoop(service).run_until_idle(timeout=30)

    run = await run_row(db.engine, ref.run_id)
    assert run["status"] == "waiting"
    assert run["wait_reason"] == "approval"
    assert run["pending"] == {
        "approvals": [
            {
                "tool_call_id": "call_delete",
                "tool_name": "delete_file",
                "arguments": {"path": "a.txt"},
                "kind": "approval",
                "metadata": {},
            }
        ],
        "calls": [],
    }
    assert run["checkpoint_seq"] >= 1
    async with db.engine.connect() as conn:
        envelope = (
            await conn.execute(select(checkpoints.c.envelope).where(checkpoints.c.id == run["checkpoint_id"]))
        ).scalar_one()
    assert json.loads(envelope)["deferred"]["approvals"][0]["tool_call_id"] == "call_delete"
    assert [a["status"] for a in await attempt_rows(db.engine, ref.run_id)] == ["succeeded"]


async def test_resume_successor_runs_the_approved_call(db, service, tenant, control) -> None:
    """S-87, S-44: a resume successor passes the answers as a fresh batch and continues from the waiting run."""
    async with db.engine.begin() as conn:
        ref = await add_thread_run(conn, tenant, script="approval")
    worker = WorkerLoop(service)
    await worker.run_until_idle(timeout=30)
    waiting = await run_row(db.engine, ref.run_id)
    async with db.engine.begin() as conn:
        successor = await add_thread_run(
            conn,
            tenant,
            script="approval",
            text=None,
            thread_id=ref.thread_id,
            trigger="resume",
            lineage="continue",
            parent_run_id=ref.run_id,
            start_checkpoint_id=waiting["checkpoint_id"],
            resumed_by_id=tenant.principal_id,
            resume={"approvals": {"call_delete": {"action": "approve"}}, "calls": {}},
        )
    await worker.run_until_idle(timeout=30)

    run = await run_row(db.engine, successor.run_id)
    assert run["status"] == "completed" and run["output"] == "deleted"
    assert control.ledger == ["delete a.txt"]
    async with db.engine.connect() as conn:
        first = (
            (
                await conn.execute(
                    select(checkpoints).where(checkpoints.c.run_id == successor.run_id, checkpoints.c.seq == 1)
                )
            )
            .mappings()
            .one()
        )
        base_count = (
            await conn.execute(select(checkpoints.c.count).where(checkpoints.c.id == waiting["checkpoint_id"]))
        ).scalar_one()
        loaded = await load_state(conn, run["checkpoint_id"])
    # S-44: the successor's first commit extends the waiting run's checkpoint instead of copying its messages
    assert first["base_id"] == waiting["checkpoint_id"] and first["kept"] == base_count
    returns = [
        p
        for m in loaded.state.message_history
        if isinstance(m, ModelRequest)
        for p in m.parts
        if isinstance(p, ToolReturnPart)
    ]
    assert [(r.tool_call_id, r.content) for r in returns] == [("call_delete", "deleted a.txt")]


async def test_corrupt_stored_answers_fail_only_their_own_attempt(db, service, tenant, control) -> None:
    """S-87: a successor whose stored answers do not parse fails `deferred_results_invalid` before the model runs;
    the answers are parsed once at the claim, and another run claimed alongside it still completes."""
    async with db.engine.begin() as conn:
        ref = await add_thread_run(conn, tenant, script="approval")
    worker = WorkerLoop(service)
    await worker.run_until_idle(timeout=30)
    waiting = await run_row(db.engine, ref.run_id)
    async with db.engine.begin() as conn:
        successor = await add_thread_run(
            conn,
            tenant,
            script="approval",
            text=None,
            thread_id=ref.thread_id,
            trigger="resume",
            lineage="continue",
            parent_run_id=ref.run_id,
            start_checkpoint_id=waiting["checkpoint_id"],
            resumed_by_id=tenant.principal_id,
            resume={"approvals": {"call_delete": {"action": "maybe"}}, "calls": {}},
        )
        other = await add_thread_run(conn, tenant, script="echo")
    calls_before = control.model_calls
    await worker.run_until_idle(timeout=30)

    run = await run_row(db.engine, successor.run_id)
    assert (run["status"], run["failure"]["code"]) == ("failed", "deferred_results_invalid")
    assert "approvals.call_delete" in run["failure"]["message"]
    assert control.ledger == []
    assert (await run_row(db.engine, other.run_id))["status"] == "completed"
    assert control.model_calls == calls_before + 1  # only the other run called the model


async def test_refused_authority_seals_without_calling_the_agent(db, service, tenant, control) -> None:
    """S-63: an attempt whose authority check is refused seals `failed`/`authority_revoked`; the model never runs."""
    async with db.engine.begin() as conn:
        ref = await add_thread_run(conn, tenant, script="echo")
        await conn.execute(
            update(principals).where(principals.c.id == tenant.principal_id).values(permissions=["read"])
        )
    await WorkerLoop(service).run_until_idle(timeout=30)

    run = await run_row(db.engine, ref.run_id)
    assert run["status"] == "failed" and run["failure"]["code"] == "authority_revoked"
    assert control.model_calls == 0
    attempts = await attempt_rows(db.engine, ref.run_id)
    assert [(a["status"], a["failure"]["code"]) for a in attempts] == [("failed", "authority_revoked")]
    async with db.engine.connect() as conn:
        entry = (await conn.execute(select(inbox_entries).where(inbox_entries.c.id == ref.entry_id))).mappings().one()
    # S-71: an entry assigned to a run that ends failed fails with run_ended
    assert entry["status"] == "failed" and entry["failure"]["code"] == "run_ended"


async def test_agent_factory_failure_seals_agent_unavailable(db, service, tenant) -> None:
    """S-49: a factory that raises seals the run `failed` with `agent_unavailable`, without retries."""
    async with db.engine.begin() as conn:
        ref = await add_thread_run(conn, tenant, script="boom")
    await WorkerLoop(service).run_until_idle(timeout=30)
    run = await run_row(db.engine, ref.run_id)
    assert (run["status"], run["failure"]["code"], run["attempts"]) == ("failed", "agent_unavailable", 1)


async def test_transient_failures_exhaust_max_attempts(db, service, tenant) -> None:
    """S-30, S-31, S-50: `model_unavailable` is charged and retried after 2^(n−1) s; the last one seals failed."""
    async with db.engine.begin() as conn:
        ref = await add_thread_run(conn, tenant, script="unavailable", max_attempts=2)
    await support.run_one_attempt(service, timeout=30)

    run = await run_row(db.engine, ref.run_id)
    assert (run["status"], run["attempts"], run["current_attempt_id"]) == ("accepted", 1, None)
    async with db.engine.connect() as conn:
        due_in = (await conn.execute(_due_in(ref.run_id))).scalar_one()
    assert 0.5 < due_in <= 1.05  # S-31: min(60, 2^0) = 1 s, no jitter

    await support.make_due(db.engine, ref.run_id)
    await WorkerLoop(service).run_until_idle(timeout=30)
    run = await run_row(db.engine, ref.run_id)
    assert (run["status"], run["attempts"], run["failure"]["code"]) == ("failed", 2, "model_unavailable")
    attempts = await attempt_rows(db.engine, ref.run_id)
    assert [(a["status"], a["start_reason"], a["failure"]["code"]) for a in attempts] == [
        ("failed", "initial", "model_unavailable"),
        ("failed", "recovery", "model_unavailable"),
    ]


def _due_in(run_id: str) -> Any:
    return select(runs.c.available_at - db_now()).where(runs.c.id == run_id)


async def test_steer_entries_are_assigned_then_consumed(db, tenant, control) -> None:
    """S-66, S-67, §7.7 step 6: each commit assigns at most `delivery_count` compatible steer entries in position
    order; they reach the model at its next request and are consumed by the commit that incorporates them."""
    service = support.make_service(db.url, db.engine, delivery_count=1)
    async with db.engine.begin() as conn:
        ref = await add_thread_run(conn, tenant, script="step")
        first = await support.add_steer_entry(conn, ref, text="steer one", position=2)
        second = await support.add_steer_entry(conn, ref, text="steer two", position=3)
    await WorkerLoop(service).run_until_idle(timeout=30)

    run = await run_row(db.engine, ref.run_id)
    assert run["status"] == "completed"
    async with db.engine.connect() as conn:
        entries = {
            row.id: row
            for row in (await conn.execute(select(inbox_entries).where(inbox_entries.c.id.in_([first, second])))).all()
        }
        loaded = await load_state(conn, run["checkpoint_id"])
    # commit 1 (model boundary) assigns the first, commit 2 (tool boundary) the second; both enter the history at
    # the next model request, which commit 3 records
    assert [
        (entries[e].status, entries[e].assigned_run_id, entries[e].incorporated_checkpoint_seq) for e in (first, second)
    ] == [("consumed", ref.run_id, 3), ("consumed", ref.run_id, 3)]
    texts = [
        part.content
        for message in loaded.state.message_history
        if isinstance(message, ModelRequest)
        for part in message.parts
        if isinstance(part, UserPromptPart)
    ]
    assert texts == ["hello", "steer one", "steer two"]


async def test_corrupt_start_checkpoint_seals_checkpoint_corrupt(db, service, tenant, control) -> None:
    """S-46: a digest mismatch while rebuilding the start state seals `failed`/`checkpoint_corrupt`."""
    async with db.engine.begin() as conn:
        ref = await add_thread_run(conn, tenant, script="echo")
        body = '{"parts":[],"kind":"request"}'
        written = await insert_checkpoint(
            conn,
            thread_id=ref.thread_id,
            run_id=None,
            seq=0,
            attempt=None,
            base_id=None,
            base_encoded=(),
            new_encoded=[EncodedMessage(body=body, digest="0" * 64)],
            envelope=CheckpointEnvelope(thread_id=ref.thread_id),
        )
        await conn.execute(update(runs).where(runs.c.id == ref.run_id).values(start_checkpoint_id=written.id))
    await WorkerLoop(service).run_until_idle(timeout=30)
    run = await run_row(db.engine, ref.run_id)
    assert (run["status"], run["failure"]["code"], run["attempts"]) == ("failed", "checkpoint_corrupt", 1)
    assert control.model_calls == 0


async def test_oversized_envelope_and_output_seal_failed(db, tenant) -> None:
    """S-46, S-49, §7.9: an envelope over `worker.envelope_bytes` seals `checkpoint_envelope_too_large`; an output
    over `worker.output_bytes` seals `output_too_large`; neither is retried."""
    async with db.engine.begin() as conn:
        envelope_ref = await add_thread_run(conn, tenant, script="echo")
    await WorkerLoop(support.make_service(db.url, db.engine, envelope_bytes=20)).run_until_idle(timeout=30)
    run = await run_row(db.engine, envelope_ref.run_id)
    assert (run["status"], run["failure"]["code"], run["checkpoint_seq"]) == (
        "failed",
        "checkpoint_envelope_too_large",
        0,
    )

    async with db.engine.begin() as conn:
        output_ref = await add_thread_run(conn, tenant, script="echo")
    await WorkerLoop(support.make_service(db.url, db.engine, output_bytes=5)).run_until_idle(timeout=30)
    run = await run_row(db.engine, output_ref.run_id)
    assert (run["status"], run["failure"]["code"], run["attempts"]) == ("failed", "output_too_large", 1)
    # S-48: a failed seal keeps the checkpoint of the last commit
    assert run["checkpoint_seq"] == 1 and run["output"] is None


async def test_started_attempt_records_the_harness_run(db, service, tenant, control) -> None:
    """S-16: when the harness starts, the attempt becomes `running` with the harness `run_id` recorded."""
    async with db.engine.begin() as conn:
        ref = await add_thread_run(conn, tenant, script="tools")
    observed: list[tuple[str, str | None]] = []

    async def on_tool(name: str) -> None:
        async with db.engine.connect() as conn:
            row = (
                await conn.execute(
                    select(run_attempts.c.status, run_attempts.c.harness_run_id).where(
                        run_attempts.c.run_id == ref.run_id
                    )
                )
            ).one()
        observed.append((row.status, row.harness_run_id))

    control.on_tool = on_tool
    await WorkerLoop(service, worker_id="w1").run_until_idle(timeout=30)
    status, harness_run_id = observed[0]
    assert status == "running"
    assert harness_run_id is not None and harness_run_id.startswith("run_") and len(harness_run_id) == 36
    attempt = (await attempt_rows(db.engine, ref.run_id))[0]
    assert (attempt["status"], attempt["harness_run_id"]) == ("succeeded", harness_run_id)
