"""Service: the embeddable face of the host that the CLI, the HTTP layer, the tests and the demo all drive.

It owns the process-wide resources (settings, database engine, agent registry, clock and entropy); the
user actions live in `commands/`, execution in `worker/`, and the control sweeps in `control/`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .agents import AgentRegistry
from .runtime import Clock, Entropy, SystemClock, SystemEntropy
from .settings import ServiceSettings
from .signing_keys import KeyRing
from .store.db import Engine, application_name, bind_key_ring, create_engine, is_postgresql_url
from .store.wakeups import Notifier
from .telemetry import Telemetry

__all__ = ("Service", "DEFAULT_AGENTS", "agent_registry", "pool_size_for")

DEFAULT_AGENTS = {"support": "candor.demo.support:support_harness"}
"""With no `[agents.*]` configured, the scripted demo agents are hosted: everything works with no API key."""


def agent_registry(settings: ServiceSettings) -> AgentRegistry:
    if settings.agents:
        return AgentRegistry.from_settings(settings.agents)
    return AgentRegistry(DEFAULT_AGENTS)


DEFAULT_POOL_SIZE = 10
"""`database.pool_size` when unset, for every role: with the default `max_overflow` of 4 and a worker's LISTEN and
heartbeat connections, a process holds at most 16 connections, and six processes fit PostgreSQL's default
`max_connections` (100, less 3 reserved for superusers)."""


def pool_size_for(settings: ServiceSettings) -> int:
    """`database.pool_size`, or `DEFAULT_POOL_SIZE` when unset (pure), whatever the role and `worker.slots`: a run in
    flight holds a connection only while one of its statements runs (§7.8.1, store/db/connections.py)."""
    return settings.database.pool_size if settings.database.pool_size is not None else DEFAULT_POOL_SIZE


def lease_engine(settings: ServiceSettings, *, role: str | None) -> Engine | None:
    """A one-connection engine for a PostgreSQL worker's heartbeats (`Service.lease_engine`); None on SQLite."""
    if not is_postgresql_url(settings.database.url):
        return None
    return create_engine(
        settings.database.url,
        timeout=settings.database.timeout,
        pool_size=1,
        max_overflow=0,
        application_name=application_name(role or "worker"),
    )


@dataclass(kw_only=True)
class Service:
    """Process-wide resources shared by commands, workers and sweeps. Build with `await Service.open(...)`."""

    settings: ServiceSettings
    engine: Engine
    agents: AgentRegistry
    clock: Clock = field(default_factory=SystemClock)
    entropy: Entropy = field(default_factory=SystemEntropy)
    wakeups: Any = None
    """In-process wake-up signal for workers (an asyncio.Event-like object), set when a run becomes due."""
    notifier: Notifier | None = None
    """Cross-process wake-ups (PostgreSQL `NOTIFY candor_wake`); workers listen in `process.serve`."""
    telemetry: Telemetry = field(default_factory=Telemetry)
    """OpenTelemetry traces of runs (`[telemetry]`); `Telemetry()` traces nothing."""
    lease_engine: Engine | None = None
    """A worker's own connection for its supervisor's heartbeats and lease renewals (PostgreSQL), so that they never
    queue behind the attempts' statements for a pooled connection: a renewal starved by a busy pool would let
    healthy leases expire and charge attempts (§7.8.1). None: they use `engine` (SQLite, where one engine keeps
    the process's writers in turn, and processes that run no worker)."""
    on_listening: Callable[[bool], None] = lambda connected: None
    """Told whether the worker's LISTEN connection is up (`connections.watch_connections` sets the gauge)."""
    key_ring: KeyRing = field(init=False)
    """The webhook signing-secret ring of `settings.security.keys`; bound to `engine` for the store's statements."""

    def __post_init__(self) -> None:
        self.key_ring = KeyRing.from_keys(key.get_secret_value() for key in self.settings.security.keys)
        bind_key_ring(self.engine, self.key_ring)

    @classmethod
    async def open(
        cls,
        settings: ServiceSettings,
        *,
        runs_worker: bool = False,
        role: str | None = None,
        agents: AgentRegistry | None = None,
        clock: Clock | None = None,
        entropy: Entropy | None = None,
    ) -> Service:
        """`runs_worker`: this process runs a worker loop. `role` names its connections on PostgreSQL
        (`connections.application_name`; default: `worker` or `service`)."""
        engine = create_engine(
            settings.database.url,
            timeout=settings.database.timeout,
            pool_size=pool_size_for(settings),
            max_overflow=settings.database.max_overflow,
            sqlite_synchronous=settings.database.sqlite_synchronous,
            application_name=application_name(role or ("worker" if runs_worker else "service")),
        )
        return cls(
            settings=settings,
            engine=engine,
            lease_engine=lease_engine(settings, role=role) if runs_worker else None,
            agents=agents if agents is not None else agent_registry(settings),
            clock=clock if clock is not None else SystemClock(),
            entropy=entropy if entropy is not None else SystemEntropy(),
            wakeups=asyncio.Event(),
            notifier=Notifier(engine),
            telemetry=Telemetry.from_settings(settings.telemetry),
        )

    def wake_workers(self) -> None:
        """A run became due (after its commit): wake this process's worker loop and, on PostgreSQL, the others."""
        if self.wakeups is not None:
            self.wakeups.set()
        if self.notifier is not None:
            self.notifier.notify()

    @property
    def heartbeat_engine(self) -> Engine:
        """The engine of the supervisor's heartbeats and renewals (`lease_engine` when there is one)."""
        return self.lease_engine if self.lease_engine is not None else self.engine

    async def close(self) -> None:
        if self.notifier is not None:
            await self.notifier.close()
        if self.lease_engine is not None:
            await self.lease_engine.dispose()
        await self.engine.dispose()
        await asyncio.to_thread(self.telemetry.shutdown)  # flushes the batched spans: blocking, bounded
