"""Tests for `candor.harness.harness`: `Harness.run()` end to end with scripted models (spec §3.5, §4.A, §4.C, §4.H).

Rules: H-9, H-10, H-11 (identity and immutability of the previous state), H-30 to H-34 (failures, usage,
messages), H-106 (`run()` equals a consumed `stream()`), H-107 (current system prompt on continuation).
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from pydantic import BaseModel
from pydantic_ai import Tool
from pydantic_ai.exceptions import ModelConnectionError, ModelHTTPError, ModelRequestTimeout, ModelRetry
from pydantic_ai.messages import (
    ModelRequest,
    ModelResponse,
    SystemPromptPart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.usage import RunUsage, UsageLimits

from candor import Harness, HarnessState, RunResult
from candor.errors import StateError
from candor.tools import UNKNOWN_OUTCOME_CONTENT, recovery_retryable, unknown_outcome_result

from scripted import calls, canonical, consume, make_agent, script, stable, text, tool_call

RUN_ID = re.compile(r"^run_[0-9a-f]{32}$")
THREAD_ID = re.compile(r"^thr_[0-9a-f]{32}$")


def conversation(thread_id: str = "thr_prev") -> HarnessState:
    """A finished exchange: one question, one answer."""
    return HarnessState(
        schema_version="1",
        thread_id=thread_id,
        message_history=[
            ModelRequest(parts=[SystemPromptPart("old system prompt"), UserPromptPart("hello")]),
            ModelResponse(parts=[TextPart("hi there")]),
        ],
    )


def open_call_state(*call_parts: ToolCallPart) -> HarnessState:
    """A state exported at a tool boundary: the last response has calls without returns."""
    return HarnessState(
        schema_version="1",
        thread_id="thr_open",
        message_history=[ModelRequest(parts=[UserPromptPart("do it")]), ModelResponse(parts=list(call_parts))],
    )


async def failing_tool() -> str:
    """A tool whose error message must never leak into a result."""
    raise RuntimeError("secret-token-123")


# ---------------------------------------------------------------------------------------------- H-9, H-10


async def test_run_keeps_the_previous_thread_id() -> None:
    """H-9: result.thread_id == previous_state.thread_id, and the messages carry it as conversation id."""
    previous = conversation("ticket_42")
    result = await Harness(make_agent(script(text("ok")))).run("again", previous_state=previous)
    assert result.thread_id == "ticket_42"
    assert result.state is not None
    assert result.state.thread_id == "ticket_42"
    assert all(getattr(m, "conversation_id", None) in (None, "ticket_42") for m in result.all_messages())


async def test_run_without_previous_state_starts_new() -> None:
    """H-9: without previous_state the run starts from HarnessState.new(): fresh thr_ id, empty history."""
    first = await Harness(make_agent(script(text("ok")))).run("go")
    second = await Harness(make_agent(script(text("ok")))).run("go")
    assert THREAD_ID.fullmatch(first.thread_id)
    assert first.thread_id != second.thread_id
    assert first.new_messages() == first.all_messages()
    assert len(first.all_messages()) == 2


async def test_every_run_has_a_fresh_run_id() -> None:
    """H-10: each run has its own run_id matching ^run_[0-9a-f]{32}$, also on the same thread."""
    harness = Harness(make_agent(script(text("a"), text("b"), text("c"))))
    first = await harness.run("go")
    second = await harness.run("go", previous_state=first.state)
    stream = harness.stream("go", previous_state=second.state)
    await consume(stream)
    run_ids = [first.run_id, second.run_id, stream.run_id]
    assert all(RUN_ID.fullmatch(r) for r in run_ids)
    assert len(set(run_ids)) == 3
    assert stream.outcome is not None
    assert stream is not None
    assert stream.outcome.run_id == stream.run_id
    assert {m.run_id for m in second.new_messages()} == {second.run_id}


# ---------------------------------------------------------------------------------------------- H-11


def _approval_tool() -> Tool[Any]:
    def delete(path: str) -> str:
        return f"deleted {path}"

    return Tool(delete, requires_approval=True)


SCENARIOS: dict[str, Any] = {
    "completed": lambda: (make_agent(script(text("ok"))), conversation(), {}),
    "tools": lambda: (
        make_agent(script(calls(tool_call("add", {"a": 1, "b": 2})), text("3"))),
        conversation(),
        {},
    ),
    "failed": lambda: (
        make_agent(script(calls(tool_call("failing_tool"))), failing_tool),
        conversation(),
        {},
    ),
    "suspended": lambda: (
        make_agent(script(calls(tool_call("delete", {"path": "/x"}))), _approval_tool()),
        conversation(),
        {},
    ),
    "recovery": lambda: (
        make_agent(script(text("ok")), recovery_retryable(Tool(lambda value: value, name="safe_echo"))),
        open_call_state(tool_call("echo", {"value": "x"}, "c1"), tool_call("safe_echo", {"value": "y"}, "c2")),
        {},
    ),
    "usage-limit": lambda: (
        make_agent(script(calls(tool_call("add", {"a": 1, "b": 2})), text("3"))),
        conversation(),
        {"usage_limits": UsageLimits(request_limit=1)},
    ),
}


@pytest.mark.parametrize("name", list(SCENARIOS))
async def test_run_never_mutates_previous_state(name: str) -> None:
    """H-11: previous_state.model_dump_json() is byte-identical before and after any run."""
    agent, previous, options = SCENARIOS[name]()
    before = previous.model_dump_json()
    result = await Harness(agent).run("next", previous_state=previous, **options)
    assert result.status in ("completed", "failed", "suspended")
    assert previous.model_dump_json() == before


async def test_cancelled_stream_never_mutates_previous_state() -> None:
    """H-11: leaving a stream early (cancelled) does not touch previous_state either."""
    previous = conversation()
    before = previous.model_dump_json()
    agent = make_agent(script(calls(tool_call("add", {"a": 1, "b": 2})), text("3")))
    async with Harness(agent).stream("next", previous_state=previous) as stream:
        async for event in stream:
            if type(event).__name__ == "BoundaryEvent" and event.kind == "tool":
                stream.cancel()
    assert stream.outcome is not None
    assert stream.outcome.status == "cancelled"
    assert previous.model_dump_json() == before


# ---------------------------------------------------------------------------------------------- H-30


@pytest.mark.parametrize(
    "limits",
    [UsageLimits(request_limit=1), UsageLimits(tool_calls_limit=0), UsageLimits(output_tokens_limit=1)],
    ids=["requests", "tool-calls", "output-tokens"],
)
async def test_usage_limit_exceeded_ends_failed_with_state(limits: UsageLimits) -> None:
    """H-30: UsageLimitExceeded → status failed, code usage_limit_exceeded, with a state."""
    agent = make_agent(script(calls(tool_call("add", {"a": 1, "b": 2})), text("3")))
    result = await Harness(agent).run("go", usage_limits=limits)
    assert result.status == "failed"
    assert result.failure is not None
    assert result.failure.code == "usage_limit_exceeded"
    assert result.failure.retry_hint == "none"
    assert result.state is not None
    assert result.state.message_history
    assert HarnessState.model_validate_json(result.state.model_dump_json()) == result.state


async def test_usage_limit_from_harness_default() -> None:
    """H-30, H-32: the harness default applies when the run gives no usage_limits."""
    agent = make_agent(script(calls(tool_call("add", {"a": 1, "b": 2})), text("3")))
    result = await Harness(agent, usage_limits=UsageLimits(request_limit=1)).run("go")
    assert result.status == "failed"
    assert result.failure is not None
    assert result.failure.code == "usage_limit_exceeded"


# ---------------------------------------------------------------------------------------------- H-31


def _raiser(exc: BaseException) -> Any:
    def respond(messages: Any, info: Any) -> Any:
        raise exc

    return respond


MODEL_ERRORS = [
    (ModelHTTPError(500, "m", body="secret-token-123"), "model_unavailable", "new_run"),
    (ModelHTTPError(503, "m", body="secret-token-123"), "model_unavailable", "new_run"),
    (ModelHTTPError(599, "m"), "model_unavailable", "new_run"),
    (ModelHTTPError(429, "m"), "model_unavailable", "new_run"),
    (ModelHTTPError(408, "m"), "model_unavailable", "new_run"),
    (ModelHTTPError(400, "m", body="secret-token-123"), "agent_run_failed", "dependency_change"),
    (ModelHTTPError(401, "m"), "agent_run_failed", "dependency_change"),
    (ModelHTTPError(404, "m"), "agent_run_failed", "dependency_change"),
    (ModelHTTPError(499, "m"), "agent_run_failed", "dependency_change"),
    (ModelConnectionError("m", "secret-token-123", phase="connect"), "model_unavailable", "new_run"),
    (ModelRequestTimeout("m", 1.0), "model_unavailable", "new_run"),
    (ValueError("secret-token-123"), "agent_run_failed", "dependency_change"),
    (KeyError("secret-token-123"), "agent_run_failed", "dependency_change"),
]


@pytest.mark.parametrize(
    ("exc", "code", "hint"),
    MODEL_ERRORS,
    ids=lambda v: getattr(v, "status_code", None) or type(v).__name__ if isinstance(v, BaseException) else None,
)
async def test_model_errors_end_failed(exc: BaseException, code: str, hint: str) -> None:
    """H-31: model exceptions end the run failed with model_unavailable or agent_run_failed; no message leaks."""
    result = await Harness(make_agent(script(_raiser(exc)))).run("go")
    assert result.status == "failed"
    failure = result.failure
    assert failure is not None
    assert (failure.code, failure.retry_hint) == (code, hint)
    assert failure.details["error_type"] == type(exc).__name__
    assert "secret-token-123" not in failure.model_dump_json()
    assert result.state is not None
    assert "secret-token-123" not in result.state.model_dump_json()


async def test_tool_error_ends_failed_with_safe_state() -> None:
    """H-31, H-103: a tool's exception → agent_run_failed (dependency_change); the call gets an unknown outcome."""
    agent = make_agent(
        script(calls(tool_call("add", {"a": 1, "b": 1}, "c0"), tool_call("failing_tool", call_id="c1"))), failing_tool
    )
    result = await Harness(agent).run("go")
    assert result.status == "failed"
    failure = result.failure
    assert failure is not None
    assert (failure.code, failure.retry_hint) == ("agent_run_failed", "dependency_change")
    assert failure.details == {"error_type": "RuntimeError"}
    assert "secret-token-123" not in failure.model_dump_json()
    state = result.state
    assert state is not None
    assert "secret-token-123" not in state.model_dump_json()
    last = state.message_history[-1]
    assert isinstance(last, ModelRequest)
    returns = {p.tool_call_id: p for p in last.parts if isinstance(p, ToolReturnPart)}
    assert returns["c1"].content == UNKNOWN_OUTCOME_CONTENT
    assert returns["c1"].outcome == "interrupted"
    # the state can be continued: nothing is left open
    again = await Harness(make_agent(script(text("recovered")), failing_tool)).run("go on", previous_state=state)
    assert again.status == "completed"


