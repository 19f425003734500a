"""Connection budgets (§7.8.1): what one process may hold open on PostgreSQL, whatever `worker.slots` is.

Store functions check a connection out for one statement or transaction, so a process holds at most the pool
(`database.pool_size` + `database.max_overflow`) plus, for a worker, its `LISTEN` connection and its supervisor's
lease connection (`Service.lease_engine`, outside the pool so a busy pool never delays a renewal). A full pool or a
refusing server is waited for and retried within `database.timeout` (`patient_connect`), then `StoreUnavailable`.
Connections are named `candor-<role>-<pid>` (`application_name`); `check_server_budget` warns when the configured
processes could exceed `max_connections`, and `watch_connections` exports `candor_db_connections{role, state}`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import asyncpg
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from ...metrics import DB_CONNECTION_LIMIT, DB_CONNECTIONS
from .dialect import is_postgresql_url

__all__ = (
    "ConnectionBudget",
    "connection_budget",
    "application_name",
    "server_budget_warning",
    "patient_connect",
    "is_retryable_connect_error",
    "connect_retry_delays",
    "check_server_budget",
    "watch_connections",
    "APPLICATION_PREFIX",
)

log = logging.getLogger("candor.connections")

APPLICATION_PREFIX = "candor-"
"""Every candor connection's `application_name` starts with this (`application_name`)."""

_NAMEDATALEN = 63
"""PostgreSQL truncates an `application_name` to this many bytes."""


@dataclass(frozen=True, slots=True)
class ConnectionBudget:
    """The most PostgreSQL connections one process may hold at once."""

    pool: int
    """`database.pool_size`: kept open once used."""
    overflow: int
    """`database.max_overflow`: opened beyond the pool under load, closed when returned to a full pool."""
    listen: int
    """A worker's `LISTEN candor_wake` connection, outside the pool."""
    heartbeat: int
    """A worker's connection for heartbeats and lease renewals (`Service.lease_engine`), outside the pool."""

    @property
    def total(self) -> int:
        return self.pool + self.overflow + self.listen + self.heartbeat


def connection_budget(*, pool_size: int, max_overflow: int, runs_worker: bool) -> ConnectionBudget:
    """The budget of a process with this pool that runs (or not) a worker loop (pure). `worker.slots` is not an
    input: a slot holds a connection only while one of its statements runs (§7.8.1)."""
    dedicated = 1 if runs_worker else 0
    return ConnectionBudget(pool=pool_size, overflow=max_overflow, listen=dedicated, heartbeat=dedicated)


def application_name(role: str, *, pid: int | None = None, host: str | None = None) -> str:
    """`candor-<role>-<host>-<pid>`, cut to what PostgreSQL keeps (pure but for the defaults): one name per process,
    so `pg_stat_activity` tells the processes apart."""
    pid = os.getpid() if pid is None else pid
    host = (socket.gethostname() if host is None else host).split(".")[0]
    tail = f"-{pid}"
    head = f"{APPLICATION_PREFIX}{role}-{host}"
    return head[: _NAMEDATALEN - len(tail)] + tail


def server_budget_warning(
    *, budget: ConnectionBudget, processes: int, estimated: bool, max_connections: int, reserved: int
) -> str | None:
    """A warning when `processes` candor processes with this process's budget could open more connections than the
    server admits to ordinary roles (`max_connections − superuser_reserved_connections`); None when they fit
    (pure). Other processes may be configured differently: this process's budget stands for each of them."""
    admitted = max_connections - reserved
    needed = processes * budget.total
    if needed <= admitted:
        return None
    source = "estimated from the candor processes connected now" if estimated else "database.processes"
    return (
        f"{processes} candor processes ({source}) may open up to {needed} PostgreSQL connections "
        f"({processes} x (pool {budget.pool} + overflow {budget.overflow} + listen {budget.listen} + heartbeat "
        f"{budget.heartbeat})), more than "
        f"the {admitted} the server admits (max_connections {max_connections} - superuser_reserved_connections "
        f"{reserved}): lower database.pool_size or database.max_overflow, or raise max_connections "
        f"(docs/operations.md, connection budgets)"
    )


# ---------------------------------------------------------------------------------------- waiting for the server

_RETRYABLE_SQLSTATES = frozenset({"53300", "57P03"})
"""too many connections (also "remaining connection slots are reserved"); the server is starting or shutting down."""


def is_retryable_connect_error(error: BaseException) -> bool:
    """Whether a failed connect may succeed soon (pure): the server is full, (re)starting, or refused the TCP
    connection (a restart in progress). Authentication failures and unknown databases are not."""
    if isinstance(error, asyncpg.PostgresError):
        return getattr(error, "sqlstate", None) in _RETRYABLE_SQLSTATES
    return isinstance(error, (ConnectionRefusedError, ConnectionResetError, ConnectionAbortedError))


def connect_retry_delays(budget_seconds: float, *, first: float = 0.05, cap: float = 0.5) -> list[float]:
    """The pauses between connect tries within `budget_seconds` (pure): doubling from `first`, capped at `cap`,
    their sum within the budget."""
    delays: list[float] = []
    spent, delay = 0.0, first
    while spent + delay <= budget_seconds:
        delays.append(delay)
        spent += delay
        delay = min(cap, delay * 2)
    return delays


