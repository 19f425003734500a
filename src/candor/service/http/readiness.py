"""Liveness and readiness (§10.1, S-120, S-121): what `/healthz` and `/readyz` answer, and the state behind them.

`Readiness` is the process's runtime flag set: `started` (startup completed), `draining`, a probe of the background
tasks, and `degraded` extras (for example `"notify"` when the PostgreSQL notification connection is lost). The app
factory's lifespan sets `started` unless a process runner passes its own `Readiness` and sets it itself once its
workers and sweeps are running. The database part of readiness is the schema check, bounded by
`server.readiness_timeout`: `SchemaWatch` runs the full comparison (Alembic's, every table reflected) at most once a
minute, and in between reads only the applied revisions. The full comparison cost about 0.4 s of CPU per probe on a
slow machine and, under load, took longer than the 2 s limit, so a busy process left its load balancer's pool
(docs/operations.md).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from ..commands.health import check_database_schema, database_revisions
from ..core import Service

__all__ = ("Role", "Readiness", "SchemaWatch", "SCHEMA_RECHECK_SECONDS", "probe_readiness")

SCHEMA_RECHECK_SECONDS: Final = 60.0
"""How long a full schema comparison that found the schema current stands, while the revisions stay the same."""

Role = Literal["all", "control", "worker"]

log = logging.getLogger("candor.http")


@dataclass(kw_only=True)
class SchemaWatch:
    """The schema half of `/readyz`: whether the database is this build's, without comparing it at every probe.

    A probe runs the full comparison when none has passed in the last `SCHEMA_RECHECK_SECONDS`. Otherwise it reads
    the applied revisions on the service's own pool, one query: the database answers, and a migration applied since
    (a new revision) sends the probe back to the full comparison. A change that moves no revision (an index
    dropped by hand) is seen within `SCHEMA_RECHECK_SECONDS`.
    """

    clock: Callable[[], float] = time.monotonic
    verified_at: float | None = None
    """When the last full comparison found the schema current (`clock` time); None before one has, or after one
    did not."""
    revisions: tuple[str, ...] = ()
    """The applied revisions that comparison saw."""

    async def is_current(self, service: Service, *, timeout: float) -> bool:
        recent = self.verified_at is not None and self.clock() - self.verified_at < SCHEMA_RECHECK_SECONDS
        if recent and await database_revisions(service) == self.revisions:
            return True
        self.verified_at = None
        status = await check_database_schema(service, timeout=timeout)
        if status.is_current:
            self.verified_at, self.revisions = self.clock(), status.current
        return status.is_current


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
    schema: SchemaWatch = field(default_factory=SchemaWatch)

    def runtime_ready(self) -> bool:
        return self.started and not self.draining and self.tasks_alive()


async def _schema_is_current(watch: SchemaWatch, service: Service) -> bool:
    timeout = service.settings.server.readiness_timeout
    try:
        return await asyncio.wait_for(watch.is_current(service, timeout=timeout), timeout)
    except Exception as exc:  # noqa: BLE001 - any failure of the check makes the database the failed dependency
        # §10.1: probes are not logged at the default level; the 503 body names the dependency.
        log.debug("Readiness check failed", extra={"error": type(exc).__name__})
        return False


async def probe_readiness(readiness: Readiness, service: Service, role: Role) -> tuple[int, dict[str, Any]]:
    """`(status, body)` of `/readyz`: runtime first, then the schema check within `server.readiness_timeout`."""
    if not readiness.runtime_ready():
        return 503, {"status": "unavailable", "dependency": "runtime"}
    if not await _schema_is_current(readiness.schema, service):
        return 503, {"status": "unavailable", "dependency": "database"}
    body: dict[str, Any] = {"status": "ready", "role": role}
    if readiness.degraded:
        body["degraded"] = sorted(readiness.degraded)
    return 200, body