@pytest.mark.parametrize("exc", [TimeoutError("t"), ConnectionError("c")], ids=["timeout", "connection"])
async def test_tool_timeout_is_not_a_model_error(exc: BaseException) -> None:
    """H-31: only the model client's connection/timeout errors are model_unavailable; a tool's are agent_run_failed."""

    async def flaky() -> str:
        raise exc

    result = await Harness(make_agent(script(calls(tool_call("flaky"))), flaky)).run("go")
    assert result.status == "failed"
    assert result.failure is not None
    assert (result.failure.code, result.failure.retry_hint) == ("agent_run_failed", "dependency_change")


def finish(value: int) -> int:
    """Finish with the value."""
    raise LookupError("secret-token-123")


async def test_output_function_error_ends_failed() -> None:
    """H-31: an exception from output code (an output function) ends the run failed with a state."""
    agent = make_agent(script(calls(tool_call("final_result", {"value": 3}))), output_type=finish)
    result = await Harness(agent).run("go")
    assert result.status == "failed"
    assert result.failure is not None
    assert result.failure.code == "agent_run_failed"
    assert result.failure.details == {"error_type": "LookupError"}
    assert result.state is not None
    assert "secret-token-123" not in result.state.model_dump_json()


async def test_output_validator_error_ends_failed() -> None:
    """H-31: an exception from an output validator ends the run failed with its own error_type."""
    agent = make_agent(script(text("answer")))

    @agent.output_validator
    def check(output: str) -> str:
        raise LookupError("secret-token-123")

    result = await Harness(agent).run("go")
    assert result.status == "failed"
    assert result.failure is not None
    assert result.failure.code == "agent_run_failed"
    assert result.failure.details == {"error_type": "LookupError"}


