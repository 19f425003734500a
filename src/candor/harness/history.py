"""Reads of a message history (pure): the last response, its tool calls, and which of them are unanswered.

An unanswered call (spec §2) is a tool call of the *last* `ModelResponse` for whose id no later `ModelRequest`
holds a `ToolReturnPart` (any outcome) or a legacy `RetryPromptPart`. Output-tool calls never count.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    RetryPromptPart,
    ToolCallPart,
    ToolReturnPart,
)

__all__ = (
    "last_response_index",
    "last_response",
    "tool_calls",
    "answered_call_ids",
    "unanswered_calls",
    "is_answered",
)


def last_response_index(messages: Sequence[ModelMessage]) -> int | None:
    """Index of the last `ModelResponse`, or `None` when the history has none."""
    for index in range(len(messages) - 1, -1, -1):
        if isinstance(messages[index], ModelResponse):
            return index
    return None


def last_response(messages: Sequence[ModelMessage]) -> ModelResponse | None:
    index = last_response_index(messages)
    return None if index is None else messages[index]  # type: ignore[return-value]


def tool_calls(response: ModelResponse, *, output_tool_names: frozenset[str] = frozenset()) -> list[ToolCallPart]:
    """The function-tool calls of a response, in order; output-tool calls are left out."""
    return [
        part
        for part in response.parts
        if isinstance(part, ToolCallPart) and part.tool_kind != "output" and part.tool_name not in output_tool_names
    ]


def answered_call_ids(messages: Sequence[ModelMessage], after: int) -> set[str]:
    """Ids answered by a return (or legacy retry prompt) in any request after index `after`."""
    answered: set[str] = set()
    for message in messages[after + 1 :]:
        if isinstance(message, ModelRequest):
            for part in message.parts:
                if isinstance(part, (ToolReturnPart, RetryPromptPart)) and part.tool_call_id:
                    answered.add(part.tool_call_id)
    return answered


def unanswered_calls(
    messages: Sequence[ModelMessage], *, output_tool_names: frozenset[str] = frozenset()
) -> list[ToolCallPart]:
    """The unanswered calls of the last response, in call order (H-41: earlier responses are never looked at)."""
    index = last_response_index(messages)
    if index is None:
        return []
    answered = answered_call_ids(messages, index)
    response: ModelResponse = messages[index]  # type: ignore[assignment]
    calls = tool_calls(response, output_tool_names=output_tool_names)
    return [call for call in calls if call.tool_call_id not in answered]


def is_answered(messages: Sequence[ModelMessage], tool_call_id: str) -> bool:
    index = last_response_index(messages)
    return index is not None and tool_call_id in answered_call_ids(messages, index)