def patient_connect(
    timeout: float, *, connect: Callable[..., Awaitable[Any]] = asyncpg.connect
) -> Callable[..., Awaitable[Any]]:
    """An `asyncpg.connect` that retries a connect the server refused for now (`is_retryable_connect_error`) for
    at most `timeout` seconds in all, then raises the last error (SQLAlchemy's asyncpg dialect calls it as its
    `async_creator_fn`)."""

    async def connect_patiently(*args: Any, **kwargs: Any) -> Any:
        deadline = time.monotonic() + timeout
        delays = iter(connect_retry_delays(timeout))
        while True:
            # Each try gets what is left of the budget as asyncpg's own connect timeout, so the whole wait stays
            # within `timeout` however the tries fail.
            remaining = max(0.05, deadline - time.monotonic())
            try:
                return await connect(*args, **{**kwargs, "timeout": min(remaining, kwargs.get("timeout", timeout))})
            except (asyncpg.PostgresError, OSError) as error:
                pause = next(delays, None)
                if not is_retryable_connect_error(error) or pause is None or time.monotonic() + pause > deadline:
                    raise
                await asyncio.sleep(pause)

    return connect_patiently


def idle_transaction_limit_ms(timeout: float) -> str:
    """`idle_in_transaction_session_timeout` for `database.timeout` (pure): twice the statement timeout.

    candor's transactions are short and never wait on anything but their own statements, so one that sits idle
    longer belongs to a process that stopped (SIGSTOP, a paused VM) in the middle of it. Its row locks would
    otherwise stay held until it wakes, and the sweep that expires its lease (and any writer of the same run) would
    wait on them for as long: the server ends such a transaction instead."""
    return str(max(1, int(timeout * 2000)))


def postgres_connect_args(
    connect_args: dict[str, Any], *, timeout: float, name: str, connect_timeout: float | None = None
) -> dict[str, Any]:
    """`connect_args` for an asyncpg engine: the patient connect (retrying for `connect_timeout`, default
    `timeout`), this process's `application_name`, and the limit on an idle transaction
    (`idle_transaction_limit_ms`)."""
    server_settings = {
        **connect_args.get("server_settings", {}),
        "application_name": name,
        "idle_in_transaction_session_timeout": idle_transaction_limit_ms(timeout),
    }
    patience = timeout if connect_timeout is None else connect_timeout
    return {**connect_args, "server_settings": server_settings, "async_creator_fn": patient_connect(patience)}


# ---------------------------------------------------------------------------------------- startup and metrics

_SERVER_LIMITS = text(
    "SELECT current_setting('max_connections')::int AS max_connections, "
    "current_setting('superuser_reserved_connections')::int AS reserved, "
    "(SELECT count(DISTINCT application_name) FROM pg_stat_activity "
    " WHERE application_name LIKE :prefix AND application_name <> current_setting('application_name')) AS others"
)


async def check_server_budget(engine: AsyncEngine, budget: ConnectionBudget, *, processes: int | None) -> str | None:
    """Warn (log, and return the message) when the configured processes could exceed the server's connection
    limit. `processes`: `database.processes`; None estimates it as the other candor processes connected now plus
    this one. PostgreSQL only; a failed read is logged and skipped (the check advises, it never stops a start)."""
    if not is_postgresql_url(engine.url):
        return None
    try:
        async with engine.connect() as connection:
            row = (await connection.execute(_SERVER_LIMITS, {"prefix": f"{APPLICATION_PREFIX}%"})).one()
    except Exception as error:  # noqa: BLE001 - advisory: the process starts without the check
        log.warning("Connection budget not checked", extra={"error_type": type(error).__name__})
        return None
    estimated = processes is None
    count = int(row.others) + 1 if processes is None else processes
    message = server_budget_warning(
        budget=budget,
        processes=count,
        estimated=estimated,
        max_connections=int(row.max_connections),
        reserved=int(row.reserved),
    )
    if message is not None:
        log.warning(message, extra={"processes": count, "budget": budget.total})
    return message


def watch_connections(
    engine: AsyncEngine, budget: ConnectionBudget, *, heartbeat_engine: AsyncEngine | None = None
) -> Callable[[bool], None]:
    """Export the connections as `candor_db_connections{role="pool"|"heartbeat", state="in_use"|"idle"}`, read
    from the pools at each scrape, and the budget as `candor_db_connection_limit{role}`. Returns the setter of the
    LISTEN connection's state (`role="listen"`), for the LISTEN task's `on_connected`."""
    for role, watched in (("pool", engine), ("heartbeat", heartbeat_engine)):
        if watched is None:
            continue
        pool: Any = watched.sync_engine.pool
        DB_CONNECTIONS.labels(role=role, state="in_use").set_function(functools.partial(_count, pool, "checkedout"))
        DB_CONNECTIONS.labels(role=role, state="idle").set_function(functools.partial(_count, pool, "checkedin"))
    limits = {"pool": budget.pool + budget.overflow, "listen": budget.listen, "heartbeat": budget.heartbeat}
    for role, limit in limits.items():
        DB_CONNECTION_LIMIT.labels(role=role).set(limit)
    listen = DB_CONNECTIONS.labels(role="listen", state="in_use")
    listen.set(0)

    def listening(connected: bool) -> None:
        listen.set(1 if connected and budget.listen else 0)

    return listening


def _count(pool: Any, method: str) -> float:
    """A pool count (`checkedout`/`checkedin`); 0 for a pool that keeps none (SQLite's `NullPool`-like pools)."""
    reader = getattr(pool, method, None)
    return float(reader()) if callable(reader) else 0.0
