"""Reconcile before unknown: declarations, the stable per-call key, and the pure verdict → decision table.

A tool that is not retry-safe may declare a *reconciler*: a function that, on recovery, asks the effect's owner
(a payment API, a ledger) what became of an open call. It gets the call's validated arguments and the call's
**call key**, the same stable key the tool saw through `call_key(ctx)` when it first ran, and answers with one of

    Reconciled(result)   the effect happened; `result` is recorded as the call's return (recovery "reconciled")
    NotDone()            the effect did not happen; the call runs again, once, through the normal replay path
    OutcomeUnknown()     the owner cannot tell; the call gets the unknown-outcome result as before

Nothing here performs I/O: `settle_reconciliation` turns a recovery decision plus a verdict into the final decision;
`_reconcile_run.py` calls the reconcilers and wraps it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import weakref
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

from pydantic_ai import Tool
from pydantic_ai.messages import ModelMessage, ModelResponse, ToolCallPart, ToolReturnPart
from pydantic_ai.tools import RunContext, ToolDefinition

from .errors import RunError
from .recovery import RecoveryDecision, ToolRecovery, decide_action
from .recovery_tools import copy_tool, is_retry_safe

__all__ = (
    "RECONCILER_METADATA_KEY",
    "RECOVERY_METADATA_KEY",
    "CALL_KEY_METADATA_KEY",
    "DEFAULT_RECONCILE_TIMEOUT",
    "Reconciled",
    "NotDone",
    "OutcomeUnknown",
    "Verdict",
    "ReconcileRequest",
    "Reconciler",
    "reconciler_for",
    "with_reconciler",
    "derive_call_key",
    "issuing_run_id",
    "call_key",
    "wants_reconcile",
    "settle_reconciliation",
    "reconciled_result",
    "registered_reconciler",
    "recovery_tag",
    "tagged_return",
)

RECONCILER_METADATA_KEY = "candor.reconciler"
"""Tool metadata key whose value is a `Reconciler` (or a plain reconcile function, with the default timeout)."""
RECOVERY_METADATA_KEY = "candor.recovery"
"""Return-part metadata key set by recovery: "reconciled", "rerun" (after `NotDone`) or "replayed" (retry-safe)."""
CALL_KEY_METADATA_KEY = "candor.call_key"
"""Return-part metadata key holding the call key a reconciled return was confirmed under."""
DEFAULT_RECONCILE_TIMEOUT = 10.0
"""Seconds a reconciler may take before its verdict counts as `OutcomeUnknown`."""

_CALL_KEY_PREFIX = "ck_"
_CALL_KEY_DOMAIN = "candor.call_key.v1"


@dataclass(frozen=True, slots=True)
class Reconciled:
    """The call's effect is known to have happened; `result` becomes its return (what the tool would have returned)."""

    result: Any


@dataclass(frozen=True, slots=True)
class NotDone:
    """The call's effect is known not to have happened: the call may run again, once."""


@dataclass(frozen=True, slots=True)
class OutcomeUnknown:
    """The owner of the effect cannot tell: the call keeps the unknown-outcome result."""


