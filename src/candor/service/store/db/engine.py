"""Engines and transactions: async engines from operator URLs, write/read transactions, driver error translation.

* `create_engine("sqlite:///x.db")` uses aiosqlite in WAL mode with a busy timeout; the driver's own transaction
  handling is switched off and every transaction starts with `BEGIN IMMEDIATE` (§2.2), so SQLite's single writer
  lock serializes claims, renewals and commits. `read_transaction()` uses a deferred BEGIN instead.
* `create_engine("postgresql://…")` uses asyncpg with `statement_timeout` and `lock_timeout` set to `timeout`.
* Connection failures, timeouts and lock timeouts become `StoreUnavailable` (→ 503 `unavailable`); constraint and
  trigger violations stay `sqlalchemy.exc.IntegrityError` for the statement modules to interpret.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager

from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.pool import PoolProxiedConnection
from sqlalchemy.util import greenlet_spawn

from ...errors import StoreUnavailable
from ...protocol.db_faults import describe_database_error
from ...signing_keys import NO_KEYS, KeyRing
from .connections import postgres_connect_args
from .dialect import (
    BEGIN_OPTION,
    SqliteSynchronous,
    async_url,
    engine_options,
    guards_decide_races,
    install_connection_hooks,
    is_postgresql_url,
    pool_options,
)
from .writer_gate import writer_turn

__all__ = (
    "WriteConnection",
    "create_engine",
    "after_commit",
    "nothing_to_commit",
    "bind_key_ring",
    "key_ring_of",
    "write_transaction",
    "guarded_writes",
    "read_transaction",
    "translate_errors",
    "unavailable",
    "endpoint_of",
    "is_unavailable",
    "check_out",
    "DEFAULT_TIMEOUT",
    "UNAVAILABLE_SQLSTATES",
    "UNAVAILABLE_SQLSTATE_PREFIXES",
)

WriteConnection = AsyncConnection
"""The connection a `write_transaction` yields: what a store function working inside its caller's transaction takes
(layers above the store name it by this alias and never import SQLAlchemy)."""

DEFAULT_TIMEOUT = 5.0
"""`database.timeout` default (seconds)."""

_AFTER_COMMIT = "candor_after_commit"


def after_commit(conn: AsyncConnection, hook: Callable[[], None]) -> None:
    """Run `hook` once the `write_transaction` of `conn` has committed (dropped if it rolls back); for metrics."""
    conn.info.setdefault(_AFTER_COMMIT, []).append(hook)


_NOTHING_TO_COMMIT = "candor_nothing_to_commit"


def nothing_to_commit(conn: AsyncConnection) -> None:
    """The `write_transaction` of `conn` wrote nothing (a claim or a renewal that found no row): end it with a
    rollback instead of a commit. Same effect, but no committed transaction is counted for it (the cost report
    counts `pg_stat_database.xact_commit` per durable step). Call it only when no statement of the transaction wrote."""
    conn.info[_NOTHING_TO_COMMIT] = True


_KEY_RING = "candor_key_ring"


def bind_key_ring(engine: AsyncEngine, key_ring: KeyRing) -> None:
    """Hand the service's key ring down to every connection of `engine` (an execution option), so the statements
    that stage or redeliver webhook rows read the ring of the service that opened the transaction."""
    engine.update_execution_options(**{_KEY_RING: key_ring})


def key_ring_of(conn: AsyncConnection) -> KeyRing:
    """The key ring bound to the connection's engine; `NO_KEYS` when none was bound."""
    ring = conn.sync_engine.get_execution_options().get(_KEY_RING, NO_KEYS)
    assert isinstance(ring, KeyRing)
    return ring


# SQLSTATE classes and codes that mean "the database is not usable right now" rather than "your statement is wrong".
UNAVAILABLE_SQLSTATE_PREFIXES = ("08", "53", "57P")
UNAVAILABLE_SQLSTATES = frozenset({"57014", "55P03", "40001", "40P01"})  # timeout, lock, serialization, deadlock


Engine = AsyncEngine
"""The engine type other packages name without importing sqlalchemy (layering, STYLE habit 9)."""


