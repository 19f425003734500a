"""Liveness and readiness (§10.1, S-120, S-121): what `/healthz` and `/readyz` answer, and the state behind them.

`Readiness` is the process's runtime flag set: `started` (startup completed), `draining`, a probe of the background
tasks, and `degraded` extras (for example `"notify"` when the PostgreSQL notification connection is lost). The app
factory's lifespan sets `started` unless a process runner passes its own `Readiness` and sets it itself once its
workers and sweeps are running. The database part of readiness is the schema check, bounded by
`server.readiness_timeout`: `SchemaWatch` keeps the verdict of the last full comparison (Alembic's, every table
reflected; `candor serve` hands it the startup check's) and at each probe reads only the applied revisions.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from ..commands.health import SchemaStatus, check_database_schema, database_revisions
from ..core import Service

__all__ = ("Role", "Readiness", "SchemaWatch", "SCHEMA_RECHECK_SECONDS", "probe_readiness")

SCHEMA_RECHECK_SECONDS: Final = 60.0
"""How long a full comparison's verdict stands before a probe starts another in the background."""

Role = Literal["all", "control", "worker"]

log = logging.getLogger("candor.http")


@dataclass(kw_only=True)
class SchemaWatch:
    """The schema half of `/readyz`: whether the database is this build's, without comparing it at every probe.

    After a full comparison found the schema current, a probe reads the applied revisions on the service's own
    pool, one query: the database answers, and a migration applied since (another revision) sends the probe back to
    the full comparison, whose verdict it waits for. When the verdict is older than `SCHEMA_RECHECK_SECONDS` and the
    revisions are the same, the probe answers from it and starts a fresh comparison in the background, so a change
    that moves no revision (an index dropped by hand) turns probes to 503 once that comparison finishes.

    The full comparison never runs inside a probe's time limit: on a loaded machine it can take longer than the
    limit, and a probe that cancelled it would leave every later probe to start it again and answer 503 for ever.
    One comparison runs at a time, as its own task, bounded by `database.timeout`; probes that need its verdict wait
    for it within their limit without cancelling it, and the next probe finds its verdict.
    """

    clock: Callable[[], float] = time.monotonic
    verified_at: float | None = None
    """When the last full comparison found the schema current (`clock` time); None before one has, or after one
    did not or failed."""
    revisions: tuple[str, ...] = ()
    """The applied revisions that comparison saw."""
    _comparison: asyncio.Task[SchemaStatus] | None = field(default=None, init=False, repr=False)

    def record(self, status: SchemaStatus) -> None:
        """Take a full comparison's verdict: a probe's, or the startup check's (`process.prepare`)."""
        if status.is_current:
            self.verified_at, self.revisions = self.clock(), status.current
        else:
            self.verified_at = None

    async def is_current(self, service: Service) -> bool:
        """Whether the schema is this build's; the caller bounds the wait (cancelling it leaves the comparison
        running)."""
        if self.verified_at is not None:
            if await database_revisions(service) == self.revisions:
                if self.clock() - self.verified_at >= SCHEMA_RECHECK_SECONDS:
                    self._compare(service)
                return True
            self.verified_at = None
        status = await asyncio.shield(self._compare(service))
        return status.is_current

    async def settled(self) -> None:
        """Wait until no comparison is running (its verdict recorded)."""
        while self._comparison is not None:
            await asyncio.wait({self._comparison})

    async def close(self) -> None:
        """Cancel a running comparison (process shutdown)."""
        comparison = self._comparison
        if comparison is not None:
            comparison.cancel()
            await asyncio.wait({comparison})

    def _compare(self, service: Service) -> asyncio.Task[SchemaStatus]:
        """The running comparison, or a new one: one at a time, whoever asks."""
        if self._comparison is None:
            timeout = service.settings.database.timeout
            self._comparison = asyncio.create_task(
                check_database_schema(service, timeout=timeout), name="candor-schema-comparison"
            )
            self._comparison.add_done_callback(self._compared)
        return self._comparison

    def _compared(self, comparison: asyncio.Task[SchemaStatus]) -> None:
        self._comparison = None
        if comparison.cancelled():
            return
        error = comparison.exception()
        if error is None:
            self.record(comparison.result())
            return
        self.verified_at = None
        # §10.1: probes are not logged at the default level; the 503 body names the dependency.
        log.debug("Schema comparison failed", extra={"error": type(error).__name__})


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
    try:
        async with asyncio.timeout(service.settings.server.readiness_timeout):  # not wait_for (see supervisor)
            return await watch.is_current(service)
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
