"""Detached message copies (`candor.harness._detach`): what `copy.deepcopy` gives, without its generic cost (H-6,
H-11), and a run's history stays immune to later changes of the objects pydantic-ai and tools hold."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

from pydantic_ai import Agent, RunContext
from pydantic_ai.messages import (
    BinaryContent,
    ImageUrl,
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ThinkingPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from candor import BoundaryEvent, Harness, HarnessState
from candor.harness._detach import detached, detached_all

EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
_SHARED_OK = (str, int, float, bool, type(None), bytes, datetime)


def rich_history() -> list[ModelMessage]:
    shared_args = {"nested": {"list": [1, 2.5, None], "flag": True}}
    return [
        ModelRequest(
            parts=[
                UserPromptPart(
                    ["look", ImageUrl("https://example.com/a.png"), BinaryContent(b"\x89PNG", media_type="image/png")],
                    timestamp=EPOCH,
                )
            ]
        ),
        ModelResponse(
            parts=[
                ThinkingPart("hmm", signature="sig"),
                TextPart("ok"),
                ToolCallPart("t", shared_args, "c1"),
                ToolCallPart("t", shared_args, "c2"),
            ],
            timestamp=EPOCH,
            provider_details={"z": [1], "a": {"b": 2}},
        ),
        ModelRequest(
            parts=[
                ToolReturnPart("t", {"k": [True]}, "c1", timestamp=EPOCH),
                ToolReturnPart("t", ["again", {"why": None}], "c2", timestamp=EPOCH),
            ]
        ),
    ]


def _mutable_ids(value: Any, seen: dict[int, Any] | None = None) -> dict[int, Any]:
    """Every object reachable from `value` that a caller could change (the leaves of `_SHARED_OK` are not)."""
    seen = {} if seen is None else seen
    if isinstance(value, _SHARED_OK) or id(value) in seen:
        return seen
    seen[id(value)] = value
    children: Any = ()
    if isinstance(value, dict):
        children = [*value.keys(), *value.values()]
    elif isinstance(value, (list, tuple)):
        children = value
    elif hasattr(value, "__dict__"):
        children = list(vars(value).values())
    for child in children:
        _mutable_ids(child, seen)
    return seen


def test_detached_equals_deepcopy_and_shares_nothing_mutable() -> None:
    """H-6: a detached history equals its original (and `copy.deepcopy`'s result) and shares no list, dict or
    message object with it, so no change to the original reaches the copy."""
    original = rich_history()
    copied = detached_all(original)
    assert copied == original == copy.deepcopy(original)
    assert not set(_mutable_ids(copied)) & set(_mutable_ids(original))
    assert detached(tuple(original)) == tuple(original)


def test_detached_keeps_aliasing_inside_one_copy() -> None:
    """Like `copy.deepcopy`: an object reached twice is copied once, so the copy has the original's shape."""
    response = rich_history()[1]
    copied = detached(response)
    first, second, original = copied.parts[2], copied.parts[3], response.parts[2]
    assert isinstance(first, ToolCallPart) and isinstance(second, ToolCallPart) and isinstance(original, ToolCallPart)
    assert first.args is second.args and first.args is not original.args


def test_objects_with_their_own_copy_rules_go_through_deepcopy() -> None:
    """Anything but plain dataclasses and JSON containers is copied by `copy.deepcopy` (its own rules apply)."""

    class Counted:
        copies = 0

        def __deepcopy__(self, memo: dict[int, Any]) -> Counted:
            Counted.copies += 1
            return Counted()

    value = {"inner": Counted()}
    copied = detached(value)
    assert Counted.copies == 1 and copied["inner"] is not value["inner"]


async def test_a_tool_changing_the_run_messages_does_not_change_the_committed_history() -> None:
    """H-6, H-11: messages enter the run's history as detached copies at a boundary; a tool that later changes the
    objects pydantic-ai hands it (`ctx.messages`) changes neither the state exported at that boundary nor the
    final history."""

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if len(messages) == 1:
            return ModelResponse(parts=[ToolCallPart("scribble", {"note": "original"}, "c1")])
        return ModelResponse(parts=[TextPart("done")])

    agent: Agent[None, str] = Agent(FunctionModel(model))

    @agent.tool
    def scribble(ctx: RunContext[None], note: str) -> str:
        for message in ctx.messages:
            for part in message.parts:
                if isinstance(part, ToolCallPart):
                    part.args = {"note": "scribbled"}
                if isinstance(part, UserPromptPart):
                    part.content = "scribbled"
        return "ok"

    exported: list[HarnessState] = []
    stream = Harness(agent).stream("hello")
    async with stream:
        async for event in stream:
            if isinstance(event, BoundaryEvent) and event.kind == "tool":
                exported.append(await stream.export_state())
    assert stream.outcome is not None and stream.outcome.status == "completed"
    for state in [*exported, stream.outcome.state]:
        assert state is not None
        history = state.message_history
        prompt, call = history[0].parts[0], history[1].parts[0]
        assert isinstance(prompt, UserPromptPart) and prompt.content == "hello"
        assert isinstance(call, ToolCallPart) and call.args == {"note": "original"}
