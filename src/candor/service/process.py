"""One `candor serve` process: startup checks, then the role's tasks (worker loop, sweeps, HTTP) until stopped.

Startup (§3.3, §10.3): settings are checked by the caller, which also binds `server.listen` first (listen.py: a
port in use starts nothing); `control`/`all` migrate under the lock when
`database.auto_migrate` is on; every role then refuses a schema that is not the build's (S-122); `worker`/`all`
import every agent factory. Shutdown: SIGTERM or SIGINT marks the process draining (`/readyz` 503, S-52), drains
the worker (§7.11), stops the sweeps, then stops HTTP.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import socket
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, Literal

import uvicorn

from .control.sweeps import run_sweeps
from .core import Service, pool_size_for
from .http.app import create_app
from .http.readiness import Readiness, Role, SchemaWatch
from .listen import bind_listener, split_listen
from .settings import ServiceSettings
from .store.checkpoints import build_message_schemas
from .store.db import check_server_budget, connection_budget, is_postgresql_url, watch_connections
from .store.schema import migrate, require_current_schema
from .store.wakeups import listen_for_wakeups
from .worker.drain import drain
from .worker.loop import WorkerLoop

log = logging.getLogger("candor.process")

__all__ = ("Role", "run", "serve", "prepare", "loop_factory", "http_config")


class _Server(uvicorn.Server):
    """uvicorn without its own signal handling: the process runner owns SIGTERM (drain first, then stop HTTP)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def run(
    settings: ServiceSettings,
    role: Role,
    *,
    on_prepared: Callable[[Service], Awaitable[None]] | None = None,
    listener: socket.socket | None = None,
) -> None:
    """`serve` on the event loop `server.event_loop` names (uvloop by default): the whole process, HTTP, database
    driver, sweeps and worker, runs on it."""
    with asyncio.Runner(loop_factory=loop_factory(settings.server.event_loop)) as runner:
        runner.run(serve(settings, role, on_prepared=on_prepared, listener=listener))


def loop_factory(name: Literal["uvloop", "asyncio"]) -> Callable[[], asyncio.AbstractEventLoop]:
    if name == "uvloop":
        import uvloop

        return uvloop.new_event_loop
    return asyncio.new_event_loop


async def prepare(settings: ServiceSettings, role: Role, *, schema: SchemaWatch | None = None) -> Service:
    """Startup checks and the process-wide `Service`; raises when the process must not start. `schema` takes the
    startup comparison's verdict, so `/readyz` does not compare again at its first probe."""
    url = settings.database.url
    if role in ("control", "all") and settings.database.auto_migrate:
        await migrate(url, lock_timeout=settings.database.migration_lock_timeout, timeout=settings.database.timeout)
    status = await require_current_schema(url, timeout=settings.database.timeout)
    if schema is not None:
        schema.record(status)
    runs_worker = role in ("worker", "all")
    service = await Service.open(settings, runs_worker=runs_worker, role=role)
    if settings.database.sqlite_synchronous == "normal" and not is_postgresql_url(url):
        log.warning(
            "database.sqlite_synchronous is normal: commits survive a crash of this process, but the last ones "
            "before a power failure or OS crash may be lost, accepted requests and checkpoints included",
            extra={"sqlite_synchronous": "normal"},
        )
    if runs_worker:
        service.agents.check_all()
    budget = connection_budget(
        pool_size=pool_size_for(settings),
        max_overflow=settings.database.max_overflow,
        runs_worker=runs_worker and is_postgresql_url(url),
    )
    service.on_listening = watch_connections(service.engine, budget, heartbeat_engine=service.lease_engine)
    await check_server_budget(service.engine, budget, processes=settings.database.processes)
    return service


def http_config(app: Any, *, host: str, port: int, http_parser: Literal["httptools", "h11"]) -> uvicorn.Config:
    """uvicorn's settings: its access log off (`candor.http` writes one line per request, with the request id),
    and no `log_config`, so uvicorn leaves the logging `logs.configure_logging` set up alone. With its defaults,
    uvicorn re-enabled `uvicorn.access` and wrote every request a second time, to stdout, formatted per request."""
    return uvicorn.Config(app, host=host, port=port, http=http_parser, access_log=False, log_config=None)


def _freeze_startup_objects() -> None:
    """Move every object alive after startup (the imported modules, pydantic and FastAPI schemas, the agents, the
    app) out of the cyclic collector's reach (`gc.freeze`), after collecting what startup left as garbage.

    They live as long as the process, but every full collection would walk them all again, pausing the whole event
    loop while requests wait. Objects made later are collected as usual; refcounting frees the rest as always.
    """
    gc.collect()
    gc.freeze()


async def serve(
    settings: ServiceSettings,
    role: Role,
    *,
    on_prepared: Callable[[Service], Awaitable[None]] | None = None,
    listener: socket.socket | None = None,
) -> None:
    """Run until SIGTERM/SIGINT; then drain and stop. `on_prepared` runs once the startup checks passed (the CLI
    prints its startup summary there). `listener` is the bound socket of `server.listen` (the CLI binds it before
    anything else); without one, it is bound here, first: a port in use starts nothing (`ListenError`)."""
    if listener is None:
        listener = bind_listener(settings.server.listen)
    try:
        readiness = Readiness()
        service = await prepare(settings, role, schema=readiness.schema)
    except BaseException:
        listener.close()
        raise
    if on_prepared is not None:
        await on_prepared(service)
    host, port = split_listen(settings.server.listen)
    app = create_app(service, role=role, readiness=readiness)
    server = _Server(http_config(app, host=host, port=port, http_parser=settings.server.http_parser))
    worker = WorkerLoop(service) if role in ("worker", "all") else None
    background: list[asyncio.Task[None]] = []
    if worker is not None:
        background.append(asyncio.create_task(worker.run_forever(), name="worker"))
        background.append(asyncio.create_task(_listen(service, readiness), name="wakeups"))
    if role in ("control", "all"):
        background.append(asyncio.create_task(run_sweeps(service), name="sweeps"))
    readiness.tasks_alive = lambda: all(not task.done() for task in background)
    build_message_schemas()  # not inside the first run's first boundary or request; frozen with the rest
    _freeze_startup_objects()
    http = asyncio.create_task(server.serve(sockets=[listener]), name="http")
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopping.set)
    readiness.started = True
    log.info("Process started", extra={"role": role, "listen": settings.server.listen})
    try:
        waiters = {asyncio.create_task(stopping.wait()), http, *background}
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    finally:
        readiness.draining = True
        if worker is not None:
            abandoned = await drain(worker)
            log.info("Worker drained", extra={"abandoned": abandoned})
        for task in background:
            task.cancel()
        await asyncio.gather(*background, return_exceptions=True)
        server.should_exit = True
        await asyncio.gather(http, return_exceptions=True)
        await readiness.schema.close()
        await service.close()


async def _listen(service: Service, readiness: Readiness) -> None:
    """Wake this worker on `NOTIFY candor_wake` (PostgreSQL) or a datagram to its socket next to the SQLite file; a
    lost connection (or socket) is `degraded: ["notify"]` (S-121).

    When there is nothing to listen to, the task idles so that `tasks_alive` keeps meaning "every background task
    is running".
    """

    def connected(ok: bool) -> None:
        service.on_listening(ok)
        if ok:
            readiness.degraded.discard("notify")
        else:
            readiness.degraded.add("notify")

    await listen_for_wakeups(service.settings.database.url, on_wake=service.wakeups.set, on_connected=connected)
    await asyncio.Event().wait()
