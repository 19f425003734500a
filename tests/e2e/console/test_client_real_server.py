"""`candor.client.CandorClient` (blocking) against a real `candor serve` with the scripted approvals agent, on
SQLite and PostgreSQL: a run that suspends on two approvals and a question, the strict batch built from its pending
list (edited arguments that do not fit the tool's schema refused before the wait ends, approve with edited
arguments, deny with a reason, answer the question), the successor's output, the
stream's entries with `Last-Event-ID` (§8.3, §8.6, §8.7, §8.8; S-78, S-80, S-81)."""

from __future__ import annotations

from typing import Any

import pytest

from candor.client import CandorClient, IncompleteBatch, InvalidArgument, ResumeBatch, RetryPolicy

pytestmark = pytest.mark.crash  # real processes


def test_suspend_answer_and_continue(server: Any) -> None:
    with CandorClient(server.base_url, server.secret, retry=RetryPolicy(attempts=3, initial_delay=0.05)) as client:
        accepted = client.create_thread("approvals", "Refund order A1 and clean up.")
        assert accepted.run is not None
        run = client.wait_for_run(accepted.run.id, timeout=30)
        assert run.status == "waiting", run.raw
        assert [(i.tool_call_id, i.kind) for i in run.pending] == [
            ("call_refund_a1", "approval"),
            ("call_delete_log", "approval"),
            ("call_currency", "question"),
        ]
        assert [r.id for r in client.waiting_runs()] == [run.id]

        wrong = ResumeBatch(run.pending).approve("call_refund_a1", arguments={"order_id": "A1", "amount": "forty"})
        wrong.approve("call_delete_log").answer("call_currency", "EUR")
        with pytest.raises(InvalidArgument) as refused:  # the tool's schema, checked before the wait ends (H-75)
            client.resume(run.id, wrong)
        assert refused.value.details["fields"] == [
            {"field": "approvals.call_refund_a1.arguments", "reason": "does_not_fit_tool_schema"}
        ]
        assert [r.id for r in client.waiting_runs()] == [run.id]  # nothing changed

        batch = ResumeBatch(run.pending).approve("call_refund_a1", arguments={"order_id": "A1", "amount": 40})
        batch.deny("call_delete_log", reason="keep the logs")
        with pytest.raises(IncompleteBatch):
            client.resume(run.id, batch)  # refused locally: the question has no answer yet
        batch.answer("call_currency", "EUR")
        successor = client.resume(run.id, batch, idempotency_key="answer-refund")
        assert client.resume(run.id, batch, idempotency_key="answer-refund").id == successor.id
        done = client.wait_for_run(successor.id, timeout=30)
        assert done.status == "completed", done.raw
        assert "refunded 40 on A1" in done.output and "keep the logs" in done.output and "EUR" in done.output
        assert list(client.waiting_runs()) == []

        events = []
        for event in client.stream(accepted.thread_id, reconnect=False):
            events.append(event)
            if event.event == "boundary":
                break
        assert events and events[-1].event == "boundary" and events[-1].id is not None
        after = client.stream(accepted.thread_id, last_event_id=events[-1].id, reconnect=False)
        first_after = next(after, None)  # the stream ends after the final `changed` or when the server closes it
        if first_after is not None and first_after.id is not None:
            assert int(first_after.id) > int(events[-1].id)  # only entries after Last-Event-ID
