"""`Telemetry`: the process's tracer, or nothing when `[telemetry]` is off (the default)."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Status, StatusCode

from ..errors import SettingsError
from .attempts import AttemptTrace, ClaimedAttempt, TracedAttempt, parent_context
from .context import RunSpanIds

__all__ = ("Telemetry", "TRACER_NAME")

TRACER_NAME = "candor"
log = logging.getLogger("candor.telemetry")


class Telemetry:
    """Builds each attempt's `AttemptTrace`. `Telemetry()` traces nothing; `Telemetry(provider)` traces into a
    provider made by `sdk.build_provider` (its id generator places run spans)."""

    def __init__(self, provider: Any = None) -> None:
        self.provider = provider
        self._tracer = provider.get_tracer(TRACER_NAME) if provider is not None else None
        if provider is not None:
            from .sdk import RunSpanIdGenerator

            if not isinstance(provider.id_generator, RunSpanIdGenerator):
                raise ValueError("the tracer provider must use candor's RunSpanIdGenerator (sdk.build_provider)")

    @classmethod
    def from_settings(cls, settings: Any) -> Telemetry:
        """`[telemetry]` (`settings_sections.TelemetrySettings`): off → `Telemetry()`; on → spans to OTLP/HTTP,
        and the provider installed as OpenTelemetry's global one, so that Pydantic AI's instrumentation
        (`Agent(instrument=True)`, `Agent.instrument_all()`) exports through it too."""
        if not settings.enabled:
            return cls()
        try:
            from .sdk import otlp_provider
        except ImportError as exc:  # the optional extra is not installed: a settings problem, said in one line
            raise SettingsError(
                "telemetry.enabled needs the OpenTelemetry SDK and OTLP exporter: pip install 'candor[telemetry]'"
            ) from exc

        provider = otlp_provider(service_name=settings.service_name)
        trace.set_tracer_provider(provider)
        log.info("Tracing on", extra={"service_name": settings.service_name})
        return cls(provider)

    @property
    def enabled(self) -> bool:
        return self._tracer is not None

    def attempt(self, claimed: ClaimedAttempt) -> AttemptTrace:
        """The tracing of the attempt `claimed` (`store.runs.ClaimedRun`)."""
        if self._tracer is None:
            return _OFF
        return TracedAttempt(self._tracer, claimed, emit_run_span=self._emit_run_span)

    def _emit_run_span(
        self, ids: RunSpanIds, name: str, started_at: float, attributes: Mapping[str, Any], error: str | None
    ) -> None:
        """The run span, from the run's acceptance until now, with the ids its attempts were parented on."""
        from .sdk import RunSpanIdGenerator

        assert self._tracer is not None
        with RunSpanIdGenerator.chosen(ids.trace_id, ids.span_id):
            span = self._tracer.start_span(
                name, context=parent_context(ids.parent), attributes=attributes, start_time=int(started_at * 1e9)
            )
        if error is not None:
            span.set_status(Status(StatusCode.ERROR, error))
        span.end(end_time=max(time.time_ns(), int(started_at * 1e9)))

    def shutdown(self) -> None:
        """Export what is still batched (bounded by the exporter's timeout), then stop."""
        if self.provider is not None:
            self.provider.shutdown()


_OFF = AttemptTrace()
