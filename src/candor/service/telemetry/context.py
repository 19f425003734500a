"""Trace context (pure): W3C `traceparent` values, the ids of a run's span, and the context a new run records.

Every attempt of a run lands in one trace under one run span whose ids are derived, not remembered: the trace is
the creating request's `traceparent` trace (else derived from the run id) and the run span's id is derived from the
run id, so any worker can parent an attempt on it and the sealing worker exports it. The request's `traceparent`
reaches the store through the `RECORDED_TRACEPARENT` context variable: every run a request creates records it; a
run an attempt creates (a child, the thread's next run) records the attempt's span instead.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass

__all__ = (
    "TraceParent",
    "parse_traceparent",
    "RECORDED_TRACEPARENT",
    "recorded_traceparent",
    "recording_traceparent",
    "RunSpanIds",
    "run_span_ids",
)

_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$")
_INVALID_TRACE_ID = "0" * 32
_INVALID_SPAN_ID = "0" * 16


@dataclass(frozen=True, slots=True)
class TraceParent:
    """A valid W3C trace context parent: trace id (32 hex), parent span id (16 hex) and the sampled flag."""

    trace_id: str
    span_id: str
    sampled: bool

    def header(self) -> str:
        """The version-00 `traceparent` value, the form stored with the run."""
        return f"00-{self.trace_id}-{self.span_id}-{'01' if self.sampled else '00'}"


def parse_traceparent(value: str | None) -> TraceParent | None:
    """A `traceparent` header value → `TraceParent`, or None when absent or invalid (W3C Trace Context §3.2: an
    invalid value is ignored, never an error; version `ff` and all-zero ids are invalid; a version 00 value has
    nothing after the flags; a later version may carry more fields, which are ignored)."""
    if value is None:
        return None
    match = _TRACEPARENT.fullmatch(value.strip().lower())
    if match is None:
        return None
    version, trace_id, span_id, flags, rest = match.groups()
    if version == "ff" or (version == "00" and rest) or trace_id == _INVALID_TRACE_ID or span_id == _INVALID_SPAN_ID:
        return None
    return TraceParent(trace_id=trace_id, span_id=span_id, sampled=bool(int(flags, 16) & 1))


RECORDED_TRACEPARENT: ContextVar[str | None] = ContextVar("candor_recorded_traceparent", default=None)
"""The `traceparent` a run created in this context records (`runs.trace_context`); None records nothing."""


def recorded_traceparent() -> str | None:
    """What a run inserted now records as its trace context."""
    return RECORDED_TRACEPARENT.get()


@contextlib.contextmanager
def recording_traceparent(parent: TraceParent | None) -> Iterator[None]:
    """Within the block, new runs record `parent` (None: nothing)."""
    token = RECORDED_TRACEPARENT.set(parent.header() if parent is not None else None)
    try:
        yield
    finally:
        RECORDED_TRACEPARENT.reset(token)


@dataclass(frozen=True, slots=True)
class RunSpanIds:
    """Where a run's spans go: its trace, the run span's own id, and the span the run span hangs under (the
    request's span, from the recorded `traceparent`; None for a run span that is its trace's root)."""

    trace_id: int
    span_id: int
    parent: TraceParent | None

    def run_span(self) -> TraceParent:
        """The run span as the parent of its attempts (sampled as the request was, and always without one)."""
        sampled = self.parent.sampled if self.parent is not None else True
        return TraceParent(trace_id=f"{self.trace_id:032x}", span_id=f"{self.span_id:016x}", sampled=sampled)


def run_span_ids(run_id: str, recorded: str | None) -> RunSpanIds:
    """The ids of `run_id`'s run span, the same in every process: the recorded trace context's trace (else one
    derived from the run id) and a span id derived from the run id (never zero, as W3C requires)."""
    digest = hashlib.sha256(f"candor.run:{run_id}".encode()).digest()
    parent = parse_traceparent(recorded)
    trace_id = int(parent.trace_id, 16) if parent is not None else int.from_bytes(digest[:16]) or 1
    span_id = int.from_bytes(digest[16:24]) or 1
    return RunSpanIds(trace_id=trace_id, span_id=span_id, parent=parent)
