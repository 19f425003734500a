"""An attempt's spans: the attempt span around everything it does, its step spans, and the run span once it seals.

`AttemptTrace` is what the worker calls (`worker/attempt.py`), in four places: `active()` around the attempt,
`capabilities` for the harness, `decided()` with the seal decision, `ended()` with how the attempt ended. With
telemetry off it is `AttemptTrace()` itself, which does nothing. What goes on the spans is decided by the pure
functions at the top of this module.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, Span, SpanContext, Status, StatusCode, TraceFlags, Tracer
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.messages import ModelMessagesTypeAdapter

from candor import RunStream

from ..protocol.fencing import Lease
from ..protocol.outcomes import RecoveryDecision, Seal, SealAfterRecovery, SealDecision
from ..protocol.recovered import RecoveredCall, recovered_calls
from .context import RunSpanIds, TraceParent, recording_traceparent, run_span_ids
from .steps import StepSpans, traceparent_of

__all__ = (
    "ATTEMPT_SPAN",
    "RUN_SPAN",
    "RECOVERY_EVENT",
    "ClaimedAttempt",
    "AttemptEnd",
    "attempt_attributes",
    "attempt_end",
    "recovery_event_attributes",
    "AttemptTrace",
    "TracedAttempt",
    "RunSpanEmitter",
)

ATTEMPT_SPAN: Final = "candor.attempt"
RUN_SPAN: Final = "candor.run"
RECOVERY_EVENT: Final = "candor.recovery"
_SEALED: Final = frozenset({"completed", "waiting", "failed", "cancelled"})
_ERRORS: Final = frozenset({"failed", "crashed", "abandoned"})
_NOT_CODES: Final = frozenset({"sealed", "handoff"})


class ClaimedAttempt(Protocol):
    """What the spans read of a claimed attempt (`store.runs.ClaimedRun`)."""

    @property
    def lease(self) -> Lease: ...
    @property
    def start_reason(self) -> str: ...
    @property
    def agent(self) -> str: ...
    @property
    def workspace_id(self) -> str: ...
    @property
    def trigger(self) -> str: ...
    @property
    def tool_recovery(self) -> str: ...
    @property
    def trace_context(self) -> str | None: ...
    @property
    def created_at(self) -> float: ...


def attempt_attributes(claimed: ClaimedAttempt) -> dict[str, Any]:
    """The ids and settings of a claimed attempt, as span attributes."""
    lease = claimed.lease
    return {
        "candor.run.id": lease.run_id,
        "candor.thread.id": lease.thread_id,
        "candor.attempt.id": lease.attempt_id,
        "candor.attempt.number": lease.attempt_number,
        "candor.attempt.start_reason": claimed.start_reason,
        "candor.agent": claimed.agent,
        "candor.workspace.id": claimed.workspace_id,
        "candor.run.trigger": claimed.trigger,
        "candor.run.tool_recovery": claimed.tool_recovery,
    }


@dataclass(frozen=True, slots=True)
class AttemptEnd:
    """What the end of an attempt puts on its span, and whether (and how) the run sealed with it."""

    attributes: dict[str, Any]
    error: str | None
    """The span's ERROR description (the failure code or the reason), None when the attempt did not fail."""
    sealed_status: str | None
    """The run's status when this attempt sealed it; None when the run goes on (retry, handoff) or nothing was
    written (lease lost, crash)."""
    failure_code: str | None
    """The attempt's failure code."""
    run_failure_code: str | None
    """The failure code of the run this attempt sealed failed or cancelled."""


def attempt_end(status: str, reason: str, *, decision: SealDecision | RecoveryDecision | None = None) -> AttemptEnd:
    """`status`/`reason` as the worker logs them ("Attempt ended"): a sealed run's status and `sealed` or its failure
    code; `yielded`/`failed` and `handoff` or a failure code for a recovered attempt; `abandoned` or `crashed` with
    why. `decision` is the last settling decision the attempt reached: a `Seal` seals the run only if the attempt got
    to write it (it did not end abandoned or crashed); a `SealAfterRecovery` was written when it is known (§7.6: the
    run failed after its last attempt, or was cancelled)."""
    code = None if reason in _NOT_CODES or status not in ("failed", "cancelled") else reason
    attributes: dict[str, Any] = {"candor.attempt.status": status, "candor.attempt.reason": reason}
    if code is not None:
        attributes["candor.failure.code"] = code
    error = (code or reason) if status in _ERRORS else None
    sealed: str | None = None
    run_code: str | None = None
    if isinstance(decision, SealAfterRecovery):
        sealed, run_code = decision.status, decision.failure_code
    elif isinstance(decision, Seal) and status in _SEALED:
        sealed, run_code = status, code
    return AttemptEnd(
        attributes=attributes, error=error, sealed_status=sealed, failure_code=code, run_failure_code=run_code
    )


