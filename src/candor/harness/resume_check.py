"""Resume pre-flight (pure): does a batch fit the restored history, and the current tool surface? (H-64 to H-74).

`check_resume()` runs the synchronous checks of H-64 to H-72 in a fixed order and returns the pending calls as
found in history; `check_surface()` is the H-74 check against the prepared tool definitions of the first step.
Neither touches its inputs (H-73). Every error is raised with a stable code; `details` name ids, categories and
fields, never a submitted value.
"""

from __future__ import annotations

import copy
import json
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal, NoReturn

from pydantic_ai import DeferredToolRequests, DeferredToolResults, ToolApproved, ToolDenied, ToolReturn
from pydantic_ai.exceptions import ToolFailed
from pydantic_ai.messages import ModelMessage, ModelResponse, ToolCallPart
from pydantic_ai.tools import DeferredToolKind, ToolDefinition

from .deferred import (
    LOCAL_TOOL_KINDS,
    MAX_DEFERRED_ITEMS,
    MAX_DEFERRED_METADATA_BYTES,
    DeferredToolResume,
    deferred_function_id,
    pending_ids,
    tool_function_id,
)
from .errors import DefinitionError, RunError
from .history import answered_call_ids, last_response_index, tool_calls

__all__ = ("ResumeCheck", "check_resume", "check_surface")


@dataclass(frozen=True, kw_only=True, slots=True)
class ResumeCheck:
    """A batch that passed the pre-flight: its pending calls as history holds them, and their categories."""

    calls: Mapping[str, ToolCallPart]
    """Pending id → the `ToolCallPart` of the last response (a detached copy), in the response's call order."""
    categories: Mapping[str, DeferredToolKind]
    """Pending id → `"approval"`, `"external"` or `"question"` (from `requests.kind(id)`)."""
    response_index: int
    """Index in the history of the last `ModelResponse`, the one the batch answers."""

    def category(self, tool_call_id: str) -> DeferredToolKind:
        """The category of a pending id; `KeyError` for any other id."""
        return self.categories[tool_call_id]


def check_resume(resume: object, messages: Sequence[ModelMessage], *, has_previous_state: bool) -> ResumeCheck:
    """The synchronous batch pre-flight of H-64 to H-72; raises `RunError` on the first problem found."""
    # H-64: argument problems come first.
    if not isinstance(resume, DeferredToolResume):
        raise _error("deferred_resume_invalid", "deferred_resume must be a DeferredToolResume")
    if not has_previous_state:
        raise _error("deferred_state_required", "deferred_resume needs the previous_state it answers")
    requests, results = resume.requests, resume.results
    _check_structure(requests, results)  # H-64
    approval_ids, call_ids = pending_ids(requests)
    _check_shape(approval_ids, call_ids)  # H-66
    _check_coverage("approvals", approval_ids, results.approvals, other=call_ids)  # H-65
    _check_coverage("calls", call_ids, results.calls, other=approval_ids)
    _check_answer_types(results)  # H-67
    _check_finite(results)  # H-68
    pending = frozenset(approval_ids) | frozenset(call_ids)
    _check_metadata("requests.metadata", requests.metadata, pending)  # H-69
    _check_metadata("results.metadata", results.metadata, pending)
    return _check_history(requests, messages)  # H-70, H-71, H-72


def check_surface(resume: DeferredToolResume, surface: Mapping[str, ToolDefinition]) -> None:
    """H-74: each pending item still fits the prepared tool surface (tool name → `ToolDefinition`).

    * An approval needs a tool of that name of kind `function` or `unapproved`.
    * A deferral raised by a local function tool (request metadata carries `candor.deferred_function_id`) needs a
      local tool of the call's name whose `ToolDefinition.metadata["candor.deferred_function_id"]` equals it. A
      definition without that key (or with a blank or non-string value) is compared by its name instead, the same
      fallback the stamping applies.
      A question without the stamp needs a local tool of that name.
    * Any other call is external: it needs a tool of that name of kind `external`. If no tool of that name is left,
      only a `ToolFailed` answer is accepted; a tool of another kind that shares the name never matches.

    Expects a batch that passed `check_resume()`; raises `DefinitionError` for the first item that does not fit.
    """
    requests, results = resume.requests, resume.results
    for call in requests.approvals:
        tool = surface.get(call.tool_name)
        if tool is None or tool.kind not in LOCAL_TOOL_KINDS:
            _surface_mismatch(call.tool_call_id, "approval", "no_approvable_tool")
    for call in requests.calls:
        category = requests.kind(call.tool_call_id)
        tool = surface.get(call.tool_name)
        function_id = deferred_function_id(requests, call.tool_call_id)
        if function_id is not None:
            if not isinstance(function_id, str):
                _surface_mismatch(call.tool_call_id, category, "function_id_invalid")
            if tool is None or tool.kind not in LOCAL_TOOL_KINDS or tool_function_id(tool) != function_id:
                _surface_mismatch(call.tool_call_id, category, "no_matching_function_tool")
        elif category == "question":
            if tool is None or tool.kind not in LOCAL_TOOL_KINDS:
                _surface_mismatch(call.tool_call_id, category, "no_matching_function_tool")
        elif tool is None:
            if not isinstance(results.calls.get(call.tool_call_id), ToolFailed):
                _surface_mismatch(call.tool_call_id, category, "external_tool_removed")
        elif tool.kind != "external":
            _surface_mismatch(call.tool_call_id, category, "not_an_external_tool")


