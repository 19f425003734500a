"""OpenTelemetry traces of runs (docs/telemetry.md): spans run → attempt → step, off unless `[telemetry]` is on.

`context` is pure (W3C trace context, the run span's ids); `attempts` decides what goes on the spans and holds the
worker's hooks; `steps` is the pydantic-ai capability around model requests and tool calls; `sdk` (the optional
`telemetry` extra) builds the tracer provider; `tracing.Telemetry` ties them together for a process.
"""

from __future__ import annotations

from .attempts import AttemptTrace
from .context import parse_traceparent, recorded_traceparent, recording_traceparent
from .tracing import Telemetry

__all__ = ("AttemptTrace", "Telemetry", "parse_traceparent", "recorded_traceparent", "recording_traceparent")
