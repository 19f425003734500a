"""How a run starts when its history ends in a response with open calls: recovery or a fresh batch.

`start_open_calls` decides (with the pure planner and pre-flight checks) and prepares at most one native
pydantic-ai `CallToolsNode` for the calls that must really execute — replays, and the output-tool calls beside
them (§2); `OpenCallStart.finish` merges what that node produced with the harness-made results into one request,
in call order (H-44), then goes on, ends the run with the restored output, or ends it suspended.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError
from pydantic_ai import CallToolsNode, DeferredToolRequests, ModelRequestNode, ToolApproved
from pydantic_ai.messages import (
    BaseToolReturnPart,
    ModelMessage,
    ModelRequest,
    ModelRequestPart,
    ModelResponse,
    RetryPromptPart,
    ToolCallPart,
    ToolReturnPart,
    UserContent,
    UserPromptPart,
)
from pydantic_graph import End

from . import _agent_glue as glue
from .deferred import DeferredToolResume
from .errors import RunError
from .history import last_response_index, tool_calls, unanswered_calls
from .reconcile import recovery_tag, tagged_return
from .recovery import RecoveryDecision, ToolRecovery, calls_in_order, plan_recovery, unanswered_output_calls
from .recovery_basis import record_recovery_basis
from .recovery_tools import unknown_outcome_result
from .resume_check import check_surface

__all__ = ("OpenCallStart", "StartOutcome", "start_open_calls")


@dataclass(frozen=True, kw_only=True)
class StartOutcome:
    node: Any = None
    """The next node to run, when the run goes on."""
    suspend: DeferredToolRequests | None = None
    """Set when the run ends suspended right after the start."""
    messages: tuple[ModelMessage, ...] = ()
    """Messages to append to the canonical history when suspending."""


@dataclass(kw_only=True)
class OpenCallStart:
    calls: list[ToolCallPart]
    """The open calls the merged request answers, in call order; output-tool calls next to function calls (§2)."""
    native_node: CallToolsNode[Any, Any] | None
    harness_parts: dict[str, list[ModelRequestPart]] = field(default_factory=dict)
    suspend_approvals: list[ToolCallPart] = field(default_factory=list)
    suspend_calls: list[ToolCallPart] = field(default_factory=list)
    user_input: str | Sequence[UserContent] | None = None
    pending_answer_ids: frozenset[str] = frozenset()
    recovery_tags: dict[str, str] = field(default_factory=dict)
    """`candor.recovery` metadata for the native returns of recovered calls: "replayed" or "rerun"."""

    def finish(self, run: Any, node: Any) -> StartOutcome:
        native_returns: dict[str, ModelRequestPart] = {}
        trailing: list[ModelRequestPart] = []
        native_deferred: DeferredToolRequests | None = None
        final_output = False
        if isinstance(node, ModelRequestNode):
            _split_parts(node.request.parts, native_returns, trailing)
        elif isinstance(node, End):
            output = node.data.output
            if isinstance(output, DeferredToolRequests):
                native_deferred = output
            else:
                final_output = True  # a restored output-tool call gave the run its output (§2)
            for message in run.new_messages():
                if isinstance(message, ModelRequest):
                    _split_parts(message.parts, native_returns, trailing)
        if final_output:
            # As pydantic-ai does for a response holding both: a final result wins over deferrable calls.
            self._close_suspensions_after_final_result()
        merged: list[ModelRequestPart] = []
        prompts: list[ModelRequestPart] = []
        for call in self.calls:
            for part in self.harness_parts.get(call.tool_call_id, ()):
                # pydantic-ai puts user content of a ToolReturn after all returns; so does the harness.
                (prompts if isinstance(part, UserPromptPart) else merged).append(part)
            if call.tool_call_id in native_returns:
                part = native_returns[call.tool_call_id]
                tag = self.recovery_tags.get(call.tool_call_id)
                merged.append(part if tag is None else tagged_return(part, tag))
        merged.extend(trailing)
        merged.extend(prompts)
        if final_output:
            # No model request follows, so the returns close the run; pydantic-ai ignores a prompt given with
            # a response holding final output, and so does the harness.
            glue.replace_final_request(run, merged)
            return StartOutcome(node=node)
        if self.user_input is not None:
            merged.append(UserPromptPart(self.user_input))  # H-62, H-83: input follows the returns
        deferred = _merge_deferred(native_deferred, self.suspend_approvals, self.suspend_calls)
        if deferred is not None:
            return StartOutcome(suspend=deferred, messages=(ModelRequest(parts=merged),) if merged else ())
        if isinstance(node, End):
            return StartOutcome(node=node)
        request = ModelRequest(parts=merged)
        if isinstance(node, ModelRequestNode):
            return StartOutcome(node=glue.replace_request(node, request))
        return StartOutcome(node=ModelRequestNode(request=request))

    def _close_suspensions_after_final_result(self) -> None:
        for call in (*self.suspend_approvals, *self.suspend_calls):
            self.harness_parts[call.tool_call_id] = [glue.skipped_after_final_result(call)]
        self.suspend_approvals = []
        self.suspend_calls = []


def _split_parts(
    parts: Sequence[ModelRequestPart], returns: dict[str, ModelRequestPart], trailing: list[ModelRequestPart]
) -> None:
    for part in parts:
        if isinstance(part, (BaseToolReturnPart, RetryPromptPart)) and part.tool_call_id:
            returns[part.tool_call_id] = part
        else:
            trailing.append(part)


def _merge_deferred(
    native: DeferredToolRequests | None, approvals: list[ToolCallPart], calls: list[ToolCallPart]
) -> DeferredToolRequests | None:
    if native is None and not approvals and not calls:
        return None
    merged = copy.deepcopy(native) if native is not None else DeferredToolRequests()
    merged.approvals.extend(approvals)
    merged.calls.extend(calls)
    return merged


def start_open_calls(
    run: Any,
    *,
    history: Sequence[ModelMessage],
    batch: DeferredToolResume | None,
    mode: ToolRecovery,
    user_input: str | Sequence[UserContent] | None,
    deferred_tools_supported: bool = True,
    reconciled: Mapping[str, RecoveryDecision] | None = None,
) -> OpenCallStart:
    """Decide what happens to the open calls of the last response, before any model request (H-58).

    `reconciled` holds the decisions its reconciler settled for a call (`_reconcile_run`); they replace the plan's.
    """
    surface = glue.prepared_surface(run)
    output_names = glue.output_tool_names(run)
    open_calls = unanswered_calls(history, output_tool_names=output_names)
    if batch is not None and not batch.recovery:
        return _start_fresh_batch(run, history, batch, surface, open_calls, user_input)
    plan = plan_recovery(
        history, surface, mode, accepted=batch.results if batch is not None else None, output_tool_names=output_names
    )
    # §2: output-tool calls are never recovered; next to open function calls they run natively with the replays,
    # so pydantic-ai applies its end_strategy to them as to any response (H-41, H-46).
    output_calls = unanswered_output_calls(history, surface, output_names) if open_calls else []
    answered_here = calls_in_order(history, [*open_calls, *output_calls])
    start = OpenCallStart(calls=answered_here, native_node=None, user_input=user_input)
    replay: list[ToolCallPart] = []
    decisions = [(reconciled or {}).get(planned.call.tool_call_id, planned) for planned in plan.decisions]
    record_recovery_basis(decisions, surface)  # why each call was or was not re-run (docs/mcp.md)
    for decision in decisions:
        call = decision.call
        if decision.action == "replay":
            replay.append(call)
            start.recovery_tags[call.tool_call_id] = recovery_tag(decision) or "replayed"
        elif decision.action == "unknown_outcome":
            start.harness_parts[call.tool_call_id] = [unknown_outcome_result(call)]
        elif decision.action == "apply_answer":
            start.harness_parts[call.tool_call_id] = list(decision.answer)
        elif decision.action == "suspend" and not deferred_tools_supported:
            start.harness_parts[call.tool_call_id] = [denied_result(call)]  # H-84: closed in-run as denied
        elif decision.action == "suspend":
            tool_def = surface.get(call.tool_name)
            if tool_def is not None and tool_def.kind == "external":
                start.suspend_calls.append(call)  # H-56
            else:
                start.suspend_approvals.append(call)  # H-55, H-94: ask again, never reuse an approval
    if replay or output_calls:
        # Replays run natively, so validation, hooks and deferral apply as to a fresh call (H-54, H-57);
        # pydantic-ai's native path runs them with ctx.tool_call_approved False (H-55).
        native_calls = calls_in_order(history, [*replay, *output_calls])
        start.native_node = CallToolsNode(ModelResponse(parts=copy.deepcopy(native_calls)))
    return start


def denied_result(call: ToolCallPart) -> ToolReturnPart:
    return ToolReturnPart(
        tool_name=call.tool_name,
        tool_call_id=call.tool_call_id,
        content=glue.DENIED_UNSUPPORTED_MESSAGE,
        outcome="denied",
    )


def _start_fresh_batch(
    run: Any,
    history: Sequence[ModelMessage],
    batch: DeferredToolResume,
    surface: dict[str, Any],
    open_calls: list[ToolCallPart],
    user_input: str | Sequence[UserContent] | None,
) -> OpenCallStart:
    """H-74, H-75, H-80: a fresh batch alone decides; it runs through pydantic-ai's native resume path."""
    check_surface(batch, surface)
    _validate_overrides(run, batch)
    index = last_response_index(history)
    assert index is not None
    response: ModelResponse = history[index]  # type: ignore[assignment]
    batch_ids = {c.tool_call_id for c in batch.requests.approvals} | {c.tool_call_id for c in batch.requests.calls}
    results: dict[str, Any] = dict(batch.results.to_tool_call_results())
    for call in tool_calls(response):
        if call.tool_call_id not in batch_ids:
            results[call.tool_call_id] = "skip"
    start = OpenCallStart(calls=open_calls, native_node=None, user_input=user_input)
    for call in open_calls:
        if call.tool_call_id not in batch_ids:
            # Not part of the batch: the run cannot know its outcome.
            start.harness_parts[call.tool_call_id] = [unknown_outcome_result(call)]
    start.native_node = CallToolsNode(
        copy.deepcopy(response),
        tool_call_results=results,
        tool_call_metadata=copy.deepcopy(batch.results.metadata) or None,
    )
    return start


def _validate_overrides(run: Any, batch: DeferredToolResume) -> None:
    """H-75: overridden arguments must fit the tool's current schema before anything runs."""
    by_id = {c.tool_call_id: c for c in batch.requests.approvals}
    for tool_call_id, answer in batch.results.approvals.items():
        if not isinstance(answer, ToolApproved) or answer.override_args is None:
            continue
        call = by_id[tool_call_id]
        validator = glue.args_validator(run, call.tool_name)
        if validator is None:
            continue
        try:
            validator.validate_python(answer.override_args)
        except ValidationError as exc:
            raise RunError(
                "the overridden arguments do not fit the tool's current schema",
                code="deferred_override_invalid",
                details={"tool_call_id": tool_call_id, "tool_name": call.tool_name, "error_count": exc.error_count()},
            ) from exc
