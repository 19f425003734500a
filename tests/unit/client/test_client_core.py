"""The client's shared core without I/O: the resume batch, retries that reuse the idempotency key, error mapping
(§8.1, §8.2, §8.6, §12.1)."""

from __future__ import annotations

from typing import Any

import pytest

from candor.client import (
    Conflict,
    IncompleteBatch,
    InvalidArgument,
    NotFound,
    PendingItem,
    RateLimited,
    ResumeBatch,
    ServerError,
    TransportFailed,
    Unavailable,
)
from candor.client._core import Call, Operation, Operations, Reply, RetryPolicy, Sleep
from candor.client.errors import error_for

PENDING = [
    PendingItem(tool_call_id="a1", tool_name="refund", arguments={"amount": 50}, kind="approval"),
    PendingItem(tool_call_id="a2", tool_name="delete", arguments={"path": "x"}, kind="approval"),
    PendingItem(tool_call_id="c1", tool_name="get_weather", arguments={}, kind="external"),
    PendingItem(tool_call_id="q1", tool_name="ask", arguments={"question": "why?"}, kind="question"),
]


def test_batch_answers_every_item_in_its_group() -> None:
    """§8.6: approvals in `approvals`, external calls and questions in `calls`; edited arguments ride on approve."""
    batch = ResumeBatch(PENDING)
    batch.approve("a1", arguments={"amount": 40}).deny("a2", reason="no").answer("c1", "sunny").fail("q1", "n/a")
    assert batch.with_input("ok").body() == {
        "approvals": {
            "a1": {"action": "approve", "arguments": {"amount": 40}},
            "a2": {"action": "deny", "reason": "no"},
        },
        "calls": {"c1": {"status": "returned", "value": "sunny"}, "q1": {"status": "failed", "message": "n/a"}},
        "input": {"content": [{"type": "text", "text": "ok"}]},
    }


def test_batch_refuses_locally_unless_complete_and_well_placed() -> None:
    """S-78 checked before sending: a missing answer, an unknown id or a wrong-kind answer never leaves the client."""
    batch = ResumeBatch(PENDING).approve("a1")
    with pytest.raises(IncompleteBatch) as missing:
        batch.body()
    assert missing.value.missing == ["a2", "c1", "q1"]
    with pytest.raises(IncompleteBatch) as unknown:
        batch.approve("zz")
    assert unknown.value.unexpected == ["zz"]
    with pytest.raises(ValueError, match="approve or deny"):
        batch.answer("a2", 1)
    with pytest.raises(ValueError, match="answer or fail"):
        batch.approve("c1")
    with pytest.raises(ValueError, match="JSON object"):
        batch.approve("a2", arguments=["not", "an", "object"])  # type: ignore[arg-type]


def _drive(op: Operation[Any], outcomes: list[Reply | Exception]) -> tuple[Any, list[Call], list[float]]:
    """Run an operation against scripted outcomes; the calls it sent and the sleeps it asked for."""
    calls: list[Call] = []
    sleeps: list[float] = []
    try:
        step = next(op)
        while True:
            if isinstance(step, Sleep):
                sleeps.append(step.seconds)
                step = op.send(None)
            else:
                calls.append(step)
                step = op.send(outcomes.pop(0))
    except StopIteration as stop:
        return stop.value, calls, sleeps


def _reply(status: int, body: Any = None, **headers: str) -> Reply:
    return Reply(status=status, headers={k.replace("_", "-").lower(): v for k, v in headers.items()}, body=body)


THREAD = {"thread": {"id": "thr_1"}, "entry": {"id": "ent_1"}, "run": None}
NO_JITTER = RetryPolicy(attempts=4, initial_delay=0.1, jitter=0)


def test_retries_reuse_the_idempotency_key_and_honour_retry_after() -> None:
    """§8.2: every retry of one logical call carries the same key; 503 → backoff, 429 → its Retry-After; the
    replayed create (200) is reported as not created."""
    ops = Operations(retry=NO_JITTER)
    outcomes: list[Reply | Exception] = [
        ConnectionError("reset"),
        _reply(503, {"error": {"code": "unavailable"}}),
        _reply(429, retry_after="2"),
        _reply(200, THREAD),
    ]
    accepted, calls, sleeps = _drive(ops.create_thread("support", "hi"), outcomes)
    assert len(calls) == 4 and len({call.idempotency_key for call in calls}) == 1
    assert calls[0].idempotency_key and calls[0].idempotency_key.startswith("cli_")
    assert sleeps == [0.1, 0.2, 2.0]
    assert accepted.thread_id == "thr_1" and accepted.created is False
    _, again, _ = _drive(ops.create_thread("support", "hi"), [_reply(201, THREAD)])
    assert again[0].idempotency_key != calls[0].idempotency_key  # a new logical call gets a new key


def test_retries_are_bounded_and_4xx_is_not_retried() -> None:
    ops = Operations(retry=NO_JITTER)
    with pytest.raises(TransportFailed):
        _drive(ops.get_run("run_1"), [ConnectionError("x")] * 4)
    with pytest.raises(Unavailable) as unavailable:
        _drive(
            ops.get_run("run_1"),
            [
                _reply(
                    503,
                    {
                        "error": {
                            "code": "unavailable",
                            "message": "m",
                            "details": {"dependency": "database"},
                            "request_id": "req_1",
                        }
                    },
                )
            ]
            * 4,
        )
    assert unavailable.value.details == {"dependency": "database"} and unavailable.value.request_id == "req_1"
    conflict = {
        "error": {
            "code": "conflict",
            "message": "m",
            "details": {"reason": "not_idle_waiting_run"},
            "request_id": "req_2",
        }
    }
    with pytest.raises(Conflict) as refused:
        _drive(ops.resume("run_1", {"approvals": {}, "calls": {}}), [_reply(409, conflict)])
    assert (refused.value.status, refused.value.code, refused.value.reason) == (409, "conflict", "not_idle_waiting_run")
    with pytest.raises(RateLimited):  # a Retry-After beyond the policy's bound is not waited for
        _drive(ops.get_run("run_1"), [_reply(429, retry_after="3600")])


def test_error_mapping_by_code_then_status() -> None:
    """§12.1: one class per family; `invalid_cursor` is an InvalidArgument; a non-envelope 502 is a ServerError."""
    assert type(error_for(400, {"error": {"code": "invalid_cursor", "message": "m"}})) is InvalidArgument
    assert type(error_for(404, {"error": {"code": "not_found", "message": "m"}})) is NotFound
    proxy = error_for(502, "<html>bad gateway</html>")
    assert type(proxy) is ServerError and (proxy.code, proxy.status) == ("http_502", 502)


def test_wait_for_run_polls_with_backoff_until_sealed() -> None:
    clock = [0.0]
    ops = Operations(retry=NO_JITTER, monotonic=lambda: clock[0])
    view = {"id": "run_1", "thread_id": "thr_1", "agent": "a", "version": 1, "pending": None}
    outcomes: list[Reply | Exception] = [
        _reply(200, view | {"status": s}) for s in ("accepted", "running", "running", "waiting")
    ]
    run, calls, sleeps = _drive(ops.wait_for_run("run_1", poll_initial=0.05, poll_max=0.1), outcomes)
    assert run.status == "waiting" and len(calls) == 4 and sleeps == [0.05, 0.1, 0.1]
