"""Output-tool calls in a restored last response, next to open function calls (spec §2, H-41, H-44 to H-46, H-55).

Output-tool calls are never recovered: pydantic-ai processes them natively, together with the replays, under the
agent's `end_strategy` — as it would for a fresh response holding both. The harness-made results (unknown outcomes,
closed suspensions) join pydantic-ai's returns in one request, in call order.
"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel
from pydantic_ai import Agent, ModelRetry, RunContext, Tool
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, ToolCallPart, ToolReturnPart, UserPromptPart
from pydantic_ai.models.function import FunctionModel
from pydantic_ai.tools import ToolDefinition

from candor import Harness, HarnessState
from candor.harness.recovery import calls_in_order, unanswered_output_calls
from candor.tools import recovery_retryable

from scripted import ScriptedModel, is_unknown, returns, text

THREAD = "thr_restoredoutput"
FINAL_RESULT_PROCESSED = "Final result processed."  # pydantic-ai's return for the winning output-tool call
NOT_EXECUTED = "Tool not executed - a final result was already processed."  # pydantic-ai's stub for a skipped call


class Answer(BaseModel):
    value: int


def call(name: str, call_id: str, **args: Any) -> ToolCallPart:
    return ToolCallPart(name, args, tool_call_id=call_id)


def final(call_id: str, value: Any) -> ToolCallPart:
    return ToolCallPart("final_result", {"value": value}, tool_call_id=call_id)


def restored(*parts: ToolCallPart, answered: tuple[ToolReturnPart, ...] = ()) -> list[ModelMessage]:
    history: list[ModelMessage] = [ModelRequest(parts=[UserPromptPart("go")]), ModelResponse(parts=list(parts))]
    if answered:
        history.append(ModelRequest(parts=list(answered)))
    return history


def state(*parts: ToolCallPart) -> HarnessState:
    return HarnessState(schema_version="1", thread_id=THREAD, message_history=restored(*parts))


class Ran:
    """A retry-safe tool `a` that records the call ids it ran for."""

    def __init__(self) -> None:
        self.ids: list[str | None] = []

    def tool(self, **kwargs: Any) -> Tool[Any]:
        async def a(ctx: RunContext[Any], x: int) -> str:
            self.ids.append(ctx.tool_call_id)
            return f"a:{x}"

        return recovery_retryable(Tool(a, **kwargs))


def answer_agent(model: ScriptedModel, *tools: Tool[Any], **kwargs: Any) -> Agent[None, Answer]:
    return Agent(FunctionModel(model), tools=list(tools), output_type=Answer, **kwargs)


def closing_request(history: tuple[ModelMessage, ...] | list[ModelMessage]) -> ModelRequest:
    last = history[-1]
    assert isinstance(last, ModelRequest)
    return last


def returned(request: ModelRequest) -> list[tuple[str, Any]]:
    return [(p.tool_call_id, p.content) for p in request.parts if isinstance(p, ToolReturnPart)]


# -- the pure reads -------------------------------------------------------------------------------------------


def test_unanswered_output_calls_in_call_order() -> None:
    """§2, H-41: the open output-tool calls of the last response, in call order, however they are recognised."""
    tagged = ToolCallPart("answer", {}, tool_call_id="o3", tool_kind="output")
    history = restored(final("o1", 1), call("a", "c1"), ToolCallPart("by_surface", {}, tool_call_id="o2"), tagged)
    surface = {"by_surface": ToolDefinition(name="by_surface", kind="output"), "a": ToolDefinition(name="a")}

    found = unanswered_output_calls(history, surface, frozenset({"final_result"}))

    assert [c.tool_call_id for c in found] == ["o1", "o2", "o3"]


def test_unanswered_output_calls_leave_answered_and_earlier_calls_out() -> None:
    """§2, H-41: an answered output call is closed; output calls of earlier responses are never looked at."""
    earlier = restored(final("old", 0))
    history = [
        *earlier,
        ModelRequest(parts=[ToolReturnPart("final_result", "x", tool_call_id="old")]),
        ModelResponse(parts=[final("o1", 1), final("o2", 2), call("a", "c1")]),
        ModelRequest(parts=[ToolReturnPart("final_result", "x", tool_call_id="o1")]),
    ]

    found = unanswered_output_calls(history, {}, frozenset({"final_result"}))

    assert [c.tool_call_id for c in found] == ["o2"]
    assert unanswered_output_calls([], {}, frozenset({"final_result"})) == []


def test_calls_in_order_follows_the_response() -> None:
    """H-44: calls gathered from different decisions are put back in the order the response made them."""
    c1, o1, c2 = call("a", "c1"), final("o1", 1), call("a", "c2")
    history = restored(c1, o1, c2)

    assert [c.tool_call_id for c in calls_in_order(history, [c2, o1, c1])] == ["c1", "o1", "c2"]
    assert calls_in_order([], [c1]) == [c1]


# -- end to end -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("parts", "order"),
    [
        ((call("a", "c1", x=1), final("o1", 1)), ["c1", "o1"]),
        ((final("o1", 1), call("a", "c1", x=1)), ["o1", "c1"]),
    ],
)
async def test_graceful_runs_the_replay_and_ends_with_the_restored_output(
    parts: tuple[ToolCallPart, ...], order: list[str]
) -> None:
    """§2, H-46, H-44: under the default `graceful` strategy the retry-safe call runs and the output-tool call gives
    the run its output; both returns are in one request, in call order; no model request is made."""
    ran = Ran()
    model = ScriptedModel()
    result = await Harness(answer_agent(model, ran.tool())).run(previous_state=state(*parts))

    assert result.status == "completed" and result.output == Answer(value=1)
    assert model.calls == 0
    assert ran.ids == ["c1"]
    assert result.state is not None
    history = result.state.message_history
    assert len(history) == 3
    assert [call_id for call_id, _ in returned(closing_request(history))] == order
    assert dict(returned(closing_request(history))) == {"c1": "a:1", "o1": FINAL_RESULT_PROCESSED}


async def test_early_strategy_skips_the_replay_as_pydantic_ai_does() -> None:
    """§2, H-46: under `end_strategy="early"` the output wins and the replayable call is not executed."""
    ran = Ran()
    model = ScriptedModel()
    agent = answer_agent(model, ran.tool(), end_strategy="early")
    result = await Harness(agent).run(previous_state=state(call("a", "c1", x=1), final("o1", 1)))

    assert result.status == "completed" and result.output == Answer(value=1)
    assert ran.ids == [] and model.calls == 0
    assert result.state is not None
    assert returned(closing_request(result.state.message_history)) == [
        ("c1", NOT_EXECUTED),
        ("o1", FINAL_RESULT_PROCESSED),
    ]


async def test_unknown_outcome_and_output_share_the_closing_request() -> None:
    """§2, H-45, H-44: with `never` the function call gets its unknown outcome, in call order, in the request that
    also holds the output call's return."""
    ran = Ran()
    model = ScriptedModel()
    result = await Harness(answer_agent(model, ran.tool())).run(
        previous_state=state(call("a", "c1", x=1), final("o1", 1)), tool_recovery="never"
    )

    assert result.status == "completed" and result.output == Answer(value=1)
    assert ran.ids == [] and model.calls == 0
    assert result.state is not None
    request = closing_request(result.state.message_history)
    assert [call_id for call_id, _ in returned(request)] == ["c1", "o1"]
    [unknown] = returns(result.state.message_history, "c1")
    assert is_unknown(unknown)