async def test_agent_with_output_validator_completes() -> None:
    """H-106 (§3.5): the wrapped agent need not declare DeferredToolRequests; its output validators still run."""
    agent = make_agent(script(text("answer")))

    @agent.output_validator
    def shout(output: str) -> str:
        return output.upper()

    result = await Harness(agent).run("go")
    assert (result.status, result.output) == ("completed", "ANSWER")


async def test_model_retry_is_not_a_failure() -> None:
    """H-31: a ModelRetry handled by pydantic-ai is not an escaping exception; the run completes."""
    attempts: list[int] = []

    def picky(n: int) -> int:
        attempts.append(n)
        if n < 2:
            raise ModelRetry("bigger")
        return n

    agent = make_agent(
        script(calls(tool_call("picky", {"n": 1}, "c1")), calls(tool_call("picky", {"n": 2}, "c2")), text("ok")), picky
    )
    result = await Harness(agent).run("go")
    assert result.status == "completed"
    assert attempts == [1, 2]


# ---------------------------------------------------------------------------------------------- H-32


async def test_run_limits_replace_the_default_entirely() -> None:
    """H-32: a run-level usage_limits replaces the harness default; default-only limits do not apply."""
    default = UsageLimits(request_limit=10, tool_calls_limit=0)
    agent = make_agent(script(calls(tool_call("add", {"a": 1, "b": 2})), text("3")))
    result = await Harness(agent, usage_limits=default).run("go", usage_limits=UsageLimits(request_limit=10))
    assert result.status == "completed"
    assert result.usage.tool_calls == 1
    strict = make_agent(script(calls(tool_call("add", {"a": 1, "b": 2})), text("3")))
    assert (await Harness(strict, usage_limits=default).run("go")).status == "failed"