# -- structure and shape (H-64, H-66) ---------------------------------------------------------------------------


def _check_structure(requests: DeferredToolRequests, results: DeferredToolResults) -> None:
    """Containers hold what the native types declare; anything else is a malformed batch argument (H-64)."""
    problems = [f"requests.{name}" for name in ("calls", "approvals") if not _is_call_list(getattr(requests, name))]
    problems += [f"requests.{name}" for name in ("metadata", "_kinds") if not isinstance(getattr(requests, name), dict)]
    problems += [
        f"results.{name}" for name in ("calls", "approvals", "metadata") if not isinstance(getattr(results, name), dict)
    ]
    # `_kinds` only ever marks calls as questions (or external); anything else would break the categories of §5.
    if not problems and not all(kind in ("question", "external") for kind in requests._kinds.values()):
        problems.append("requests._kinds")
    if problems:
        raise _error("deferred_resume_invalid", "the batch is malformed", field=problems[0])


def _is_call_list(items: object) -> bool:
    return isinstance(items, list) and all(
        isinstance(item, ToolCallPart) and isinstance(item.tool_call_id, str) and isinstance(item.tool_name, str)
        for item in items
    )


def _check_shape(approval_ids: list[str], call_ids: list[str]) -> None:
    total = len(approval_ids) + len(call_ids)
    if total == 0:
        raise _error("deferred_requests_empty", "the batch holds no pending requests")
    if total > MAX_DEFERRED_ITEMS:
        raise _error(
            "deferred_requests_too_large", "the batch holds too many items", item_count=total, limit=MAX_DEFERRED_ITEMS
        )
    for category, ids in (("approvals", approval_ids), ("calls", call_ids)):
        if any(not tool_call_id.strip() for tool_call_id in ids):
            raise _error("deferred_request_duplicate", "a pending request has a blank id", category=category)
        if repeated := _repeated(ids):
            raise _error(
                "deferred_request_duplicate",
                "a pending id repeats within its category",
                category=category,
                tool_call_ids=repeated,
            )
    if overlap := sorted(set(approval_ids) & set(call_ids)):
        raise _error(
            "deferred_request_category_overlap", "a pending id is both an approval and a call", tool_call_ids=overlap
        )


# -- answers (H-65, H-67, H-68) -----------------------------------------------------------------------------------


def _check_coverage(field: str, expected: list[str], answers: dict[Any, Any], *, other: list[str]) -> None:
    """H-65: the answer keys of one category equal its pending ids exactly."""
    keys = set(answers)
    if keys == set(expected):
        return
    extra = [key for key in keys if key not in expected]
    # Pending ids placed in the wrong category are named; any other key is only counted (never echoed).
    raise _error(
        "deferred_results_incomplete",
        f"the answers in results.{field} do not match the pending {field} exactly",
        field=f"results.{field}",
        missing=sorted(set(expected) - keys),
        misplaced=sorted(key for key in extra if key in other),
        unknown_count=sum(1 for key in extra if key not in other),
    )