async def test_invalid_restored_output_asks_the_model_again() -> None:
    """§2, H-44: an output call whose arguments do not validate is retried as pydantic-ai does; its retry joins the
    replay's return in the first model request, in call order."""
    ran = Ran()
    model = ScriptedModel(ModelResponse(parts=[final("o2", 2)]))
    result = await Harness(answer_agent(model, ran.tool())).run(
        previous_state=state(call("a", "c1", x=1), final("o1", "not a number"))
    )

    assert result.status == "completed" and result.output == Answer(value=2)
    assert ran.ids == ["c1"] and model.calls == 1
    first_request = model.seen[0][-1]
    assert [getattr(p, "tool_call_id", None) for p in first_request.parts] == ["c1", "o1"]
    assert getattr(first_request.parts[1], "outcome", None) == "retried"


async def test_replay_retry_wins_over_the_restored_output() -> None:
    """§2, H-46: a replay asking for a retry suppresses the restored output, as pydantic-ai's retry-wins rule does."""
    attempts: list[str | None] = []

    async def flaky(ctx: RunContext[Any]) -> str:
        attempts.append(ctx.tool_call_id)
        if len(attempts) == 1:
            raise ModelRetry("try again")
        return "ok"

    model = ScriptedModel(ModelResponse(parts=[final("o2", 2)]))
    result = await Harness(answer_agent(model, recovery_retryable(Tool(flaky)))).run(
        previous_state=state(call("flaky", "c1"), final("o1", 1))
    )

    assert result.status == "completed" and result.output == Answer(value=2)
    assert attempts == ["c1"] and model.calls == 1
    first_request = model.seen[0][-1]
    assert [getattr(p, "tool_call_id", None) for p in first_request.parts] == ["c1", "o1"]
    assert [getattr(p, "outcome", None) for p in first_request.parts] == ["retried", "success"]


async def test_restored_output_wins_over_a_fresh_approval_request() -> None:
    """§2, H-55: the approval recovery would ask for again is not asked: the output ends the run, and the call is
    closed as pydantic-ai closes a deferrable call next to a final result."""
    ran = Ran()
    model = ScriptedModel()
    result = await Harness(answer_agent(model, ran.tool(requires_approval=True))).run(
        previous_state=state(call("a", "c1", x=1), final("o1", 1))
    )

    assert result.status == "completed" and result.output == Answer(value=1)
    assert ran.ids == [] and model.calls == 0
    assert result.state is not None
    assert returned(closing_request(result.state.message_history)) == [
        ("c1", NOT_EXECUTED),
        ("o1", FINAL_RESULT_PROCESSED),
    ]


async def test_restored_output_next_to_a_partly_answered_response() -> None:
    """§2, H-41, H-42: returns recorded earlier stay as they are; the open call and the output are closed after."""
    ran = Ran()
    model = ScriptedModel(text("unused"))
    recorded = ToolReturnPart("a", "a:0", tool_call_id="c0")
    history = restored(call("a", "c0", x=0), call("a", "c1", x=1), final("o1", 1), answered=(recorded,))
    previous = HarnessState(schema_version="1", thread_id=THREAD, message_history=history)

    result = await Harness(answer_agent(model, ran.tool())).run(previous_state=previous)

    assert result.status == "completed" and result.output == Answer(value=1)
    assert ran.ids == ["c1"] and model.calls == 0
    assert result.state is not None
    assert [len(returns(result.state.message_history, i)) for i in ("c0", "c1", "o1")] == [1, 1, 1]
    assert result.state is not None
    assert returns(result.state.message_history, "c0")[0].content == "a:0"
