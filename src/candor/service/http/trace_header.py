"""The `traceparent` header of a request, recorded by the runs the request creates (docs/telemetry.md).

Installed only when `[telemetry]` is on, so a process that traces nothing spends nothing per request. An invalid
header is ignored, as W3C Trace Context asks: it never fails a request.
"""

from __future__ import annotations

from typing import Any

from ..telemetry.context import RECORDED_TRACEPARENT, parse_traceparent

__all__ = ("TraceHeaderMiddleware", "TRACEPARENT_HEADER")

TRACEPARENT_HEADER = b"traceparent"


class TraceHeaderMiddleware:
    """Pure ASGI: within the request, new runs record its valid `traceparent` (and nothing without one)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        value = next((raw for name, raw in scope["headers"] if name == TRACEPARENT_HEADER), None)
        parent = parse_traceparent(value.decode("latin-1")) if value is not None else None
        token = RECORDED_TRACEPARENT.set(parent.header() if parent is not None else None)
        try:
            await self.app(scope, receive, send)
        finally:
            RECORDED_TRACEPARENT.reset(token)
