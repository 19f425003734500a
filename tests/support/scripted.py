"""Shared helpers for harness tests: scripted models, an agent factory, history builders and comparisons.

Agents in tests are scripted `FunctionModel`s (STYLE §2 habit 11). `script(...)` replays a fixed list of
responses, one per model request, and records what every request was sent; a request past the end of the script
fails the run. `ScriptedModel(...)` is the function form (`FunctionModel(ScriptedModel(...))`): past the end of
its responses it answers with the text "END", and it also records each request's tool names.

Import with `from scripted import ...` (tests/support is on `sys.path`, see pyproject). Importing from `conftest`
breaks as soon as another test directory has a `conftest.py` of its own (`pytest tests/unit tests/integration`).
"""

from __future__ import annotations

import inspect
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

from pydantic_ai import Agent, ModelMessagesTypeAdapter
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, FunctionModel
from pydantic_ai.tools import ToolDefinition
from pydantic_ai.toolsets import ExternalToolset

from candor import BoundaryEvent, RunResultEvent
from candor.tools import UNKNOWN_OUTCOME_CONTENT, UNKNOWN_OUTCOME_METADATA_KEY

__all__ = (
    "Step",
    "ScriptExhausted",
    "text",
    "tool_call",
    "calls",
    "tool_calls",
    "script",
    "ScriptedModel",
    "external",
    "add",
    "echo",
    "make_agent",
    "canonical",
    "stable",
    "consume",
    "boundaries",
    "run_results",
    "returns",
    "is_unknown",
    "deferred_call",
    "deferred_history",
)

Step = ModelResponse | Callable[[list[ModelMessage], AgentInfo], ModelResponse | Awaitable[ModelResponse]]
"""One scripted model turn: a fixed response, or a function of what the model was sent."""


class ScriptExhausted(AssertionError):
    """The run made more model requests than the script has steps."""


def text(content: str = "done") -> ModelResponse:
    return ModelResponse(parts=[TextPart(content)])


def tool_call(name: str, args: dict[str, Any] | None = None, call_id: str = "c1") -> ToolCallPart:
    return ToolCallPart(tool_name=name, args=args or {}, tool_call_id=call_id)


def calls(*parts: ToolCallPart) -> ModelResponse:
    return ModelResponse(parts=list(parts))


def tool_calls(*calls: tuple[str, str, dict[str, Any]]) -> ModelResponse:
    """A response with one tool call per `(tool_call_id, tool_name, args)` triple."""
    return ModelResponse(parts=[ToolCallPart(name, args, tool_call_id=call_id) for call_id, name, args in calls])


class ScriptedFunctionModel(FunctionModel):
    """The `FunctionModel` `script` returns, with `.seen`."""

    seen: list[list[ModelMessage]]


