"""The I/O around `reconcile.settle_reconciliation`: ask each open call's reconciler, before recovery starts.

Runs before any tool or model work of the run (H-58). Every reconciler gets the call's validated arguments and its
call key; all of them are asked at once, each bounded by its own timeout. A reconciler that raises, times out or
answers something other than a verdict counts as "don't know" (the failure is logged, never raised).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError
from pydantic_ai import ToolApproved
from pydantic_ai.messages import ModelMessage, ToolCallPart

from . import _agent_glue as glue
from .deferred import DeferredToolResume
from .history import last_response
from .reconcile import (
    FailureKind,
    NotDone,
    OutcomeUnknown,
    Reconciled,
    Reconciler,
    ReconcileRequest,
    Verdict,
    derive_call_key,
    registered_reconciler,
    settle_reconciliation,
    wants_reconcile,
)
from .recovery import RecoveryDecision, ToolRecovery, plan_recovery

__all__ = ("reconcile_open_calls",)

log = logging.getLogger("candor.harness")
log.addHandler(logging.NullHandler())  # a library: the application decides where warnings go


async def reconcile_open_calls(
    run: Any,
    *,
    history: Sequence[ModelMessage],
    batch: DeferredToolResume | None,
    mode: ToolRecovery,
    thread_id: str,
) -> dict[str, RecoveryDecision]:
    """The settled decisions of the open calls whose reconciler was asked, by `tool_call_id` (empty when none)."""
    if batch is not None and not batch.recovery:
        return {}  # H-74: a fresh batch alone decides; nothing is recovered
    surface = glue.prepared_surface(run)
    accepted = batch.results if batch is not None else None
    plan = plan_recovery(history, surface, mode, accepted=accepted, output_tool_names=glue.output_tool_names(run))
    last = last_response(history)
    issuing_run = last.run_id if last is not None else None
    asked: list[tuple[RecoveryDecision, Reconciler, str]] = []
    for decision in plan.decisions:
        tool_def = surface.get(decision.call.tool_name)
        if not wants_reconcile(decision, tool_def, mode):
            continue
        reconciler = registered_reconciler(tool_def, glue.tool_function(run, decision.call.tool_name))
        if reconciler is not None:
            asked.append((decision, reconciler, derive_call_key(thread_id, issuing_run, decision.call.tool_call_id)))
    if not asked:
        return {}
    deps = run.ctx.deps.user_deps
    verdicts = await asyncio.gather(*(_ask(run, d.call, r, key, deps) for d, r, key in asked))
    settled: dict[str, RecoveryDecision] = {}
    for (decision, _, key), verdict in zip(asked, verdicts, strict=True):
        call = decision.call
        approval = accepted.approvals.get(call.tool_call_id) if accepted is not None else None
        settled[call.tool_call_id] = settle_reconciliation(
            decision,
            verdict,
            tool_def=surface[call.tool_name],
            mode=mode,
            key=key,
            approved=approval is True or isinstance(approval, ToolApproved),
        )
    return settled


async def _ask(run: Any, call: ToolCallPart, reconciler: Reconciler, key: str, deps: Any) -> Verdict | FailureKind:
    context = {"tool_name": call.tool_name, "tool_call_id": call.tool_call_id}
    try:
        args = _validated_args(run, call)
    except (ValidationError, ValueError, AssertionError):
        log.warning("Reconciler not asked: the call's arguments do not fit the tool", extra=context)
        return "args_invalid"
    request = ReconcileRequest(tool_name=call.tool_name, tool_call_id=call.tool_call_id, args=args, key=key, deps=deps)
    try:
        # Not wait_for: on Python 3.11 a cancellation that arrives as the reconciler answers is swallowed, and a
        # run cancelled then would go on (H-105).
        async with asyncio.timeout(reconciler.timeout):
            verdict = await _call(reconciler, request)
    except TimeoutError:
        log.warning("Reconciler timed out", extra={**context, "timeout": reconciler.timeout})
        return "timed_out"
    except Exception as exc:  # noqa: BLE001 - any failure of the reconciler means "don't know"
        log.warning("Reconciler raised", extra={**context, "error_type": type(exc).__name__})
        return "raised"
    if not isinstance(verdict, (Reconciled, NotDone, OutcomeUnknown)):
        log.warning("Reconciler answered something other than a verdict", extra=context)
        return "invalid_verdict"
    return verdict


async def _call(reconciler: Reconciler, request: ReconcileRequest) -> Any:
    function = reconciler.function
    if inspect.iscoroutinefunction(function):
        return await function(request)
    # A blocking function runs in a worker thread so the timeout holds (the thread is abandoned, not killed).
    result = await asyncio.to_thread(function, request)
    return await result if inspect.isawaitable(result) else result


def _validated_args(run: Any, call: ToolCallPart) -> dict[str, Any]:
    raw = call.args_as_dict(raise_if_invalid=True)
    validator = glue.args_validator(run, call.tool_name)
    if validator is None:
        return raw
    validated = validator.validate_python(raw)
    return dict(validated) if isinstance(validated, dict) else raw
