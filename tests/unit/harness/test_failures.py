"""Failures and cleanup of a run (spec §3.11, §4.H: H-101 to H-103), at run level and for the candidate normalizer."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic_ai import Agent, DeferredToolRequests, DeferredToolResults, Tool
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    ModelResponseState,
    NativeToolCallPart,
    NativeToolReturnPart,
    TextPart,
    ThinkingPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, DeltaThinkingPart, DeltaToolCall, FunctionModel
from pydantic_ai.toolsets import FunctionToolset

from candor import DeferredToolResume, Harness, HarnessState, RunBindings, RunResultEvent
from candor.errors import RunCleanupError
from candor.harness.candidates import normalize_candidate
from candor.tools import unknown_outcome_result

from scripted import ScriptedModel, is_unknown, returns, text, tool_calls

EPOCH = datetime(2000, 1, 1, tzinfo=UTC)

# ----------------------------------------------------------------------------------------------- helpers


class FailingClose(FunctionToolset[Any]):
    """A run toolset whose teardown (`__aexit__`) fails, like a client that cannot close its connection."""

    async def __aexit__(self, *args: Any) -> bool | None:
        await super().__aexit__(*args)
        raise OSError("connection reset while closing")


def plain_agent(script: ScriptedModel) -> Agent[None, str]:
    agent: Agent[None, str] = Agent(FunctionModel(script))

    @agent.tool_plain
    def plain() -> str:
        return "p"

    return agent


# ----------------------------------------------------------------------------------------------- H-101, H-102


async def test_teardown_failure_raises_run_cleanup_error() -> None:
    """H-101: the consumer leaves at the first boundary and the run's teardown fails: RunCleanupError with
    code run_cleanup_failed, retry_hint new_run, details {"cause_count": n}, a validated candidate as .outcome,
    no RunResultEvent delivered and stream.result None."""
    agent = plain_agent(ScriptedModel(tool_calls(("c1", "plain", {})), text()))
    stream = Harness(agent).stream("hi", bindings=RunBindings(toolsets=[FailingClose()]))
    events: list[Any] = []

    with pytest.raises(RunCleanupError) as raised:
        async with stream:
            async for event in stream:
                events.append(event)
                break

    error = raised.value
    assert error.code == "run_cleanup_failed"
    assert error.retry_hint == "new_run"
    assert error.details == {"cause_count": len(error.causes)}
    assert len(error.causes) >= 1
    assert not any(isinstance(e, RunResultEvent) for e in events)
    assert stream.result is None
    assert error.outcome is not None
    assert error.outcome is stream.outcome
    assert error.outcome.state is not None
    assert error.outcome.status in ("cancelled", "failed")
    assert error.outcome.state.thread_id == stream.thread_id
    assert await stream.export_state() == error.outcome.state  # H-99


async def test_teardown_failure_reports_the_underlying_cause() -> None:
    """H-101, §3.11: RunCleanupError.causes are the underlying teardown exceptions; the consumer left early, so the
    candidate is the cancelled one."""
    agent = plain_agent(ScriptedModel(tool_calls(("c1", "plain", {})), text()))
    stream = Harness(agent).stream("hi", bindings=RunBindings(toolsets=[FailingClose()]))

    with pytest.raises(RunCleanupError) as raised:
        async with stream:
            async for _ in stream:
                break

    assert [type(e) for e in raised.value.causes] == [OSError]
    assert raised.value.outcome is not None
    assert raised.value.outcome.status == "cancelled"


async def test_teardown_failure_after_a_validated_candidate_raises_with_that_candidate() -> None:
    """H-101, H-102: the run completes, then its teardown fails: RunCleanupError carries the completed candidate; no
    RunResultEvent is delivered and stream.result stays None."""
    agent = plain_agent(ScriptedModel(tool_calls(("c1", "plain", {})), text("finished")))
    stream = Harness(agent).stream("hi", bindings=RunBindings(toolsets=[FailingClose()]))
    results: list[RunResultEvent] = []

    with pytest.raises(RunCleanupError) as raised:
        async with stream:
            async for event in stream:
                if isinstance(event, RunResultEvent):
                    results.append(event)

    assert results == []
    assert stream.result is None
    candidate = raised.value.outcome
    assert candidate is not None and candidate.status == "completed" and candidate.output == "finished"
    assert raised.value.details == {"cause_count": 1}


async def test_run_raises_cleanup_error_like_stream() -> None:
    """H-101, H-102, H-106: run() behaves like consuming stream(): the teardown failure is raised, not returned."""
    agent = plain_agent(ScriptedModel(tool_calls(("c1", "plain", {})), text("finished")))

    with pytest.raises(RunCleanupError) as raised:
        await Harness(agent).run("hi", bindings=RunBindings(toolsets=[FailingClose()]))

    assert raised.value.outcome is not None
    assert raised.value.outcome.status == "completed"


# ----------------------------------------------------------------------------------------------- H-103 at run level


async def test_failed_run_closes_unanswered_calls_with_unknown_outcomes() -> None:
    """H-103, H-31: a tool raising ends the run failed with a state whose unanswered calls are closed."""
    script = ScriptedModel(tool_calls(("c1", "boom", {}), ("c2", "plain", {})), text())
    agent = plain_agent(script)

    @agent.tool_plain
    def boom() -> str:
        raise RuntimeError("database password is hunter2")

    result = await Harness(agent).run("hi")

    assert result.status == "failed"
    assert result.failure is not None
    assert result.failure.code == "agent_run_failed"
    assert result.failure.details == {"error_type": "RuntimeError"}
    assert result.state is not None
    history = result.state.message_history
    [c1] = returns(history, "c1")
    assert is_unknown(c1)
    # The sibling runs in a worker thread: its return is either recorded or closed as unknown, never missing.
    [c2] = returns(history, "c2")
    assert is_unknown(c2) or (c2.outcome, c2.content) == ("success", "p")
    assert "hunter2" not in result.state.model_dump_json()
    assert result.all_messages() == list(history)
    # The closed state continues normally (nothing is left open).
    again = await Harness(plain_agent(ScriptedModel(text("recovered")))).run("go on", previous_state=result.state)
    assert again.status == "completed" and again.output == "recovered"


async def test_failed_fresh_resume_keeps_pending_batch_calls_open() -> None:
    """H-103, H-96: a failed run with accepted batch input pending does not close those calls; the re-offered batch
    then finishes them (the approved call is not replayed, H-94)."""
    c1 = ToolCallPart("risky", {}, tool_call_id="c1")
    state = HarnessState(
        schema_version="1",
        thread_id="thr_fail",
        message_history=[ModelRequest(parts=[UserPromptPart("hi")]), ModelResponse(parts=[c1])],
    )
    attempts: list[int] = []

    def risky() -> str:
        attempts.append(1)
        raise RuntimeError("boom")

    agent: Agent[None, str] = Agent(
        FunctionModel(ScriptedModel(text("after"))), tools=[Tool(risky, requires_approval=True)]
    )
    batch = DeferredToolResume(DeferredToolRequests(approvals=[c1]), DeferredToolResults(approvals={"c1": True}))
    stream = Harness(agent).stream(previous_state=state, deferred_resume=batch)
    async with stream:
        async for _ in stream:
            pass

    failed = stream.outcome
    assert failed is not None
    assert failed.status == "failed" and failed.state is not None
    assert returns(failed.state.message_history, "c1") == []
    reoffer = stream.pending_deferred_input
    assert reoffer is not None and reoffer.recovery

    result = await Harness(agent).run(previous_state=failed.state, deferred_resume=reoffer)
    assert result.status == "completed"
    assert attempts == [1]
    assert result.state is not None
    [part] = returns(result.state.message_history, "c1")
    assert is_unknown(part)


def _streaming_agent(gate: asyncio.Event) -> Agent[None, str]:
    async def stream_function(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[Any]:
        yield "partial answer "
        yield {1: DeltaThinkingPart(content="weighing options")}
        yield {2: DeltaToolCall(name="plain", json_args='{"city": "Par', tool_call_id="t1")}
        gate.set()
        await asyncio.Event().wait()  # the response never finishes

    agent: Agent[None, str] = Agent(FunctionModel(stream_function=stream_function))

    @agent.tool_plain
    def plain(city: str) -> str:
        return city

    return agent


async def _cancel_mid_response() -> Any:
    gate = asyncio.Event()
    stream = Harness(_streaming_agent(gate)).stream("hi")

    async def cancel_when_streaming() -> None:
        await gate.wait()
        await asyncio.sleep(0.01)
        stream.cancel()

    canceller = asyncio.ensure_future(cancel_when_streaming())
    async with stream:
        async for _ in stream:
            pass
    await canceller
    return stream.outcome


async def test_cancelled_mid_response_keeps_complete_text() -> None:
    """H-103, H-105: a run cancelled while a response streams ends cancelled with a state keeping its text."""
    outcome = await _cancel_mid_response()

    assert outcome.status == "cancelled"
    assert outcome.state is not None
    responses = [m for m in outcome.state.message_history if isinstance(m, ModelResponse)]
    assert responses and responses[-1].state == "complete"
    assert [p.content for p in responses[-1].parts if isinstance(p, TextPart)] == ["partial answer "]


async def test_cancelled_mid_response_drops_partial_tool_arguments() -> None:
    """H-103: the partially streamed tool call is dropped, so it is neither stored nor closed."""
    outcome = await _cancel_mid_response()

    history = outcome.state.message_history
    assert not any(isinstance(p, ToolCallPart) for m in history if isinstance(m, ModelResponse) for p in m.parts)
    assert returns(history, "t1") == []


# ----------------------------------------------------------------------------------------------- H-103 unit table


def call(call_id: str, args: Any = None, name: str = "t") -> ToolCallPart:
    return ToolCallPart(name, {"a": 1} if args is None else args, tool_call_id=call_id)


PROMPT = ModelRequest(parts=[UserPromptPart("hi", timestamp=EPOCH)], timestamp=EPOCH)


def response(*parts: Any, state: ModelResponseState = "complete") -> ModelResponse:
    return ModelResponse(parts=list(parts), timestamp=EPOCH, state=state)


@pytest.mark.parametrize(
    ("parts", "kept"),
    [
        pytest.param([TextPart("hello")], [TextPart("hello")], id="text-kept"),
        pytest.param([TextPart(""), TextPart("x")], [TextPart("x")], id="empty-text-dropped"),
        pytest.param([ThinkingPart(content=""), TextPart("x")], [TextPart("x")], id="unfinished-thinking-dropped"),
        pytest.param([ThinkingPart(content="why")], [ThinkingPart(content="why")], id="thinking-with-content"),
        pytest.param(
            [ThinkingPart(content="", signature="sig")],
            [ThinkingPart(content="", signature="sig")],
            id="thinking-with-signature",
        ),
        pytest.param(
            [TextPart("before"), NativeToolCallPart("web_search", {"q": 1}, tool_call_id="n1"), TextPart("after")],
            [TextPart("before"), TextPart("after")],
            id="unbalanced-native-call",
        ),
        pytest.param(
            [NativeToolReturnPart("web_search", "r", tool_call_id="n2", timestamp=EPOCH), TextPart("after")],
            [TextPart("after")],
            id="unbalanced-native-return",
        ),
        pytest.param(
            [
                NativeToolCallPart("web_search", {"q": 1}, tool_call_id="n3"),
                NativeToolReturnPart("web_search", "r", tool_call_id="n3", timestamp=EPOCH),
            ],
            [
                NativeToolCallPart("web_search", {"q": 1}, tool_call_id="n3"),
                NativeToolReturnPart("web_search", "r", tool_call_id="n3", timestamp=EPOCH),
            ],
            id="balanced-native-group",
        ),
    ],
)
def test_normalize_candidate_cleans_the_interrupted_response(parts: list[Any], kept: list[Any]) -> None:
    """H-103: keep non-empty text, finished thinking and balanced native groups; drop the rest."""
    [_, cleaned] = normalize_candidate([PROMPT, response(*parts, state="interrupted")], stable_prefix=1)

    assert isinstance(cleaned, ModelResponse)
    assert cleaned.parts == kept
    assert cleaned.state == "complete"


def test_normalize_candidate_drops_an_empty_response() -> None:
    """H-103: a response with nothing worth keeping disappears; nothing is left to close."""
    assert normalize_candidate([PROMPT, response(TextPart(""), ThinkingPart(""))], stable_prefix=1) == [PROMPT]


@pytest.mark.parametrize(
    "args",
    [
        pytest.param('{"a": ', id="truncated-object"),
        pytest.param('{"city": "Par', id="truncated-string"),
    ],
)
def test_normalize_candidate_drops_partial_tool_arguments(args: str) -> None:
    """H-103: a tool call whose streamed arguments do not parse is dropped, and so is not closed."""
    result = normalize_candidate([PROMPT, response(TextPart("hi"), call("t1", args))], stable_prefix=1)

    assert result[:1] == [PROMPT]
    assert [m.parts for m in result[1:]] == [[TextPart("hi")]]


def closed(message: ModelMessage) -> list[tuple[Any, ...]]:
    """A closing request's returns, without their timestamps."""
    assert isinstance(message, ModelRequest)
    return [
        (p.tool_name, p.tool_call_id, p.content, p.outcome, p.metadata)
        for p in message.parts
        if isinstance(p, ToolReturnPart)
    ] + [("other", type(p).__name__) for p in message.parts if not isinstance(p, ToolReturnPart)]


