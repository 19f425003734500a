"""Step spans: one per model request and one per tool call of an attempt, as a pydantic-ai capability.

The capability wraps pydantic-ai's own `Instrumentation` capability (`Agent(instrument=...)`,
`Agent.instrument_all()`), so Pydantic AI's "chat …" and "execute_tool …" spans nest under candor's step spans.
Only the OpenTelemetry API is used here; the SDK stays an optional extra.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Final

from opentelemetry.trace import Span, Status, StatusCode, Tracer
from pydantic_ai.capabilities import AbstractCapability, Instrumentation
from pydantic_ai.capabilities.abstract import CapabilityOrdering
from pydantic_ai.exceptions import ApprovalRequired, CallDeferred

from .context import TraceParent, recording_traceparent

__all__ = ("StepSpans", "MODEL_REQUEST_SPAN", "TOOL_CALL_SPAN", "traceparent_of")

MODEL_REQUEST_SPAN: Final = "candor.step model_request"
TOOL_CALL_SPAN: Final = "candor.step tool_call"


def traceparent_of(span: Span) -> TraceParent | None:
    """The `traceparent` that names `span` as the parent (None for a span that records nothing)."""
    context = span.get_span_context()
    if not context.is_valid:
        return None
    return TraceParent(
        trace_id=f"{context.trace_id:032x}", span_id=f"{context.span_id:016x}", sampled=context.trace_flags.sampled
    )


@dataclass
class StepSpans(AbstractCapability[Any]):
    """A span around every model request and tool call of one attempt, carrying the attempt's attributes."""

    tracer: Tracer
    attributes: Mapping[str, Any] = field(default_factory=dict)
    """The attempt's ids (run, thread, attempt, agent), repeated on each step so a step alone says where it ran."""

    def get_ordering(self) -> CapabilityOrdering:
        return CapabilityOrdering(position="outermost", wraps=[Instrumentation])

    async def wrap_model_request(self, ctx: Any, *, request_context: Any, handler: Any) -> Any:
        model = getattr(request_context, "model", None) or getattr(ctx, "model", None)
        attributes = {
            "candor.step.kind": "model_request",
            "candor.step.number": ctx.run_step,
            "candor.model": getattr(model, "model_name", None) or type(model).__name__,
        }
        with self._span(MODEL_REQUEST_SPAN, attributes):
            return await handler(request_context)

    async def wrap_tool_execute(self, ctx: Any, *, call: Any, tool_def: Any, args: Any, handler: Any) -> Any:
        attributes = {
            "candor.step.kind": "tool_call",
            "candor.step.number": ctx.run_step,
            "candor.tool.name": call.tool_name,
            "candor.tool_call.id": call.tool_call_id,
        }
        with self._span(TOOL_CALL_SPAN, attributes) as span, recording_traceparent(traceparent_of(span)):
            return await handler(args)  # a child run the tool starts records this span as its parent

    @contextmanager
    def _span(self, name: str, attributes: Mapping[str, Any]) -> Iterator[Span]:
        merged = {**self.attributes, **{key: value for key, value in attributes.items() if value is not None}}
        with self.tracer.start_as_current_span(
            name, attributes=merged, record_exception=False, set_status_on_exception=False
        ) as span:
            try:
                yield span
            except (CallDeferred, ApprovalRequired) as deferral:
                # Control flow, not a failure: the call waits for a person or a client (§5.7).
                kind = "approval" if isinstance(deferral, ApprovalRequired) else "deferred"
                span.set_attribute("candor.tool.deferred", kind)
                raise
            except Exception as error:
                span.record_exception(error)
                span.set_status(Status(StatusCode.ERROR, type(error).__name__))
                raise
