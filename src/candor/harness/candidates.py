"""Safe state candidates for failed and cancelled runs (H-103), as pure functions over a message history."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Sequence

from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    ModelResponsePart,
    NativeToolCallPart,
    NativeToolReturnPart,
    TextPart,
    ThinkingPart,
    ToolCallPart,
)

from .deferred import DeferredToolResume
from .errors import RunError
from .history import unanswered_calls
from .recovery_tools import unknown_outcome_result

__all__ = ("normalize_candidate", "is_complete_call", "pending_answer_ids")


def is_complete_call(part: ToolCallPart) -> bool:
    """A call whose arguments parse; partial streamed arguments do not (H-103)."""
    try:
        part.args_as_dict(raise_if_invalid=True)
    except (ValueError, AssertionError):
        return False
    return True


def _keep_part(part: ModelResponsePart) -> bool:
    if isinstance(part, TextPart):
        return bool(part.content)
    if isinstance(part, ThinkingPart):
        return bool(part.content) or part.signature is not None
    if isinstance(part, ToolCallPart):
        return is_complete_call(part)
    return True


def _balanced_native_groups(parts: list[ModelResponsePart]) -> list[ModelResponsePart]:
    """Drop provider-native calls without their return and returns without their call (H-103)."""
    call_ids = {p.tool_call_id for p in parts if isinstance(p, NativeToolCallPart)}
    return_ids = {p.tool_call_id for p in parts if isinstance(p, NativeToolReturnPart)}
    paired = call_ids & return_ids
    return [
        p for p in parts if not isinstance(p, (NativeToolCallPart, NativeToolReturnPart)) or p.tool_call_id in paired
    ]


def _normalized_response(response: ModelResponse) -> ModelResponse | None:
    parts = _balanced_native_groups([p for p in response.parts if _keep_part(p)])
    if not parts:
        return None
    if parts == list(response.parts) and response.state == "complete":
        return response
    return dataclasses.replace(response, parts=parts, state="complete")


def normalize_candidate(
    messages: Sequence[ModelMessage],
    *,
    stable_prefix: int,
    pending_answer_ids: Collection[str] = (),
) -> list[ModelMessage]:
    """The history of a failed or cancelled run, made safe to continue from.

    Messages before `stable_prefix` were exported at a boundary and are kept as they are (append-only);
    later ones are cleaned: unfinished parts dropped, empty requests dropped. Finally every unanswered call of
    the last response is closed with an unknown-outcome result, except calls with accepted answers still
    pending (`pending_answer_ids`), which the host re-offers.
    """
    result: list[ModelMessage] = list(messages[:stable_prefix])
    for message in messages[stable_prefix:]:
        if isinstance(message, ModelResponse):
            cleaned = _normalized_response(message)
            if cleaned is not None:
                result.append(cleaned)
        elif isinstance(message, ModelRequest):
            if message.parts:
                complete = message if message.state == "complete" else dataclasses.replace(message, state="complete")
                result.append(complete)
        else:
            result.append(message)
    open_calls = [c for c in unanswered_calls(result) if c.tool_call_id not in set(pending_answer_ids)]
    if open_calls:
        result.append(ModelRequest(parts=[unknown_outcome_result(call) for call in open_calls]))
    return result


def pending_answer_ids(batch: DeferredToolResume | None, messages: Sequence[ModelMessage]) -> frozenset[str]:
    """The ids of the calls in `messages` that `batch` still holds accepted answers for (kept open, H-103)."""
    if batch is None:
        return frozenset()
    try:
        remaining = batch.remaining(messages)
    except RunError:
        return frozenset()
    if remaining is None:
        return frozenset()
    requests = remaining.requests
    return frozenset(c.tool_call_id for c in (*requests.calls, *requests.approvals))