def unknown(c: ToolCallPart) -> tuple[Any, ...]:
    part = unknown_outcome_result(c)
    return (part.tool_name, part.tool_call_id, part.content, part.outcome, part.metadata)


def test_normalize_candidate_keeps_complete_calls_and_closes_them() -> None:
    """H-103, H-43, H-44: complete calls stay and every unanswered one is closed, in call order, in one request."""
    calls = [call("a"), call("b", '{"x": 2}'), call("c")]
    answered = ModelRequest(parts=[ToolReturnPart("t", "ok", tool_call_id="b")])

    result = normalize_candidate([PROMPT, response(*calls), answered], stable_prefix=1)

    assert result[:3] == [PROMPT, response(*calls), answered]
    [closing] = result[3:]
    assert closed(closing) == [unknown(calls[0]), unknown(calls[2])]


def test_normalize_candidate_leaves_pending_batch_calls_open() -> None:
    """H-103: calls with accepted batch input still pending are not closed."""
    calls = [call("a"), call("b"), call("c")]

    result = normalize_candidate([PROMPT, response(*calls)], stable_prefix=1, pending_answer_ids={"a", "c"})

    assert closed(result[-1]) == [unknown(calls[1])]
    assert normalize_candidate([PROMPT, response(*calls)], stable_prefix=1, pending_answer_ids={"a", "b", "c"}) == [
        PROMPT,
        response(*calls),
    ]


def test_normalize_candidate_never_changes_the_stable_prefix() -> None:
    """H-103, H-39: messages exported at a boundary are kept as they are; only what follows is cleaned."""
    exported = response(TextPart(""), ThinkingPart(""), state="interrupted")
    history: list[ModelMessage] = [
        PROMPT,
        exported,
        ModelRequest(parts=[UserPromptPart("more", timestamp=EPOCH)], timestamp=EPOCH),
    ]

    result = normalize_candidate(history, stable_prefix=3)

    assert result == history
    assert result[1] is exported