def script(*steps: Step, stream: bool = False) -> ScriptedFunctionModel:
    """A `FunctionModel` that answers the i-th model request with `steps[i]`.

    The returned model has `.seen`: the list of message lists sent to it, one per request. With `stream=True`
    the model only has a `stream_function` (deltas are streamed): text responses are sent in two chunks, tool-call
    responses as `DeltaToolCall`s; a response must not mix text and tool calls.
    """
    seen: list[list[ModelMessage]] = []
    remaining = list(steps)

    async def next_response(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        seen.append(list(messages))
        if not remaining:
            raise ScriptExhausted(f"the script has only {len(steps)} steps")
        step = remaining.pop(0)
        if isinstance(step, ModelResponse):
            return step
        result = step(messages, info)
        if inspect.isawaitable(result):
            result = await result
        return result

    async def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        return await next_response(messages, info)

    async def respond_stream(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[Any]:
        response = await next_response(messages, info)
        tool_calls = [p for p in response.parts if isinstance(p, ToolCallPart)]
        if tool_calls:
            for index, part in enumerate(tool_calls):
                args = part.args if isinstance(part.args, str) else json.dumps(part.args or {})
                yield {index: DeltaToolCall(name=part.tool_name, json_args=args, tool_call_id=part.tool_call_id)}
            return
        content = "".join(p.content for p in response.parts if isinstance(p, TextPart))
        half = max(1, len(content) // 2)
        yield content[:half]
        if content[half:]:
            yield content[half:]

    model = ScriptedFunctionModel(stream_function=respond_stream) if stream else ScriptedFunctionModel(respond)
    model.seen = seen
    return model


class ScriptedModel:
    """A scripted model function for `FunctionModel(...)`: each request gets the next response.

    A response is a `ModelResponse` or a function of the messages sent. Once the responses are used up every
    request is answered with the text "END". `seen` holds what each request was sent, `tool_names` the sorted
    names of the function tools it offered, and `calls` counts the requests.
    """

    def __init__(self, *responses: ModelResponse | Callable[[list[ModelMessage]], ModelResponse]) -> None:
        self.responses = list(responses)
        self.seen: list[list[ModelMessage]] = []
        self.tool_names: list[list[str]] = []

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.seen.append(list(messages))
        self.tool_names.append(sorted(t.name for t in info.function_tools))
        if not self.responses:
            return ModelResponse(parts=[TextPart("END")])
        response = self.responses.pop(0)
        return response(messages) if callable(response) else response

    @property
    def calls(self) -> int:
        return len(self.seen)


def external(*names: str) -> ExternalToolset[Any]:
    """An external toolset with one tool per name, each taking an optional string `q`."""
    schema = {"type": "object", "properties": {"q": {"type": "string"}}}
    return ExternalToolset([ToolDefinition(name=name, parameters_json_schema=schema) for name in names])


def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


def echo(value: str) -> str:
    """Echo a value back."""
    return value


def make_agent(
    model: FunctionModel, *tools: Any, system_prompt: str | Sequence[str] = (), **kwargs: Any
) -> Agent[Any, Any]:
    """An agent on `model` with the tools `add` and `echo`, plus any `tools` given."""
    return Agent(model, tools=[add, echo, *tools], system_prompt=system_prompt, **kwargs)


def canonical(messages: Sequence[ModelMessage]) -> list[Any]:
    """Messages in their canonical JSON form (the `ModelMessagesTypeAdapter` encoding)."""
    decoded: list[Any] = json.loads(ModelMessagesTypeAdapter.dump_json(list(messages)))
    return decoded


_VOLATILE_KEYS = frozenset({"timestamp", "run_id", "conversation_id"})


def stable(value: Any) -> Any:
    """A JSON value with per-run volatile fields (timestamps, run and conversation ids) removed."""
    if isinstance(value, dict):
        return {k: stable(v) for k, v in value.items() if k not in _VOLATILE_KEYS}
    if isinstance(value, list):
        return [stable(v) for v in value]
    return value


async def consume(stream: Any) -> list[Any]:
    """Enter `stream`, collect every event, and return them."""
    events: list[Any] = []
    async with stream:
        async for event in stream:
            events.append(event)
    return events


def boundaries(events: Sequence[Any]) -> list[BoundaryEvent]:
    return [e for e in events if isinstance(e, BoundaryEvent)]


def run_results(events: Sequence[Any]) -> list[RunResultEvent]:
    return [e for e in events if isinstance(e, RunResultEvent)]


def returns(messages: Sequence[ModelMessage], tool_call_id: str) -> list[ToolReturnPart]:
    """The tool returns in `messages` for the call `tool_call_id`."""
    return [
        part
        for message in messages
        if isinstance(message, ModelRequest)
        for part in message.parts
        if isinstance(part, ToolReturnPart) and part.tool_call_id == tool_call_id
    ]


def is_unknown(part: ToolReturnPart) -> bool:
    """The return is the unknown-outcome result (§3.10) the harness writes for a call whose outcome is lost."""
    return (
        part.outcome == "interrupted"
        and part.content == UNKNOWN_OUTCOME_CONTENT
        and part.metadata == {UNKNOWN_OUTCOME_METADATA_KEY: True}
    )


def deferred_call(tool_call_id: str, tool_name: str = "tool", args: dict[str, Any] | str | None = None) -> ToolCallPart:
    """A tool call for deferred-resume tests; note the argument order (id first), unlike `tool_call`."""
    return ToolCallPart(tool_name=tool_name, args=args if args is not None else {"n": 1}, tool_call_id=tool_call_id)


def deferred_history(*calls: ToolCallPart, answered: tuple[str, ...] = ()) -> list[ModelMessage]:
    """A prompt, one response with `calls`, and (when given) a request returning the `answered` ids.

    Each return names the tool of the call it answers and has the content "done".
    """
    messages: list[ModelMessage] = [ModelRequest(parts=[UserPromptPart("go")]), ModelResponse(parts=list(calls))]
    if answered:
        by_id = {c.tool_call_id: c for c in calls}
        messages.append(
            ModelRequest(
                parts=[ToolReturnPart(tool_name=by_id[i].tool_name, content="done", tool_call_id=i) for i in answered]
            )
        )
    return messages
