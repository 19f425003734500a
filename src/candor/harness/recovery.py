"""Recovery planning (pure): unanswered calls × `tool_recovery` mode × tool surface × accepted batch → `RecoveryPlan`.

`plan_recovery()` decides, for every unanswered call of the last `ModelResponse` (spec §2), exactly one of:

    apply_answer     an answer kept in a recovery batch is written into history (H-93)
    replay           the call runs again through pydantic-ai, with `tool_call_approved=False` (H-46, H-47, H-55)
    suspend          the run asks again: a fresh approval (H-55, H-94) or a new external request (H-56)
    unknown_outcome  the call is closed with the unknown-outcome result of §3.10 (H-43, H-45, H-46, H-48)

Nothing here performs I/O, keeps state or mutates its arguments; the executor applies the returned plan. The only
clock read is the default `timestamp` pydantic-ai gives the parts it builds (as in `unknown_outcome_result`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

from pydantic_ai import DeferredToolResults, ToolApproved, ToolDenied
from pydantic_ai.exceptions import ModelRetry, ToolFailed
from pydantic_ai.messages import (
    ModelMessage,
    RetryPromptPart,
    ToolCallPart,
    ToolReturn,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.tools import ToolDefinition

from .errors import RunError
from .history import answered_call_ids, last_response, last_response_index, unanswered_calls
from .recovery_tools import is_retry_safe, unknown_outcome_result

__all__ = (
    "ToolRecovery",
    "TOOL_RECOVERY_MODES",
    "validate_tool_recovery",
    "Action",
    "Reason",
    "RecoveryDecision",
    "RecoveryPlan",
    "decide_action",
    "plan_recovery",
    "unanswered_output_calls",
    "calls_in_order",
)

ToolRecovery = Literal["declared", "never", "always"]
TOOL_RECOVERY_MODES: frozenset[str] = frozenset(get_args(ToolRecovery))

Action = Literal["replay", "unknown_outcome", "suspend", "apply_answer"]
Reason = Literal[
    "retry_safe",  # declared + retry-safe tool → replay (H-46)
    "mode_always",  # always → replay (H-47)
    "not_retry_safe",  # declared + tool not marked → unknown outcome (H-46, H-50, H-51, H-94)
    "tool_missing",  # tool no longer on the surface → unknown outcome (H-48)
    "mode_never",  # never → unknown outcome (H-45, H-94)
    "approval_required",  # replay of an approval-gated tool → fresh approval request (H-55)
    "external_tool",  # replay of an external tool → new external request (H-56)
    "accepted_approval_not_reused",  # an accepted approval never authorises a replay → ask again (H-94)
    "accepted_answer",  # an external call's accepted result → written into history (H-79, H-93)
    "accepted_denial",  # an accepted denial → `outcome="denied"` return (H-78, H-93)
    "reconciled",  # the tool's reconciler confirmed the effect → its result is the return (reconcile.py)
    "not_done",  # the tool's reconciler said the effect did not happen → the call runs again, once
    "reconcile_unknown",  # the reconciler could not tell → unknown outcome
    "reconcile_failed",  # the reconciler raised, timed out or answered nonsense → unknown outcome
]

_DEFAULT_DENIAL_MESSAGE: str = ToolDenied().message  # "The tool call was denied."
_NOT_A_CALL_ANSWER = (ModelRetry, RetryPromptPart)  # H-67: rejected by pre-flight; never a "plain JSON value"


def validate_tool_recovery(value: object) -> ToolRecovery:
    """H-61: return `value` if it is one of the three literals, else raise `ValueError`.

    Only genuine `str` instances count (no `str` subclasses such as enum members); the value is not echoed.
    """
    if type(value) is str and value in TOOL_RECOVERY_MODES:
        return value  # type: ignore[return-value]
    allowed = ", ".join(repr(mode) for mode in sorted(TOOL_RECOVERY_MODES))
    raise ValueError(f"tool_recovery must be one of {allowed}; got a value of type {type(value).__name__}")


@dataclass(frozen=True, slots=True, kw_only=True)
class RecoveryDecision:
    """What happens to one unanswered call."""

    call: ToolCallPart
    """The original call, unchanged (H-42)."""
    action: Action
    reason: Reason
    """Short machine-readable reason; see `Reason`."""
    answer: tuple[ToolReturnPart | UserPromptPart, ...] = ()
    """For `apply_answer`: the parts to write into history (the return first, then any user prompt, H-79)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RecoveryPlan:
    """One decision per unanswered call of the last response, in call order."""

    decisions: tuple[RecoveryDecision, ...] = ()
    skipped_reason: Literal["provider_suspended"] | None = None
    """Set when recovery is skipped entirely (H-59); `decisions` is then empty."""

    def _ids(self, action: Action) -> tuple[str, ...]:
        return tuple(d.call.tool_call_id for d in self.decisions if d.action == action)

    @property
    def replay_ids(self) -> tuple[str, ...]:
        return self._ids("replay")

    @property
    def unknown_ids(self) -> tuple[str, ...]:
        return self._ids("unknown_outcome")

    @property
    def suspend_ids(self) -> tuple[str, ...]:
        return self._ids("suspend")

    @property
    def answer_ids(self) -> tuple[str, ...]:
        return self._ids("apply_answer")

    @property
    def is_empty(self) -> bool:
        return not self.decisions

    def unknown_outcome_parts(self) -> list[ToolReturnPart]:
        """H-43, H-44: the unknown-outcome results, in call order, for the one new request the executor appends."""
        return [unknown_outcome_result(d.call) for d in self.decisions if d.action == "unknown_outcome"]


