"""`/healthz`, `/readyz`, `/metrics` (§10.1, §10.4): served by every role, without authentication."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

from ..dependencies import service_of
from ..readiness import probe_readiness

__all__ = ("router",)

router = APIRouter(tags=["operations"])


@router.get("/healthz", summary="Liveness")
async def healthz(request: Request) -> dict[str, Any]:
    """S-120: 200 whenever the process serves HTTP."""
    return {"status": "ok", "role": request.app.state.role}


@router.get(
    "/readyz",
    summary="Readiness",
    responses={503: {"description": '`{"status": "unavailable", "dependency": "runtime" | "database"}`'}},
)
async def readyz(request: Request) -> JSONResponse:
    """S-121: 503 `runtime` until startup completes (and while draining); 503 `database` when the schema check
    fails or exceeds `server.readiness_timeout`; otherwise 200."""
    status, body = await probe_readiness(request.app.state.readiness, service_of(request), request.app.state.role)
    return JSONResponse(body, status_code=status)


@router.get("/metrics", summary="Prometheus metrics", response_class=Response)
async def metrics() -> Response:
    return Response(generate_latest(REGISTRY), media_type=CONTENT_TYPE_LATEST)