async def test_run_limits_apply_without_default() -> None:
    """H-32: the run-level limits are enforced even when the harness has none."""
    agent = make_agent(script(calls(tool_call("add", {"a": 1, "b": 2})), text("3")))
    result = await Harness(agent).run("go", usage_limits=UsageLimits(request_limit=1))
    assert result.failure is not None
    assert result.failure.code == "usage_limit_exceeded"


# ---------------------------------------------------------------------------------------------- H-33


def two_request_agent() -> Any:
    return make_agent(script(calls(tool_call("add", {"a": 1, "b": 2})), text("3")))


def stored_usage(result: RunResult[Any]) -> dict[str, Any]:
    assert result.state is not None
    usage = result.state.capabilities["candor.usage"].data
    assert isinstance(usage, dict)
    return usage


async def test_each_run_writes_its_usage() -> None:
    """H-33: each run writes its cumulative usage to "candor.usage"; it equals result.usage."""
    result = await Harness(two_request_agent()).run("go")
    assert result.usage.requests == 2
    assert result.usage.tool_calls == 1
    assert stored_usage(result)["requests"] == 2
    assert stored_usage(result)["tool_calls"] == 1
    assert stored_usage(result)["input_tokens"] == result.usage.input_tokens
    assert result.state is not None
    assert result.state.capabilities["candor.usage"].version


async def test_resume_usage_continues_counting() -> None:
    """H-33: resume_usage=True continues the counters; without it a run counts from zero (or `usage`)."""
    first = await Harness(two_request_agent()).run("go")
    second = await Harness(two_request_agent()).run("go", previous_state=first.state, resume_usage=True)
    assert second.usage.requests == 4
    assert second.usage.tool_calls == 2
    assert second.usage.input_tokens == 2 * first.usage.input_tokens + (
        second.usage.input_tokens - 2 * first.usage.input_tokens
    )
    assert stored_usage(second)["requests"] == 4
    assert second.state is not None
    restored = HarnessState.model_validate_json(second.state.model_dump_json())
    third = await Harness(two_request_agent()).run("go", previous_state=restored, resume_usage=True)
    assert third.usage.requests == 6
    fresh = await Harness(two_request_agent()).run("go", previous_state=third.state)
    assert fresh.usage.requests == 2
    assert stored_usage(fresh)["requests"] == 2
    started = await Harness(two_request_agent()).run("go", usage=RunUsage(requests=10, tool_calls=3))
    assert (started.usage.requests, started.usage.tool_calls) == (12, 4)