def _check_answer_types(results: DeferredToolResults) -> None:
    """H-67: each category accepts one family of answers (§5)."""
    for tool_call_id, answer in results.approvals.items():
        if not _is_approval_answer(answer):
            raise _error(
                "deferred_approval_invalid",
                "an approval answer must be a bool, ToolApproved or ToolDenied",
                tool_call_id=tool_call_id,
            )
    for tool_call_id, call_answer in results.calls.items():
        if isinstance(call_answer, ToolReturn):
            problem = None  # its data is checked for finiteness by H-68
        elif isinstance(call_answer, ToolFailed):
            problem = None if isinstance(call_answer.message, str) else "type"
        else:
            problem = _json_problem(call_answer)
        if problem is not None:
            raise _error(
                "deferred_results_invalid",
                "a call answer must be a finite JSON value, ToolReturn or ToolFailed",
                tool_call_id=tool_call_id,
                field="results.calls",
                reason=problem,
            )


def _is_approval_answer(answer: object) -> bool:
    if isinstance(answer, bool):
        return True
    if isinstance(answer, ToolApproved):
        overrides = answer.override_args
        return overrides is None or (isinstance(overrides, dict) and all(isinstance(key, str) for key in overrides))
    return isinstance(answer, ToolDenied) and isinstance(answer.message, str)


def _check_finite(results: DeferredToolResults) -> None:
    """H-68: no NaN or infinity inside override_args or a ToolReturn (plain values were checked with H-67)."""
    carried: list[tuple[str, str, tuple[Any, ...]]] = [
        ("results.approvals", tool_call_id, (answer.override_args,))
        for tool_call_id, answer in results.approvals.items()
        if isinstance(answer, ToolApproved)
    ]
    carried += [
        ("results.calls", tool_call_id, (answer.return_value, answer.metadata))
        for tool_call_id, answer in results.calls.items()
        if isinstance(answer, ToolReturn)
    ]
    for field, tool_call_id, values in carried:
        if any(_has_non_finite(value) for value in values):
            raise _error(
                "deferred_results_invalid",
                "answers must not contain NaN or infinity",
                tool_call_id=tool_call_id,
                field=field,
                reason="non_finite",
            )


# -- metadata (H-69) ------------------------------------------------------------------------------------------------


def _check_metadata(field: str, metadata: dict[Any, Any], pending: frozenset[str]) -> None:
    """H-69: keys are pending ids, values are finite JSON objects, the encoded mapping fits the byte limit."""
    for key, value in metadata.items():
        if not isinstance(key, str) or key not in pending:
            raise _error(
                "deferred_metadata_invalid",
                f"{field} names an id that is not pending",
                field=field,
                reason="unknown_id",
            )
        if not isinstance(value, dict) or _json_problem(value) is not None:
            raise _error(
                "deferred_metadata_invalid",
                f"{field} entries must be finite JSON objects",
                field=field,
                tool_call_id=key,
                reason="not_json",
            )
    # The encoded form is compact UTF-8 JSON, the way a host stores or sends it.
    size = len(json.dumps(metadata, allow_nan=False, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))
    if size > MAX_DEFERRED_METADATA_BYTES:
        raise _error(
            "deferred_metadata_invalid",
            f"{field} is too large",
            field=field,
            reason="too_large",
            size=size,
            limit=MAX_DEFERRED_METADATA_BYTES,
        )


# -- correlation with history (H-70, H-71, H-72) ---------------------------------------------------------------


def _check_history(requests: DeferredToolRequests, messages: Sequence[ModelMessage]) -> ResumeCheck:
    index = last_response_index(messages)
    if index is None:
        raise _error("deferred_request_missing", "the history has no model response to answer", reason="no_response")
    response: ModelResponse = messages[index]  # type: ignore[assignment]
    calls = tool_calls(response)
    in_history = {call.tool_call_id: call for call in calls}
    requested = [*requests.approvals, *requests.calls]
    if missing := [call.tool_call_id for call in requested if call.tool_call_id not in in_history]:
        raise _error(
            "deferred_request_missing", "a pending id is not a call of the last model response", tool_call_ids=missing
        )
    if repeated := _repeated([call.tool_call_id for call in calls]):
        raise _error(
            "deferred_request_duplicate",
            "the last model response repeats a call id",
            tool_call_ids=repeated,
            where="history",
        )
    answered = answered_call_ids(messages, index)
    if completed := [call.tool_call_id for call in requested if call.tool_call_id in answered]:
        raise _error(
            "deferred_request_completed", "a pending call already has a return in history", tool_call_ids=completed
        )
    for request in requested:
        _check_same_call(request, in_history[request.tool_call_id])
    pending = {call.tool_call_id for call in requested}
    return ResumeCheck(
        calls=MappingProxyType({c.tool_call_id: copy.deepcopy(c) for c in calls if c.tool_call_id in pending}),
        categories=MappingProxyType({tool_call_id: requests.kind(tool_call_id) for tool_call_id in pending}),
        response_index=index,
    )