def create_engine(
    url: str | URL,
    *,
    timeout: float = DEFAULT_TIMEOUT,
    connect_timeout: float | None = None,
    pool_size: int | None = None,
    max_overflow: int | None = None,
    sqlite_synchronous: SqliteSynchronous = "full",
    application_name: str = "candor",
    **options: object,
) -> AsyncEngine:
    """An async engine for an operator URL (`sqlite:///…` → aiosqlite, `postgresql://…` → asyncpg).

    `timeout` (seconds) bounds statements and lock waits: PostgreSQL `statement_timeout`/`lock_timeout`, SQLite's
    busy timeout. `pool_size`/`max_overflow` size a PostgreSQL engine's connection pool (`database.pool_size`,
    `database.max_overflow`; SQLAlchemy's 5 and 10 when not given); SQLite ignores them. `sqlite_synchronous` is
    SQLite's `PRAGMA synchronous` on every connection (`database.sqlite_synchronous`); PostgreSQL ignores it. Extra
    `options` go to `create_async_engine`. On PostgreSQL a checkout waits at most `timeout` for a pooled connection
    and a connect the server refuses for now is retried within `connect_timeout` (`timeout` when not given: the
    migration engine's statements may run long, its connect must not); every connection is named
    `application_name` (store/db/connections.py, §7.8.1).
    """
    resolved = async_url(url)
    kwargs = engine_options(resolved, timeout=timeout)
    kwargs.update(pool_options(resolved, pool_size=pool_size, max_overflow=max_overflow))
    if is_postgresql_url(resolved):
        kwargs["pool_timeout"] = timeout
        kwargs["connect_args"] = postgres_connect_args(
            kwargs["connect_args"],
            timeout=timeout,
            connect_timeout=connect_timeout,
            name=application_name,
        )
    # Statement parameters hold message text and secret hashes: driver errors and logs show the SQL only.
    kwargs["hide_parameters"] = True
    kwargs.update(options)
    engine = create_async_engine(resolved, **kwargs)
    install_connection_hooks(engine, timeout=timeout, sqlite_synchronous=sqlite_synchronous)
    return engine


def is_unavailable(error: BaseException) -> bool:
    """Whether `error` means the database could not serve the request (connection, timeout, lock, busy)."""
    if isinstance(error, (sa_exc.IntegrityError, sa_exc.ProgrammingError, sa_exc.DataError)):
        return False
    if isinstance(error, (sa_exc.OperationalError, sa_exc.InterfaceError, sa_exc.TimeoutError)):
        return True
    if isinstance(error, sa_exc.DBAPIError):
        if error.connection_invalidated:
            return True
        sqlstate = getattr(error.orig, "sqlstate", None) or ""
        return sqlstate in UNAVAILABLE_SQLSTATES or sqlstate.startswith(UNAVAILABLE_SQLSTATE_PREFIXES)
    return isinstance(error, (OSError, asyncio.TimeoutError, TimeoutError))


def endpoint_of(engine: AsyncEngine) -> str:
    """Where `engine` connects, for messages: `host:port` of a PostgreSQL server, the file of a SQLite database."""
    url = engine.url
    if url.host is None:  # a database file (or a server reached by its default socket): its name says where
        return url.database or "the database"
    return f"{url.host}:{url.port or 5432}"  # only PostgreSQL URLs name a host; 5432 is its default port


def unavailable(error: BaseException, endpoint: str | None = None) -> StoreUnavailable:
    """`StoreUnavailable` for `error` whose message names the cause in words (`too many connections`,
    `connection refused by 127.0.0.1:5432`, `disk full`, `database is locked`); chain it with `from error`."""
    description = describe_database_error(error, endpoint=endpoint)
    if endpoint and endpoint not in description:
        description = f"{description} talking to {endpoint}"
    return StoreUnavailable(f"database unavailable: {description}")


@contextmanager
def translate_errors(endpoint: str | None = None) -> Iterator[None]:
    """Re-raise database availability failures inside the block as `StoreUnavailable` (chained); `endpoint`
    completes the message when the error does not say where it failed."""
    try:
        yield
    except StoreUnavailable:
        raise
    except (TimeoutError, sa_exc.SQLAlchemyError, OSError) as error:
        if is_unavailable(error):
            raise unavailable(error, endpoint) from error
        raise