async def test_failed_run_writes_its_usage() -> None:
    """H-33: a failed run also records the usage it spent."""
    result = await Harness(two_request_agent()).run("go", usage_limits=UsageLimits(tool_calls_limit=0))
    assert result.status == "failed"
    assert stored_usage(result)["requests"] == result.usage.requests >= 1


@pytest.mark.parametrize("entry", ["run", "stream"])
async def test_resume_usage_without_stored_usage_raises_before_model_work(entry: str) -> None:
    """H-33: resume_usage=True without "candor.usage" → StateError(usage_state_missing) before any model work."""
    model = script(text("never"))
    harness = Harness(make_agent(model))
    for previous in (None, conversation()):
        with pytest.raises(StateError) as info:
            if entry == "run":
                await harness.run("go", previous_state=previous, resume_usage=True)
            else:
                harness.stream("go", previous_state=previous, resume_usage=True)  # raised synchronously
        assert info.value.code == "usage_state_missing"
    assert model.seen == []


# ---------------------------------------------------------------------------------------------- H-34


async def test_new_messages_are_exactly_the_appended_ones() -> None:
    """H-34: new_messages() is what this run appended; all_messages() equals state.message_history."""
    previous = conversation()
    agent = make_agent(script(calls(tool_call("add", {"a": 1, "b": 2})), text("3")))
    result = await Harness(agent).run("next", previous_state=previous)
    all_messages = result.all_messages()
    assert result.state is not None
    assert canonical(all_messages) == canonical(result.state.message_history)
    assert canonical(all_messages[:2]) == canonical(previous.message_history)
    assert canonical(result.new_messages()) == canonical(all_messages[2:])
    assert [type(m).__name__ for m in result.new_messages()] == [
        "ModelRequest",
        "ModelResponse",
        "ModelRequest",
        "ModelResponse",
    ]


async def test_new_messages_include_unknown_outcome_requests() -> None:
    """H-34, H-44: the unknown-outcome request made by recovery is part of new_messages() and the state."""
    previous = open_call_state(tool_call("echo", {"value": "x"}, "c1"))
    result = await Harness(make_agent(script(text("ok")))).run("next", previous_state=previous)
    assert result.status == "completed"
    new = result.new_messages()
    assert isinstance(new[0], ModelRequest)
    part = new[0].parts[0]
    expected = unknown_outcome_result(tool_call("echo", {"value": "x"}, "c1"))
    assert isinstance(part, ToolReturnPart)
    assert (part.tool_name, part.tool_call_id, part.content, part.outcome, part.metadata) == (
        expected.tool_name,
        expected.tool_call_id,
        expected.content,
        expected.outcome,
        expected.metadata,
    )
    assert result.state is not None
    assert canonical(result.all_messages()) == canonical(result.state.message_history)
    assert canonical(result.all_messages()[:2]) == canonical(previous.message_history)
    assert len(result.new_messages()) == len(result.all_messages()) - 2


async def test_suspended_run_messages() -> None:
    """H-34: for a suspended run all_messages() equals state.message_history; new_messages() is the appended tail."""
    previous = conversation()
    agent = make_agent(script(calls(tool_call("delete", {"path": "/x"}))), _approval_tool())
    result = await Harness(agent).run("delete it", previous_state=previous)
    assert result.status == "suspended"
    assert result.state is not None
    assert canonical(result.all_messages()) == canonical(result.state.message_history)
    assert canonical(result.new_messages()) == canonical(result.all_messages()[2:])
    assert isinstance(result.new_messages()[-1], ModelResponse)