def recovery_event_attributes(calls: Sequence[RecoveredCall]) -> list[dict[str, Any]]:
    """One `candor.recovery` event per call recovery closed: which call, and replayed / reconciled / rerun / unknown."""
    return [
        {
            "candor.tool_call.id": call.tool_call_id,
            "candor.tool.name": call.tool_name,
            "candor.recovery.outcome": call.outcome,
        }
        for call in calls
    ]


def _recovered_by(stream: RunStream[object] | None) -> list[RecoveredCall]:
    """The calls this attempt's recovery closed: read from the messages its run result added (none without one)."""
    result = stream.outcome if stream is not None else None
    if result is None:
        return []
    added = ModelMessagesTypeAdapter.dump_python(result.new_messages(), mode="json")
    return recovered_calls(added)


class AttemptTrace:
    """Tracing of one attempt; this base class traces nothing (telemetry off)."""

    capabilities: tuple[AbstractCapability[Any], ...] = ()
    """Handed to the harness with the run's bindings."""

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        yield

    def decided(self, decision: SealDecision | RecoveryDecision | None) -> None:
        """The attempt's seal decision (`protocol.outcomes.SealDecision`) before it is written, then, for a
        recovery, the `RecoveryDecision` once written."""

    def ended(self, status: str, reason: str, stream: RunStream[object] | None) -> None:
        """How the attempt ended (as logged), and its harness stream (None when it never started)."""


RunSpanEmitter = Callable[[RunSpanIds, str, float, Mapping[str, Any], str | None], None]
"""Exports a run span with the given ids: `(ids, name, start_epoch_seconds, attributes, error)`."""


class TracedAttempt(AttemptTrace):
    """The attempt span (a child of the run span, whose ids every process derives alike), the step spans under it,
    and the run span when this attempt seals the run."""

    def __init__(self, tracer: Tracer, claimed: ClaimedAttempt, *, emit_run_span: RunSpanEmitter) -> None:
        self._tracer = tracer
        self._claimed = claimed
        self._emit_run_span = emit_run_span
        self._attributes = attempt_attributes(claimed)
        self._ids = run_span_ids(claimed.lease.run_id, claimed.trace_context)
        self._span: Span | None = None
        self._decision: SealDecision | RecoveryDecision | None = None
        self.capabilities = (StepSpans(tracer, self._attributes),)

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        parent = parent_context(self._ids.run_span())
        span = self._span = self._tracer.start_span(ATTEMPT_SPAN, context=parent, attributes=self._attributes)
        token = otel_context.attach(trace.set_span_in_context(span))
        try:
            with recording_traceparent(traceparent_of(span)):  # the runs this attempt starts record it
                yield
        finally:
            otel_context.detach(token)
            if span.is_recording():  # ended() was not reached (a cancelled task): end it anyway
                span.set_status(Status(StatusCode.ERROR, "not_ended"))
                span.end()

    def decided(self, decision: SealDecision | RecoveryDecision | None) -> None:
        self._decision = decision

    def ended(self, status: str, reason: str, stream: RunStream[object] | None) -> None:
        if self._span is None:
            return
        end = attempt_end(status, reason, decision=self._decision)
        span = self._span
        span.set_attributes(end.attributes)
        if span.is_recording():
            for event in recovery_event_attributes(_recovered_by(stream)):
                span.add_event(RECOVERY_EVENT, event)
        if end.error is not None:
            span.set_status(Status(StatusCode.ERROR, end.error))
        span.end()
        if end.sealed_status is not None:
            attributes = {
                key: value for key, value in self._attributes.items() if not key.startswith("candor.attempt.")
            } | {"candor.run.status": end.sealed_status, "candor.run.attempts": self._claimed.lease.attempt_number}
            if end.run_failure_code is not None:
                attributes["candor.failure.code"] = end.run_failure_code
            error = end.run_failure_code if end.sealed_status == "failed" else None
            self._emit_run_span(self._ids, RUN_SPAN, self._claimed.created_at, attributes, error)


def parent_context(parent: TraceParent | None) -> otel_context.Context:
    """The OpenTelemetry context whose current span is `parent` (a remote span), or an empty one (a root span)."""
    if parent is None:
        return otel_context.Context()
    flags = TraceFlags(TraceFlags.SAMPLED if parent.sampled else TraceFlags.DEFAULT)
    remote = SpanContext(
        trace_id=int(parent.trace_id, 16), span_id=int(parent.span_id, 16), is_remote=True, trace_flags=flags
    )
    return trace.set_span_in_context(NonRecordingSpan(remote))
