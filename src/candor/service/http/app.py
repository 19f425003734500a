"""The HTTP app factory: routers per role, lifespan, request ids, the body limit and the error handlers (§8.1).

`create_app(service, role=...)` builds the app a process serves. `control` and `all` serve the `/v1` API (with its
OpenAPI schema at `/v1/openapi.json` and docs at `/v1/docs`); `worker` serves only `/healthz`, `/readyz` and
`/metrics`, so any `/v1` path answers 404 there (S-100). `create_app` lists the middlewares every request passes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import APIRouter, FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..core import Service
from ..errors import ServiceError
from ..metrics import HTTP_REQUEST_DURATION
from ..runtime import Entropy
from .edge import EdgeCheckMiddleware
from .errors import (
    PayloadTooLarge,
    error_response,
    handle_http_exception,
    handle_service_error,
    handle_validation_error,
    internal_error_response,
)
from .openapi import OPENAPI_URL, mount_docs, operation_id, shape_openapi
from .readiness import Readiness, Role
from .routes import console, inbox, inspection, keys, ops, run_lists, runs, subscriptions, threads
from .trace_header import TraceHeaderMiddleware

__all__ = (
    "create_app",
    "API_ROUTERS",
    "RequestIdMiddleware",
    "RequestMetricsMiddleware",
    "BodyLimitMiddleware",
    "REQUEST_ID_HEADER",
)

log = logging.getLogger("candor.http")

REQUEST_ID_HEADER = "x-request-id"
_ROLES = ("all", "control", "worker")
PROBE_ROUTES = frozenset({"/healthz", "/readyz", "/metrics"})
"""Routes that orchestrators and scrapers poll: timed like every route, never logged (§10.1)."""

API_ROUTERS: tuple[APIRouter, ...] = (
    runs.router,
    threads.router,
    inbox.router,
    run_lists.router,
    subscriptions.router,
    keys.router,
    inspection.router,
    console.router,
)
"""The `/v1` routers, busiest first: a request is matched against the routes in this order, and FastAPI's match
costs CPU for every route tried before the one that fits. No two routes accept the same method and path
(tests/unit/http/test_http_routing.py), so the order changes only the cost, never which route answers."""


def create_app(service: Service, *, role: Role, readiness: Readiness | None = None) -> FastAPI:
    """The ASGI app of one process.

    With `readiness=None` the app owns its readiness: the lifespan marks startup complete and, at shutdown,
    draining. A process runner that starts workers and sweeps passes its own `Readiness` and sets `started` itself.

    Pure ASGI middlewares wrap every request, outermost first:

    * `RequestIdMiddleware` gives every response `X-Request-Id: req_<32 hex>`, generated here (a caller's value is
      ignored, S-95), stores it in the scope for error bodies, and turns an unexpected exception into 500 `internal`;
    * `RequestMetricsMiddleware` observes `candor_http_request_duration_seconds{method, route, status}`, labelled
      with the route's template (`/v1/runs/{run_id}`), never the raw path, so ids do not explode the label set, and
      logs one `HTTP request` line (request id, method, route template, status, duration) on `candor.http`, except for
      the probes (`/healthz`, `/readyz`, `/metrics`: §10.1);
    * `BodyLimitMiddleware` reads the body up front and answers 413 `payload_too_large` beyond
      `server.max_request_bytes`, before anything parses it;
    * `EdgeCheckMiddleware` (edge.py) refuses, for every `/v1` route, what no route could store: a non-JSON
      `Content-Type` (415), NUL or lone surrogates, nesting beyond 64, non-finite numbers, duplicated headers (400).
    """
    if role not in _ROLES:
        raise ValueError(f"role must be one of {', '.join(_ROLES)}")
    serves_api = role != "worker"
    owned = readiness is None
    state = Readiness() if readiness is None else readiness

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if owned:
            state.started = True
        try:
            yield
        finally:
            if owned:
                state.draining = True
                await state.schema.close()

    app = FastAPI(
        title="candor",
        summary="A durable runtime for LLM agents.",
        version="1",
        openapi_url=OPENAPI_URL if serves_api else None,
        docs_url=None,
        redoc_url=None,
        redirect_slashes=False,
        strict_content_type=False,
        lifespan=lifespan,
        generate_unique_id_function=operation_id,
    )
    app.state.service = service
    app.state.role = role
    app.state.readiness = state
    for router in API_ROUTERS if serves_api else ():
        app.include_router(router)
    app.include_router(ops.router)
    if serves_api:
        shape_openapi(app)
        mount_docs(app)
    app.add_exception_handler(ServiceError, handle_service_error)
    app.add_exception_handler(RequestValidationError, handle_validation_error)
    app.add_exception_handler(HTTPException, handle_http_exception)
    # add_middleware puts the last one outermost: the request id wraps everything, the body limit included; the
    # edge checks read the body the limit buffered.
    app.add_middleware(EdgeCheckMiddleware)
    app.add_middleware(BodyLimitMiddleware, max_bytes=service.settings.server.max_request_bytes)
    app.add_middleware(RequestMetricsMiddleware)
    if service.settings.telemetry.enabled or service.telemetry.enabled:
        app.add_middleware(TraceHeaderMiddleware)  # docs/telemetry.md: runs record the request's traceparent
    app.add_middleware(RequestIdMiddleware, entropy=service.entropy)
    return app


class RequestIdMiddleware:
    """S-95: a server-generated `X-Request-Id` on every response; unexpected errors → 500 `internal` with it."""

    def __init__(self, app: ASGIApp, *, entropy: Entropy) -> None:
        self.app = app
        self.entropy = entropy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = f"req_{self.entropy.token_bytes(16).hex()}"
        scope.setdefault("state", {})["request_id"] = request_id
        started = False

        async def send_with_id(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != REQUEST_ID_HEADER.encode()]
                headers.append((REQUEST_ID_HEADER.encode(), request_id.encode()))
                message = {**message, "headers": headers}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except Exception:
            log.exception("Request failed", extra={"request_id": request_id})
            if started:
                raise
            await internal_error_response(request_id)(scope, receive, send_with_id)


class RequestMetricsMiddleware:
    """Times every HTTP request to its last response byte (a stream is observed when it closes)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def send_with_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_with_status)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", None) or "unmatched"
            duration = time.perf_counter() - started
            HTTP_REQUEST_DURATION.labels(scope["method"], template, str(status)).observe(duration)
            if template not in PROBE_ROUTES and log.isEnabledFor(logging.INFO):
                request_id = (scope.get("state") or {}).get("request_id")
                fields = {
                    "request_id": request_id,
                    "method": scope["method"],
                    "route": template,
                    "status": status,
                    "duration_ms": round(duration * 1000, 1),
                }
                log.info("HTTP request", extra=fields)


class BodyLimitMiddleware:
    """Reads the request body (at most `max_bytes`) before the app sees it; beyond that → 413."""

    def __init__(self, app: ASGIApp, *, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            await self._refuse(scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away before sending its body
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await self._refuse(scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        buffered: list[Message] = [{"type": "http.request", "body": b"".join(chunks), "more_body": False}]

        async def replay() -> Message:
            # The body once, then the real channel (a streaming response waits on it for the disconnect).
            return buffered.pop() if buffered else await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        error = PayloadTooLarge(self.max_bytes)
        request_id = (scope.get("state") or {}).get("request_id")
        response = error_response(request_id, error.code, error.message, error.details, headers={"Connection": "close"})
        await response(scope, receive, send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None