Verdict: TypeAlias = Reconciled | NotDone | OutcomeUnknown
FailureKind = Literal["raised", "timed_out", "invalid_verdict", "args_invalid"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ReconcileRequest:
    """What a reconciler is given for one open call."""

    tool_name: str
    tool_call_id: str
    args: dict[str, Any]
    """The call's original arguments, validated against the tool's current schema (as the tool would get them)."""
    key: str
    """The call key: equal to `call_key(ctx)` inside the tool, on its first execution and on any rerun."""
    deps: Any = None
    """The run's `deps`, as tools get them through `ctx.deps` (e.g. the payment client)."""


ReconcileFunction: TypeAlias = Callable[[ReconcileRequest], "Verdict | Awaitable[Verdict]"]


@dataclass(frozen=True, slots=True)
class Reconciler:
    """A reconcile function and how long it may take (seconds; `DEFAULT_RECONCILE_TIMEOUT` by default)."""

    function: ReconcileFunction
    timeout: float = DEFAULT_RECONCILE_TIMEOUT

    def __post_init__(self) -> None:
        if not callable(self.function):
            raise TypeError("a reconciler must be callable")
        if isinstance(self.timeout, bool) or not isinstance(self.timeout, (int, float)) or not self.timeout > 0:
            raise ValueError("a reconciler's timeout must be a positive number of seconds")


# Reconcilers declared with `@reconciler_for(fn)`, by the tool's function (the function is never wrapped).
_REGISTRY: weakref.WeakKeyDictionary[Callable[..., Any], Reconciler] = weakref.WeakKeyDictionary()


def _function_of(tool_or_function: Tool[Any] | Callable[..., Any]) -> Callable[..., Any]:
    if isinstance(tool_or_function, Tool):
        return tool_or_function.function
    if not callable(tool_or_function):
        raise TypeError("reconciler_for() takes the tool (a pydantic_ai.Tool or the tool's function)")
    return tool_or_function


def reconciler_for(
    tool_or_function: Tool[Any] | Callable[..., Any], *, timeout: float = DEFAULT_RECONCILE_TIMEOUT
) -> Callable[[ReconcileFunction], ReconcileFunction]:
    """Decorator: declare the decorated function as the reconciler of `tool_or_function`.

    The declaration is kept by the tool's function, so it applies wherever that function is offered as a tool
    (`Agent(tools=[charge_card])`, `Tool(charge_card, ...)`, a `FunctionToolset`). The decorated function is
    returned unchanged. A reconciler given in the tool's metadata (`with_reconciler`) takes precedence.
    """
    function = _function_of(tool_or_function)

    def register(reconcile: ReconcileFunction) -> ReconcileFunction:
        _REGISTRY[function] = Reconciler(reconcile, timeout)
        return reconcile

    return register


def with_reconciler(
    tool_or_function: Tool[Any] | Callable[..., Any],
    reconcile: ReconcileFunction,
    *,
    timeout: float = DEFAULT_RECONCILE_TIMEOUT,
) -> Tool[Any]:
    """A **new** `Tool` whose metadata is the original's plus `{RECONCILER_METADATA_KEY: Reconciler(...)}`.

    Like `recovery_retryable`, the argument is not modified and the function is not wrapped.
    """
    tool = tool_or_function if isinstance(tool_or_function, Tool) else Tool(tool_or_function)
    copied = copy_tool(tool)
    copied.metadata = {**(tool.metadata or {}), RECONCILER_METADATA_KEY: Reconciler(reconcile, timeout)}
    return copied


def registered_reconciler(tool_def: ToolDefinition | None, function: Callable[..., Any] | None) -> Reconciler | None:
    """The reconciler of a tool: from its prepared metadata first, else declared for its function."""
    if tool_def is not None:
        declared = (tool_def.metadata or {}).get(RECONCILER_METADATA_KEY)
        if isinstance(declared, Reconciler):
            return declared
        if callable(declared):
            return Reconciler(declared)
    if function is None:
        return None
    try:
        return _REGISTRY.get(function)
    except TypeError:  # not weak-referenceable: it cannot have been registered
        return None


# --- the call key ----------------------------------------------------------------------------------------------


def derive_call_key(thread_id: str, issuing_run_id: str | None, tool_call_id: str) -> str:
    """`"ck_"` + SHA-256 hex of the JSON array `["candor.call_key.v1", thread_id, issuing_run_id, tool_call_id]`.

    The issuing run is the run whose `ModelResponse` made the call (its `run_id`, recorded in history); `None` when
    the history does not record it (an imported history), in which case the key rests on thread and call id alone.
    67 characters of `[0-9a-z_]`: fits every idempotency-key header we know of (Stripe allows 255).
    """
    material = json.dumps([_CALL_KEY_DOMAIN, thread_id, issuing_run_id, tool_call_id], separators=(",", ":"))
    return _CALL_KEY_PREFIX + hashlib.sha256(material.encode("utf-8")).hexdigest()


def issuing_run_id(messages: Sequence[ModelMessage], tool_call_id: str) -> str | None:
    """The `run_id` of the latest response that holds a call with this id (`None` when unrecorded or absent)."""
    for message in reversed(messages):
        if isinstance(message, ModelResponse) and any(
            isinstance(part, ToolCallPart) and part.tool_call_id == tool_call_id for part in message.parts
        ):
            return message.run_id
    return None


def call_key(ctx: RunContext[Any]) -> str:
    """The stable key of the call being executed, for an idempotency key: use it inside a tool.

    It is the same on the call's first execution, on a replay or rerun after a crash (in another run, another
    process) and in the key its reconciler gets. Raises `RunError("call_key_unavailable")` outside a tool call.
    """
    tool_call_id = ctx.tool_call_id
    thread_id = ctx.conversation_id
    if not tool_call_id or not thread_id:
        raise RunError("call_key() needs the RunContext of a tool call", code="call_key_unavailable")
    return derive_call_key(thread_id, issuing_run_id(ctx.messages, tool_call_id), tool_call_id)


# --- the pure decision -------------------------------------------------------------------------------------------


def wants_reconcile(decision: RecoveryDecision, tool_def: ToolDefinition | None, mode: ToolRecovery) -> bool:
    """Whether a recovery decision is first put to the tool's reconciler (if it has one).

    Only calls that would otherwise end unknown or run again *unsafely*: the tool is still offered, it is not
    retry-safe (a retry-safe tool simply runs again), the mode is not `"never"` (which runs nothing, reconcilers
    included), and no accepted answer already decides the call.
    """
    return (
        tool_def is not None and mode != "never" and decision.action != "apply_answer" and not is_retry_safe(tool_def)
    )


def reconciled_result(call: ToolCallPart, result: Any, key: str) -> ToolReturnPart:
    """The return recorded for a reconciled call: a normal success for the model; metadata tells your code."""
    return ToolReturnPart(
        tool_name=call.tool_name,
        tool_call_id=call.tool_call_id,
        content=result,
        outcome="success",
        metadata={RECOVERY_METADATA_KEY: "reconciled", CALL_KEY_METADATA_KEY: key},
    )


def settle_reconciliation(
    decision: RecoveryDecision,
    verdict: Verdict | FailureKind,
    *,
    tool_def: ToolDefinition,
    mode: ToolRecovery,
    key: str,
    approved: bool = False,
) -> RecoveryDecision:
    """The final decision for a call its reconciler was asked about (`verdict` is a failure kind when it failed).

    | verdict                     | `"declared"`                          | `"always"`                    |
    |-----------------------------|---------------------------------------|-------------------------------|
    | `Reconciled(r)`             | apply_answer (reconciled return)      | apply_answer                  |
    | `NotDone()`                 | rerun: replay, or suspend (approval / external, H-55, H-56, H-94) | same      |
    | `OutcomeUnknown()`          | unknown_outcome                       | unchanged (runs again)        |
    | raised / timed out / invalid / args invalid | unknown_outcome       | unchanged (runs again)        |
    """
    call = decision.call
    if isinstance(verdict, Reconciled):
        return RecoveryDecision(
            call=call,
            action="apply_answer",
            reason="reconciled",
            answer=(reconciled_result(call, verdict.result, key),),
        )
    if isinstance(verdict, NotDone):
        action, reason = decide_action(tool_def, "always", approved=approved)
        return RecoveryDecision(call=call, action=action, reason="not_done" if action == "replay" else reason)
    if mode == "always":
        return decision  # "always" runs the call again anyway; the reconciler only could have spared it
    reason = "reconcile_unknown" if isinstance(verdict, OutcomeUnknown) else "reconcile_failed"
    return RecoveryDecision(call=call, action="unknown_outcome", reason=reason)


def recovery_tag(decision: RecoveryDecision) -> str | None:
    """The `candor.recovery` value a replayed call's native return gets: "rerun" after `NotDone`, else "replayed"."""
    if decision.action != "replay":
        return None
    return "rerun" if decision.reason == "not_done" else "replayed"


def tagged_return(part: Any, tag: str) -> Any:
    """A copy of a native return with `{RECOVERY_METADATA_KEY: tag}` added to dict (or absent) metadata."""
    if not isinstance(part, ToolReturnPart):
        return part
    if part.metadata is None:
        return dataclasses.replace(part, metadata={RECOVERY_METADATA_KEY: tag})
    if isinstance(part.metadata, Mapping):
        return dataclasses.replace(part, metadata={**part.metadata, RECOVERY_METADATA_KEY: tag})
    return part  # a tool's own non-dict metadata is kept as it is