def decide_action(
    tool_def: ToolDefinition | None, mode: ToolRecovery, *, approved: bool = False
) -> tuple[Action, Reason]:
    """The decision for a call without an accepted answer (the policy table of §4.E and H-94).

    `tool_def` is the call's tool in the current surface (`None` when it is gone); `approved` says whether a
    recovery batch carries a positive approval (`True` / `ToolApproved`) for the call.
    """
    if tool_def is None:
        return "unknown_outcome", "tool_missing"  # H-48: whatever the mode
    if mode == "never":
        return "unknown_outcome", "mode_never"  # H-45; H-94: an approval changes nothing
    if mode == "declared" and not is_retry_safe(tool_def):
        return "unknown_outcome", "not_retry_safe"  # H-46, H-50 (current surface), H-51 (only `True`); H-94
    # From here the call would run again (declared + retry-safe, or always, H-47).
    if approved:
        return "suspend", "accepted_approval_not_reused"  # H-94: an approval never authorises a replay
    if tool_def.kind == "unapproved":
        return "suspend", "approval_required"  # H-55: replay is not approval
    if tool_def.kind == "external":
        return "suspend", "external_tool"  # H-56: an external replay suspends again
    return "replay", ("retry_safe" if mode == "declared" else "mode_always")


def plan_recovery(
    history: Sequence[ModelMessage],
    surface: Mapping[str, ToolDefinition],
    mode: ToolRecovery,
    accepted: DeferredToolResults | None = None,
    *,
    output_tool_names: frozenset[str] = frozenset(),
) -> RecoveryPlan:
    """Decide what happens to each unanswered call of the last response; reads its arguments, never mutates them.

    `surface` maps tool names to the definitions prepared for this run; `accepted` is the native
    `DeferredToolResults` of a recovery batch (ideally already reduced by `remaining()`); answers for ids that are
    not unanswered calls are ignored, so no id ever gets a second return (H-93). Raises `ValueError` for an invalid
    `mode` (H-61) and `RunError` for an answer that pre-flight would have refused (H-67).
    """
    mode = validate_tool_recovery(mode)
    last = last_response(history)
    if last is not None and last.state == "suspended":
        return RecoveryPlan(skipped_reason="provider_suspended")  # H-59: pydantic-ai continues it natively
    excluded = _output_tools(surface, output_tool_names)
    calls = unanswered_calls(history, output_tool_names=excluded)  # H-41, H-42, H-49: recorded returns stay closed
    return RecoveryPlan(decisions=tuple(_decide(call, surface.get(call.tool_name), mode, accepted) for call in calls))


def unanswered_output_calls(
    history: Sequence[ModelMessage], surface: Mapping[str, ToolDefinition], output_tool_names: frozenset[str]
) -> list[ToolCallPart]:
    """§2: the output-tool calls of the last response that no later request answers, in call order.

    They are never recovered: pydantic-ai processes them natively (H-41, H-46). Output tools are recognised as in
    `plan_recovery`.
    """
    index = last_response_index(history)
    if index is None:
        return []
    output_tools = _output_tools(surface, output_tool_names)
    answered = answered_call_ids(history, index)
    return [
        part
        for part in history[index].parts
        if isinstance(part, ToolCallPart)
        and (part.tool_kind == "output" or part.tool_name in output_tools)
        and part.tool_call_id not in answered
    ]


