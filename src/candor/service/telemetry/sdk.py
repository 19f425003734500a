"""The OpenTelemetry SDK side (the optional `telemetry` extra): the tracer provider and its id generator.

Imported only when telemetry is on, so a process without the extra never needs the SDK.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator

__all__ = ("RunSpanIdGenerator", "build_provider", "otlp_provider")

_CHOSEN_IDS: ContextVar[tuple[int, int] | None] = ContextVar("candor_chosen_span_ids", default=None)


class RunSpanIdGenerator(IdGenerator):
    """Random ids, except inside `chosen()`: a run span is exported with the ids every process derives for it
    (`context.run_span_ids`), so the attempts exported earlier, elsewhere, are its children."""

    def __init__(self) -> None:
        self._random = RandomIdGenerator()

    def generate_span_id(self) -> int:
        chosen = _CHOSEN_IDS.get()
        return chosen[1] if chosen is not None else self._random.generate_span_id()

    def generate_trace_id(self) -> int:
        chosen = _CHOSEN_IDS.get()
        return chosen[0] if chosen is not None else self._random.generate_trace_id()

    @staticmethod
    @contextlib.contextmanager
    def chosen(trace_id: int, span_id: int) -> Iterator[None]:
        """The next span started in the block gets `span_id` (and `trace_id`, when it has no parent)."""
        token = _CHOSEN_IDS.set((trace_id, span_id))
        try:
            yield
        finally:
            _CHOSEN_IDS.reset(token)


def build_provider(processor: SpanProcessor, *, service_name: str = "candor") -> TracerProvider:
    """A tracer provider for candor: `service.name` set (the standard `OTEL_RESOURCE_ATTRIBUTES` add to it), the
    run-span id generator, and `processor` (a batch processor with the OTLP exporter in production, a simple one
    with the in-memory exporter in tests)."""
    resource = Resource.create({"service.name": service_name})
    provider = TracerProvider(resource=resource, id_generator=RunSpanIdGenerator())
    provider.add_span_processor(processor)
    return provider


def otlp_provider(*, service_name: str) -> TracerProvider:
    """The production provider: spans batched to the OTLP/HTTP exporter, which reads the standard
    `OTEL_EXPORTER_OTLP_*` variables (endpoint, headers, timeout, compression, certificates)."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return build_provider(BatchSpanProcessor(OTLPSpanExporter()), service_name=service_name)