async def check_out(engine: AsyncEngine) -> PoolProxiedConnection:
    """A connection of `engine`'s pool, checked out through the pool itself, for code that talks to the driver
    directly (the plain step commit, `step_commit.py`; the caller returns it).

    `engine.connect()` would wrap it in SQLAlchemy's `Connection` and `AsyncConnection` (greenlet switches, and a
    close run in a shielded task): on a step commit's path that cost as much as the statement itself
    (docs/worker-cost.md). The pool's checkout, with its hooks (`dialect._replace_closed_connections`), is the
    same. Failing to check one out is `StoreUnavailable`: the pool's timeout, a refused connection, and the driver's
    own errors as SQLAlchemy's adapter raises them.
    """
    with translate_errors(endpoint_of(engine)):
        try:
            return await greenlet_spawn(engine.sync_engine.raw_connection)
        except engine.dialect.loaded_dbapi.Error as error:
            raise unavailable(error, endpoint_of(engine)) from error


@asynccontextmanager
async def write_transaction(engine: AsyncEngine) -> AsyncIterator[AsyncConnection]:
    """One write transaction: `BEGIN IMMEDIATE` on SQLite, a plain transaction on PostgreSQL; commit on success.

    Keep it short (STYLE habit 6): open, write, commit, then do slow work. On SQLite the transaction first waits
    its turn among the process's writers (`writer_gate.py`).
    """
    with translate_errors(endpoint_of(engine)):
        async with writer_turn(engine), engine.connect() as connection, connection.begin() as transaction:
            connection.info.pop(_AFTER_COMMIT, None)  # left behind by a transaction that rolled back
            connection.info.pop(_NOTHING_TO_COMMIT, None)
            yield connection
            hooks = connection.info.pop(_AFTER_COMMIT, ())
            if connection.info.pop(_NOTHING_TO_COMMIT, False):
                await transaction.rollback()
    for hook in hooks:  # committed: now count what happened (metrics)
        hook()


@asynccontextmanager
async def guarded_writes(engine: AsyncEngine) -> AsyncIterator[AsyncConnection]:
    """A connection for a command that reads, decides, then writes with guards: a write that re-checks what the
    decision read (its `WHERE`), with the unique indexes deciding between racing inserts, and reports a lost guard
    so the command reads again (`errors.RaceLost`, `commands.acceptance.answer`).

    On PostgreSQL (`dialect.guards_decide_races`) the connection is outside any transaction: each statement sent
    with `statements.fetch_rows` goes on asyncpg and commits on its own, so a read and a guarded write are two round
    trips instead of BEGIN, read, write and COMMIT (and no lock is held between them). A block that must write more
    than one statement atomically opens its own transaction (`async with conn.begin()`). On SQLite this is a
    `write_transaction`: one writer at a time, so nothing can come between the read and the write. Either way the
    `after_commit` hooks run once the block has ended without an error.
    """
    if not guards_decide_races(engine):
        async with write_transaction(engine) as connection:
            yield connection
        return
    with translate_errors(endpoint_of(engine)):
        async with engine.connect() as connection:
            connection.info.pop(_AFTER_COMMIT, None)
            yield connection
            if connection.in_transaction():
                # A statement sent through SQLAlchemy began a transaction the block did not end: never let the
                # connection's return roll back a write silently.
                raise RuntimeError("guarded_writes: a transaction was left open; end it inside the block")
            hooks = connection.info.pop(_AFTER_COMMIT, ())
    for hook in hooks:
        hook()


@asynccontextmanager
async def read_transaction(engine: AsyncEngine) -> AsyncIterator[AsyncConnection]:
    """A read-only transaction (deferred BEGIN on SQLite, so it takes no write lock); rolled back at the end."""
    with translate_errors(endpoint_of(engine)):
        async with engine.connect() as connection:
            connection = await connection.execution_options(**{BEGIN_OPTION: "DEFERRED"})
            async with connection.begin() as transaction:
                yield connection
                await transaction.rollback()