async def test_failed_run_new_messages() -> None:
    """H-34: a failed run's new_messages() starts right after the previous history."""
    previous = conversation()
    result = await Harness(make_agent(script(calls(tool_call("failing_tool"))), failing_tool)).run(
        "next", previous_state=previous
    )
    assert result.status == "failed"
    assert canonical(result.all_messages()[:2]) == canonical(previous.message_history)
    assert canonical(result.new_messages()) == canonical(result.all_messages()[2:])
    assert result.state is not None
    assert canonical(result.all_messages()) == canonical(result.state.message_history)


# ---------------------------------------------------------------------------------------------- H-106


class Answer(BaseModel):
    value: int


RUN_SCENARIOS: dict[str, Any] = {
    "text": lambda: (make_agent(script(text("ok"))), None, {}),
    "tools": lambda: (
        make_agent(
            script(calls(tool_call("add", {"a": 1, "b": 2}), tool_call("echo", {"value": "v"}, "c2")), text("3"))
        ),
        conversation(),
        {},
    ),
    "structured": lambda: (
        make_agent(
            script(
                calls(tool_call("add", {"a": 1, "b": 2})),
                calls(tool_call("final_result", {"value": 3}, "c9")),
            ),
            output_type=Answer,
        ),
        None,
        {},
    ),
    "suspended": lambda: (
        make_agent(
            script(calls(tool_call("delete", {"path": "/x"}), tool_call("add", {"a": 1, "b": 1}, "c2"))),
            _approval_tool(),
        ),
        conversation(),
        {},
    ),
    "failed": lambda: (make_agent(script(calls(tool_call("failing_tool"))), failing_tool), None, {}),
    "usage-limit": lambda: (
        make_agent(script(calls(tool_call("add", {"a": 1, "b": 2})), text("3"))),
        None,
        {"usage_limits": UsageLimits(request_limit=1)},
    ),
    "recovery": lambda: (
        make_agent(script(text("ok")), recovery_retryable(Tool(lambda value: value, name="safe_echo"))),
        open_call_state(tool_call("echo", {"value": "x"}, "c1"), tool_call("safe_echo", {"value": "y"}, "c2")),
        {},
    ),
}


@pytest.mark.parametrize("name", list(RUN_SCENARIOS))
async def test_run_equals_consumed_stream(name: str) -> None:
    """H-106: run() returns the same status, output and state as consuming stream() with the same arguments."""
    agent, previous, options = RUN_SCENARIOS[name]()
    previous = previous or HarnessState.new("thr_same")
    ran = await Harness(agent).run("go", previous_state=previous, **options)
    agent, previous, options = RUN_SCENARIOS[name]()
    previous = previous or HarnessState.new("thr_same")
    stream = Harness(agent).stream("go", previous_state=previous, **options)
    events = await consume(stream)
    streamed = stream.outcome
    assert streamed is not None
    assert events[-1].result is stream.result
    assert streamed.status == ran.status
    assert streamed.output == ran.output
    assert streamed.failure == ran.failure
    assert streamed.deferred == ran.deferred
    assert (streamed.state is None) == (ran.state is None)
    if ran.state is not None:
        assert streamed.state is not None
        assert ran.state is not None
        assert stable(json.loads(streamed.state.model_dump_json())) == stable(json.loads(ran.state.model_dump_json()))
    assert stable(canonical(streamed.new_messages())) == stable(canonical(ran.new_messages()))


@pytest.mark.parametrize("name", list(RUN_SCENARIOS))
async def test_result_states_round_trip(name: str) -> None:
    """H-5, H-13: the state of every kind of result survives a JSON round trip byte for byte."""
    agent, previous, options = RUN_SCENARIOS[name]()
    result = await Harness(agent).run("go", previous_state=previous, **options)
    state = result.state
    assert state is not None
    dumped = state.model_dump_json()
    loaded = HarnessState.model_validate_json(dumped)
    assert loaded == state
    assert loaded.model_dump_json() == dumped
    assert state.model_copy(deep=True) == state
    assert set(json.loads(dumped)) == {"schema_version", "thread_id", "message_history", "capabilities", "environment"}


# ---------------------------------------------------------------------------------------------- H-107


def system_prompts(messages: list[Any]) -> list[str]:
    return [
        p.content for m in messages if isinstance(m, ModelRequest) for p in m.parts if isinstance(p, SystemPromptPart)
    ]