def _output_tools(surface: Mapping[str, ToolDefinition], named: frozenset[str]) -> frozenset[str]:
    """§2: a call is an output-tool call when tagged so, named by the caller or defined as an output tool."""
    return named | {name for name, tool_def in surface.items() if tool_def.kind == "output"}


def calls_in_order(history: Sequence[ModelMessage], calls: Sequence[ToolCallPart]) -> list[ToolCallPart]:
    """`calls` (calls of the last response) sorted as the response made them (H-44)."""
    last = last_response(history)
    parts = last.parts if last is not None else []
    position = {part.tool_call_id: index for index, part in enumerate(parts) if isinstance(part, ToolCallPart)}
    return sorted(calls, key=lambda call: position.get(call.tool_call_id, len(parts)))


def _decide(
    call: ToolCallPart, tool_def: ToolDefinition | None, mode: ToolRecovery, accepted: DeferredToolResults | None
) -> RecoveryDecision:
    if accepted is not None:
        answer = _accepted_answer(call, accepted)
        if answer is not None:  # H-93: applied first, whatever the mode or surface
            denied = isinstance(answer[0], ToolReturnPart) and answer[0].outcome == "denied"
            reason: Reason = "accepted_denial" if denied else "accepted_answer"
            return RecoveryDecision(call=call, action="apply_answer", reason=reason, answer=answer)
    approved = accepted is not None and _is_positive_approval(call, accepted)
    action, reason = decide_action(tool_def, mode, approved=approved)
    return RecoveryDecision(call=call, action=action, reason=reason)


def _accepted_answer(
    call: ToolCallPart, accepted: DeferredToolResults
) -> tuple[ToolReturnPart | UserPromptPart, ...] | None:
    """The history parts for an accepted external result or denial, or `None` when there is none.

    An id in both maps takes the `calls` answer, as pydantic-ai does (pre-flight refuses it anyway, H-66).
    """
    call_id = call.tool_call_id
    if call_id in accepted.calls:
        return _call_answer(call, accepted.calls[call_id])
    if call_id in accepted.approvals:
        return _denial(call, accepted.approvals[call_id])
    return None


def _call_answer(call: ToolCallPart, value: Any) -> tuple[ToolReturnPart | UserPromptPart, ...]:
    """H-79: `ToolFailed` → failed; `ToolReturn` → value + metadata, then its content once; else a success value."""
    if isinstance(value, ToolFailed):
        return (_return(call, value.message, outcome="failed"),)
    if isinstance(value, ToolReturn):
        part = _return(call, value.return_value, metadata=value.metadata)
        # As pydantic-ai does natively: empty content (`None`, `""`, `[]`) adds no user prompt.
        return (part, UserPromptPart(value.content)) if value.content else (part,)
    if isinstance(value, _NOT_A_CALL_ANSWER):
        raise RunError(
            "a recovery batch answers a call with a value that is not an accepted result",
            code="deferred_results_invalid",
            details={"tool_call_id": call.tool_call_id},
        )
    return (_return(call, value),)


def _denial(call: ToolCallPart, approval: object) -> tuple[ToolReturnPart, ...] | None:
    """H-78: `False` / `ToolDenied` → a denied return; a positive approval → `None` (handled by H-94)."""
    if approval is False:
        return (_return(call, _DEFAULT_DENIAL_MESSAGE, outcome="denied"),)
    if isinstance(approval, ToolDenied):
        return (_return(call, approval.message, outcome="denied"),)  # the message as given, as pydantic-ai does
    if approval is True or isinstance(approval, ToolApproved):
        return None
    raise RunError(
        "a recovery batch holds an approval answer that is not a bool, ToolApproved or ToolDenied",
        code="deferred_approval_invalid",
        details={"tool_call_id": call.tool_call_id},
    )


def _is_positive_approval(call: ToolCallPart, accepted: DeferredToolResults) -> bool:
    approval = accepted.approvals.get(call.tool_call_id)
    return approval is True or isinstance(approval, ToolApproved)


def _return(
    call: ToolCallPart,
    content: Any,
    *,
    outcome: Literal["success", "failed", "denied"] = "success",
    metadata: Any = None,
) -> ToolReturnPart:
    return ToolReturnPart(
        tool_name=call.tool_name, tool_call_id=call.tool_call_id, content=content, metadata=metadata, outcome=outcome
    )
