"""Retry-safe declarations and the unknown-outcome result (spec §3.10, H-43, H-50 to H-53)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, overload

from pydantic_ai import Tool
from pydantic_ai.messages import ToolCallPart, ToolReturnPart
from pydantic_ai.tools import ToolDefinition

RECOVERY_RETRY_SAFE_METADATA_KEY = "candor.recovery_retry_safe"
UNKNOWN_OUTCOME_METADATA_KEY = "candor.unknown_outcome"
UNKNOWN_OUTCOME_CONTENT = (
    "No result was recorded for this tool call because its execution was interrupted. "
    "The operation may have partly or fully taken effect. Check the current state before repeating it."
)

__all__ = (
    "RECOVERY_RETRY_SAFE_METADATA_KEY",
    "UNKNOWN_OUTCOME_METADATA_KEY",
    "UNKNOWN_OUTCOME_CONTENT",
    "recovery_retryable",
    "unknown_outcome_result",
    "is_retry_safe",
    "is_unknown_outcome",
)


@overload
def recovery_retryable(tool_or_function: Tool[Any]) -> Tool[Any]: ...
@overload
def recovery_retryable(tool_or_function: Callable[..., Any]) -> Tool[Any]: ...


def recovery_retryable(tool_or_function: Tool[Any] | Callable[..., Any]) -> Tool[Any]:
    """Declare a tool safe to run again after a crash (H-52).

    Returns a **new** native `Tool` whose metadata is the original's plus `{RECOVERY_RETRY_SAFE_METADATA_KEY: True}`.
    The function is not wrapped and the argument is not modified. Works as a decorator on a plain function
    (which becomes a `Tool` with default settings) or as a call on an existing `Tool`.
    """
    tool = tool_or_function if isinstance(tool_or_function, Tool) else Tool(tool_or_function)
    metadata = {**(tool.metadata or {}), RECOVERY_RETRY_SAFE_METADATA_KEY: True}
    copied = copy_tool(tool)
    copied.metadata = metadata
    return copied


def copy_tool(tool: Tool[Any]) -> Tool[Any]:
    """A shallow copy of a `Tool` that shares the function and schema but not the metadata dict."""
    if dataclasses.is_dataclass(tool):
        return dataclasses.replace(tool)
    clone = object.__new__(type(tool))
    clone.__dict__.update(tool.__dict__)
    return clone


def is_retry_safe(tool_def: ToolDefinition) -> bool:
    """H-50, H-51: only the boolean `True` in the prepared definition's metadata marks a tool."""
    return (tool_def.metadata or {}).get(RECOVERY_RETRY_SAFE_METADATA_KEY) is True


def unknown_outcome_result(call: ToolCallPart) -> ToolReturnPart:
    """The exact result recorded for a call whose outcome is unknown (§3.10, H-43)."""
    return ToolReturnPart(
        tool_name=call.tool_name,
        tool_call_id=call.tool_call_id,
        content=UNKNOWN_OUTCOME_CONTENT,
        outcome="interrupted",
        metadata={UNKNOWN_OUTCOME_METADATA_KEY: True},
    )


def is_unknown_outcome(part: ToolReturnPart) -> bool:
    return isinstance(part.metadata, dict) and part.metadata.get(UNKNOWN_OUTCOME_METADATA_KEY) is True
