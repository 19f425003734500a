"""Liveness and readiness (§10.1, S-120, S-121): what `/healthz` and `/readyz` answer, and the state behind them.

`Readiness` is the process's runtime flag set: `started` (startup completed), `draining`, a probe of the background
tasks, and `degraded` extras (for example `"notify"` when the PostgreSQL notification connection is lost). The app
factory's lifespan sets `started` unless a process runner passes its own `Readiness` and sets it itself once its
workers and sweeps are running. The database part of readiness is the schema check, bounded by
`server.readiness_timeout`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from ..commands.health import check_database_schema
from ..core import Service

__all__ = ("Role", "Readiness", "probe_readiness")

Role = Literal["all", "control", "worker"]

log = logging.getLogger("candor.http")


@dataclass(kw_only=True)
class Readiness:
    """The runtime half of `/readyz`."""

    started: bool = False
    """Startup completed (set by the lifespan, or by the process runner that owns this value)."""
    draining: bool = False
    """The process is stopping: it answers 503 so load balancers move traffic away (S-52)."""
    tasks_alive: Callable[[], bool] = lambda: True
    """Whether every background task (worker loop, supervisor, sweeps) is still running."""
    degraded: set[str] = field(default_factory=set)
    """Dependencies that are lost without making the process unready (`"notify"`, S-121)."""

    def runtime_ready(self) -> bool:
        return self.started and not self.draining and self.tasks_alive()


async def _schema_is_current(service: Service) -> bool:
    timeout = service.settings.server.readiness_timeout
    try:
        status = await asyncio.wait_for(check_database_schema(service, timeout=timeout), timeout)
    except Exception as exc:  # noqa: BLE001 - any failure of the check makes the database the failed dependency
        # §10.1: probes are not logged at the default level; the 503 body names the dependency.
        log.debug("Readiness check failed", extra={"error": type(exc).__name__})
        return False
    return status.is_current


async def probe_readiness(readiness: Readiness, service: Service, role: Role) -> tuple[int, dict[str, Any]]:
    """`(status, body)` of `/readyz`: runtime first, then the schema check within `server.readiness_timeout`."""
    if not readiness.runtime_ready():
        return 503, {"status": "unavailable", "dependency": "runtime"}
    if not await _schema_is_current(service):
        return 503, {"status": "unavailable", "dependency": "database"}
    body: dict[str, Any] = {"status": "ready", "role": role}
    if readiness.degraded:
        body["degraded"] = sorted(readiness.degraded)
    return 200, body