def _check_same_call(request: ToolCallPart, recorded: ToolCallPart) -> None:
    """H-72: the request names the recorded call's tool and carries the same parsed arguments."""
    tool_call_id = request.tool_call_id
    if request.tool_name != recorded.tool_name:
        raise _error(
            "deferred_request_mismatch",
            "a pending request names another tool than the call in history",
            tool_call_id=tool_call_id,
            field="tool_name",
        )
    parsed = []
    for source, call in (("request", request), ("history", recorded)):
        try:
            args = call.args_as_dict(raise_if_invalid=True)
        except (ValueError, AssertionError, TypeError):
            args = None
        if not isinstance(args, dict):
            raise _error(
                "deferred_request_invalid",
                "the arguments of a pending call cannot be parsed",
                tool_call_id=tool_call_id,
                source=source,
            )
        parsed.append(args)
    if not _same_json(parsed[0], parsed[1]):
        raise _error(
            "deferred_request_mismatch",
            "a pending request carries other arguments than the call in history",
            tool_call_id=tool_call_id,
            field="args",
        )


def _repeated(ids: list[str]) -> list[str]:
    return sorted(tool_call_id for tool_call_id, count in Counter(ids).items() if count > 1)


def _error(code: str, message: str, **details: Any) -> RunError:
    """A pre-flight `RunError`; `details` carry ids, fields and counts only (§6, H-73)."""
    return RunError(message, code=code, details=details)


# -- surface (H-74) ------------------------------------------------------------------------------------------------


def _surface_mismatch(tool_call_id: str, category: str, reason: str) -> NoReturn:
    raise DefinitionError(
        "a pending item no longer fits the current tool surface",
        code="deferred_surface_mismatch",
        details={"tool_call_id": tool_call_id, "category": category, "reason": reason},
    )


# -- JSON values ------------------------------------------------------------------------------------------------------


def _json_problem(value: Any) -> Literal["type", "non_finite"] | None:
    """Why `value` is not a finite JSON value (dict with str keys, list, str, int, float, bool, None), or `None`.

    Iterative, so deep nesting cannot exhaust the stack; a container that contains itself is not JSON.
    """
    stack: list[tuple[Any, bool]] = [(value, False)]
    ancestors: set[int] = set()
    while stack:
        item, leaving = stack.pop()
        if leaving:
            ancestors.discard(id(item))
        elif isinstance(item, float):
            if not math.isfinite(item):
                return "non_finite"
        elif item is None or isinstance(item, (str, int)):
            continue
        elif isinstance(item, (dict, list)):
            if id(item) in ancestors:
                return "type"
            ancestors.add(id(item))
            stack.append((item, True))
            if isinstance(item, dict):
                if not all(isinstance(key, str) for key in item):
                    return "type"
                stack.extend((child, False) for child in item.values())
            else:
                stack.extend((child, False) for child in item)
        else:
            return "type"
    return None


def _has_non_finite(value: Any) -> bool:
    """Whether a NaN or infinity sits anywhere inside dicts, lists and tuples of `value` (other objects are opaque)."""
    stack, seen = [value], set()
    while stack:
        item = stack.pop()
        if isinstance(item, float):
            if not math.isfinite(item):
                return True
        elif isinstance(item, (dict, list, tuple)) and id(item) not in seen:
            seen.add(id(item))
            stack.extend(item.values() if isinstance(item, dict) else item)
    return False


def _same_json(left: Any, right: Any) -> bool:
    """Equality of parsed arguments that keeps booleans apart from numbers (`true` is not `1`)."""
    stack = [(left, right)]
    while stack:
        a, b = stack.pop()
        if isinstance(a, bool) or isinstance(b, bool):
            if not (isinstance(a, bool) and isinstance(b, bool) and a == b):
                return False
        elif isinstance(a, dict) and isinstance(b, dict):
            if a.keys() != b.keys():
                return False
            stack.extend((a[key], b[key]) for key in a)
        elif isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
            if len(a) != len(b):
                return False
            stack.extend(zip(a, b, strict=True))  # equal lengths, checked above
        elif isinstance(a, (dict, list, tuple)) or isinstance(b, (dict, list, tuple)) or a != b:
            return False
    return True
