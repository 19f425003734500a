"""DeferredToolResume (pure): a batch of pending deferred items plus the host's answers (spec §3.9, §5).

A batch pairs the native `DeferredToolRequests` of a suspended run with the native `DeferredToolResults` the host
supplies. It is an immutable value: both parts are deep-copied at construction (H-87, H-88), and `remaining()`
returns a new batch instead of changing this one (H-89).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic_ai import DeferredToolRequests, DeferredToolResults
from pydantic_ai.messages import ModelMessage, ModelResponse, ToolCallPart
from pydantic_ai.tools import ToolDefinition

from .errors import RunError
from .history import answered_call_ids, last_response_index, tool_calls

__all__ = (
    "MAX_DEFERRED_ITEMS",
    "MAX_DEFERRED_METADATA_BYTES",
    "DEFERRED_FUNCTION_ID_METADATA_KEY",
    "DeferredToolResume",
    "pending_ids",
    "deferred_function_id",
)

MAX_DEFERRED_ITEMS = 128
"""Most items (calls plus approvals) one batch may hold (H-66)."""
MAX_DEFERRED_METADATA_BYTES = 65536
"""Largest encoded JSON of the request metadata or of the result metadata of one batch (H-69)."""
DEFERRED_FUNCTION_ID_METADATA_KEY = "candor.deferred_function_id"
"""Request metadata key set on deferrals raised by local function tools: the tool's stable identity (§5, H-74)."""
LOCAL_TOOL_KINDS = frozenset({"function", "unapproved"})
"""Prepared `ToolDefinition.kind`s of local function tools (approval-gated ones included)."""


def tool_function_id(tool: ToolDefinition) -> str:
    """A local function tool's stable identity: its non-blank string `candor.deferred_function_id` metadata entry,
    else (fallback) its name. The stamp on its deferrals and the H-74 check at resume both use this rule."""
    declared = (tool.metadata or {}).get(DEFERRED_FUNCTION_ID_METADATA_KEY)
    return declared if isinstance(declared, str) and declared else tool.name


def stamp_function_ids(requests: DeferredToolRequests, surface: Mapping[str, ToolDefinition]) -> DeferredToolRequests:
    """The requests of a suspending run with each deferral of a local function tool stamped with the tool's
    identity (§5), for H-74 to match on resume; an identity the tool put in its deferral's metadata is kept.

    `surface` is the step's prepared tools (name → definition), the surface the deferring tool ran in. Calls of
    external tools are left as they are; so are the requests when nothing needs a stamp.
    """
    stamped: dict[str, Any] | None = None
    for call in requests.calls:
        tool = surface.get(call.tool_name)
        if tool is None or tool.kind not in LOCAL_TOOL_KINDS:
            continue
        metadata = requests.metadata.get(call.tool_call_id)
        if isinstance(metadata, dict) and DEFERRED_FUNCTION_ID_METADATA_KEY in metadata:
            continue
        if stamped is None:
            stamped = dict(requests.metadata)
        stamped[call.tool_call_id] = {
            **(metadata if isinstance(metadata, dict) else {}),
            DEFERRED_FUNCTION_ID_METADATA_KEY: tool_function_id(tool),
        }
    return requests if stamped is None else dataclasses.replace(requests, metadata=stamped)


@dataclass(frozen=True)
class DeferredToolResume:
    """A batch: the pending requests of a suspended run plus the host's answers to them."""

    requests: DeferredToolRequests
    """The native pending requests; a private deep copy of what was passed in."""
    results: DeferredToolResults
    """The native answers; a private deep copy of what was passed in."""
    recovery: bool = False
    """`False`: the host's first delivery of answers. `True`: accepted answers re-offered after an interruption."""

    def __post_init__(self) -> None:
        # H-88: only the native pydantic-ai types are accepted.
        if not isinstance(self.requests, DeferredToolRequests):
            raise TypeError("DeferredToolResume.requests must be a pydantic_ai.DeferredToolRequests")
        if not isinstance(self.results, DeferredToolResults):
            raise TypeError("DeferredToolResume.results must be a pydantic_ai.DeferredToolResults")
        if not isinstance(self.recovery, bool):
            raise TypeError("DeferredToolResume.recovery must be a bool")
        # H-87: later changes to the caller's objects must not reach the batch.
        try:
            requests = copy.deepcopy(self.requests)
            results = copy.deepcopy(self.results)
        except Exception as exc:
            raise TypeError("DeferredToolResume requests and results must be deep-copyable") from exc
        object.__setattr__(self, "requests", requests)
        object.__setattr__(self, "results", results)

    def remaining(self, messages: Sequence[ModelMessage]) -> DeferredToolResume | None:
        """The part of this batch that `messages` does not reflect yet, or `None` (spec §3.9, H-89).

        Keeps the items whose id names a call of the last `ModelResponse` that has no return after it; their
        answers and metadata come along, everything else is dropped. Never mutates this batch.
        """
        index = last_response_index(messages)
        if index is None:
            raise RunError("the history has no model response to apply the batch to", code="deferred_request_missing")
        response: ModelResponse = messages[index]  # type: ignore[assignment]
        answered = answered_call_ids(messages, index)
        open_ids = {call.tool_call_id for call in tool_calls(response)} - answered

        requests, results = self.requests, self.results
        kept_calls = [call for call in requests.calls if _open_id(call, open_ids) is not None]
        kept_approvals = [call for call in requests.approvals if _open_id(call, open_ids) is not None]
        if not kept_calls and not kept_approvals:
            return None
        kept = {call.tool_call_id for call in [*kept_calls, *kept_approvals]}
        restricted_requests = DeferredToolRequests(
            calls=kept_calls,
            approvals=kept_approvals,
            metadata=_restrict(requests.metadata, kept),
            _kinds=_restrict(requests._kinds, kept),
        )
        restricted_results = DeferredToolResults(
            calls=_restrict(results.calls, kept),
            approvals=_restrict(results.approvals, kept),
            metadata=_restrict(results.metadata, kept),
            answered_by=_restrict(results.answered_by, kept),
        )
        # The constructor deep-copies again, so nothing is shared with this batch.
        return DeferredToolResume(requests=restricted_requests, results=restricted_results, recovery=self.recovery)


def pending_ids(requests: DeferredToolRequests) -> tuple[list[str], list[str]]:
    """The pending ids of a request envelope: (approval ids, call ids), each in request order."""
    return [call.tool_call_id for call in requests.approvals], [call.tool_call_id for call in requests.calls]


def deferred_function_id(requests: DeferredToolRequests, tool_call_id: str) -> Any:
    """The `candor.deferred_function_id` stamped on a pending call's request metadata, or `None` when absent.

    The value is returned as stored; callers decide what a non-string value means.
    """
    metadata = requests.metadata.get(tool_call_id) if isinstance(requests.metadata, dict) else None
    if not isinstance(metadata, dict):
        return None
    return metadata.get(DEFERRED_FUNCTION_ID_METADATA_KEY)


def _open_id(call: object, open_ids: set[str]) -> str | None:
    """The id of a request item when it names an open call; malformed items name nothing."""
    tool_call_id = getattr(call, "tool_call_id", None) if isinstance(call, ToolCallPart) else None
    return tool_call_id if isinstance(tool_call_id, str) and tool_call_id in open_ids else None


def _restrict(mapping: Any, ids: set[str]) -> Any:
    """The entries of `mapping` keyed by `ids`; a malformed (non-dict) value is passed on for check_resume."""
    if not isinstance(mapping, dict):
        return mapping
    return {key: value for key, value in mapping.items() if isinstance(key, str) and key in ids}
