"""Service: the embeddable face of the host that the CLI, the HTTP layer, the tests and the demo all drive.

It owns the process-wide resources (settings, database engine, agent registry, clock and entropy); the
user actions live in `commands/`, execution in `worker/`, and the control sweeps in `control/`.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from .agents import AgentRegistry
from .runtime import Clock, Entropy, SystemClock, SystemEntropy
from .settings import ServiceSettings
from .signing_keys import KeyRing
from .store.engine import Engine, bind_key_ring, create_engine
from .store.notify import Notifier
from .telemetry import Telemetry

__all__ = ("Service", "DEFAULT_AGENTS", "agent_registry", "pool_size_for")

DEFAULT_AGENTS = {"support": "candor.demo.support:support_harness"}
"""With no `[agents.*]` configured, the scripted demo agents are hosted: everything works with no API key."""


def agent_registry(settings: ServiceSettings) -> AgentRegistry:
    if settings.agents:
        return AgentRegistry.from_settings(settings.agents)
    return AgentRegistry(DEFAULT_AGENTS)


DEFAULT_POOL_SIZE = 10
WORKER_POOL_HEADROOM = 8
"""Connections a worker process needs besides one per slot: the claim loop, the supervisor's heartbeats and lease
renewals, the live stream's timed writes, and in an `all` process the sweeps and HTTP requests."""


def pool_size_for(settings: ServiceSettings, *, runs_worker: bool) -> int:
    """`database.pool_size` when set; else 10, or one connection per worker slot plus `WORKER_POOL_HEADROOM` (at
    least 10) in a process that runs a worker (pure).

    A worker whose slots outnumber its pooled connections takes overflow connections under load, and SQLAlchemy
    closes each one when it comes back to a full pool: every such commit then pays a new PostgreSQL connection (a
    forked backend, authentication, statements prepared again). A pool sized for the slots opens none.
    """
    if settings.database.pool_size is not None:
        return settings.database.pool_size
    if runs_worker:
        return max(DEFAULT_POOL_SIZE, settings.worker.slots + WORKER_POOL_HEADROOM)
    return DEFAULT_POOL_SIZE


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
        agents: AgentRegistry | None = None,
        clock: Clock | None = None,
        entropy: Entropy | None = None,
    ) -> Service:
        """`runs_worker`: this process runs a worker loop, so its pool is sized for the slots (`pool_size_for`)."""
        engine = create_engine(
            settings.database.url, timeout=settings.database.timeout,
            pool_size=pool_size_for(settings, runs_worker=runs_worker), max_overflow=settings.database.max_overflow,
            sqlite_synchronous=settings.database.sqlite_synchronous,
        )  # fmt: skip
        return cls(
            settings=settings,
            engine=engine,
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

    async def close(self) -> None:
        if self.notifier is not None:
            await self.notifier.close()
        await self.engine.dispose()
        await asyncio.to_thread(self.telemetry.shutdown)  # flushes the batched spans: blocking, bounded