async def test_continuation_sends_the_current_system_prompt() -> None:
    """H-107: the model gets the current agent's system prompt instead of the stored SystemPromptParts."""
    previous = conversation()
    model = script(calls(tool_call("add", {"a": 1, "b": 2})), text("3"))
    result = await Harness(make_agent(model, system_prompt="new system prompt")).run("next", previous_state=previous)
    assert result.status == "completed"
    assert len(model.seen) == 2
    for sent in model.seen:
        assert system_prompts(sent) == ["new system prompt"]
    # the substitution happens only in what is sent: stored messages are not rewritten
    assert canonical(result.all_messages()[:2]) == canonical(previous.message_history)
    assert system_prompts(result.all_messages()) == ["old system prompt"]


async def test_continuation_drops_every_historical_system_prompt() -> None:
    """H-107: system prompts stored anywhere in history are not sent; an agent without one sends none."""
    previous = HarnessState(
        schema_version="1",
        thread_id="thr_prev",
        message_history=[
            ModelRequest(parts=[SystemPromptPart("first"), UserPromptPart("a")]),
            ModelResponse(parts=[TextPart("b")]),
            ModelRequest(parts=[SystemPromptPart("second"), UserPromptPart("c")]),
            ModelResponse(parts=[TextPart("d")]),
        ],
    )
    model = script(text("e"))
    await Harness(make_agent(model)).run("next", previous_state=previous)
    sent = model.seen[0]
    assert system_prompts(sent) == []
    assert [
        p.content for m in sent if isinstance(m, ModelRequest) for p in m.parts if isinstance(p, UserPromptPart)
    ] == ["a", "c", "next"]


async def test_continuation_of_imported_history_without_system_prompt() -> None:
    """H-107: a host-imported history without a system prompt still gets the current one, once."""
    previous = HarnessState(
        schema_version="1",
        thread_id="thr_import",
        message_history=[ModelRequest(parts=[UserPromptPart("a")]), ModelResponse(parts=[TextPart("b")])],
    )
    model = script(text("c"))
    await Harness(make_agent(model, system_prompt="current")).run("next", previous_state=previous)
    assert system_prompts(model.seen[0]) == ["current"]


async def test_dynamic_system_prompt_is_evaluated_for_the_continuation() -> None:
    """H-107: the current agent's (dynamic) system prompt function is what the model sees."""
    model = script(text("c"))
    agent = make_agent(model)

    @agent.system_prompt
    def current() -> str:
        return "dynamic now"

    await Harness(agent).run("next", previous_state=conversation())
    assert system_prompts(model.seen[0]) == ["dynamic now"]


async def test_provider_suspended_response_keeps_historical_system_prompt() -> None:
    """H-107, H-59: a history ending in a provider-suspended response is continued as stored."""
    previous = HarnessState(
        schema_version="1",
        thread_id="thr_susp",
        message_history=[
            ModelRequest(parts=[SystemPromptPart("old system prompt"), UserPromptPart("hi")]),
            ModelResponse(parts=[TextPart("partial ")], state="suspended"),
        ],
    )
    model = script(text("continued"))
    result = await Harness(make_agent(model, system_prompt="new system prompt")).run(None, previous_state=previous)
    assert result.status == "completed"
    assert system_prompts(model.seen[0]) == ["old system prompt"]


async def test_provider_suspended_continuation_is_stored() -> None:
    """H-59, H-34, H-107: the continued response is part of the result state; no empty request is stored."""
    previous = HarnessState(
        schema_version="1",
        thread_id="thr_susp",
        message_history=[
            ModelRequest(parts=[UserPromptPart("hi")]),
            ModelResponse(parts=[TextPart("partial ")], state="suspended"),
        ],
    )
    result = await Harness(make_agent(script(text("continued")))).run(None, previous_state=previous)
    assert result.output == "partial continued"
    assert result.state is not None
    history = result.state.message_history
    assert not any(isinstance(m, ModelRequest) and not m.parts for m in history)
    last = history[-1]
    assert isinstance(last, ModelResponse)
    assert "continued" in "".join(p.content for p in last.parts if isinstance(p, TextPart))
