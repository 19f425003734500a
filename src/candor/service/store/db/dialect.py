"""The connection-level half of the SQLite vs PostgreSQL branches: URLs, pools, connection setup and locks.

`schema/dialect.py` holds the other half (column types, the database clock, triggers and statement fragments).
Between them they are the only code that branches on the dialect (spec §2.2, STYLE habit 4).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any, Literal, get_args

from sqlalchemy import event, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import DisconnectionError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from .writer_gate import install_writer_gate

__all__ = (
    "DialectName",
    "DIALECTS",
    "BEGIN_OPTION",
    "dialect_name",
    "writes_as_ctes",
    "statements_on_driver",
    "guards_decide_races",
    "has_listen_notify",
    "is_postgresql_url",
    "sqlite_database_file",
    "pool_options",
    "display_url",
    "async_url",
    "engine_options",
    "SqliteSynchronous",
    "blind_hex",
    "install_connection_hooks",
    "MIGRATION_LOCK_KEY",
    "acquire_migration_lock",
)

DialectName = Literal["sqlite", "postgresql"]
DIALECTS: tuple[DialectName, ...] = ("sqlite", "postgresql")

BEGIN_OPTION = "candor_sqlite_begin"
"""Connection execution option choosing SQLite's BEGIN mode: `IMMEDIATE` (default), `DEFERRED` or `EXCLUSIVE`."""


def dialect_name(bind: AsyncConnection | AsyncEngine | Any) -> DialectName:
    name = bind.dialect.name
    if name not in DIALECTS:
        raise ValueError(f"unsupported database dialect {name!r}")
    return name


def writes_as_ctes(bind: AsyncConnection | AsyncEngine | Any) -> bool:
    """Whether several writes can go in one statement as data-modifying CTEs (PostgreSQL; SQLite has none)."""
    return dialect_name(bind) == "postgresql"


def statements_on_driver(bind: AsyncConnection | AsyncEngine | Any) -> bool:
    """Whether the hot statements go on asyncpg directly (PostgreSQL, `pg_driver.py`): a request's authentication,
    outside any transaction, and `statements.fetch_rows` inside SQLAlchemy's. On SQLite they go through SQLAlchemy
    (authentication in a deferred read transaction): SQLite emits BEGIN itself and has no round trips to save."""
    return dialect_name(bind) == "postgresql"


def guards_decide_races(bind: AsyncConnection | AsyncEngine | Any) -> bool:
    """Whether a command may read, then write, outside any transaction, each statement committing on its own, the
    write's guards (conditions re-checked on the rows it changes) and the unique indexes deciding races
    (PostgreSQL: row locks, and a write re-checks its `WHERE` on the row as it is after waiting for another's
    lock). SQLite has one writer at a time: such a command runs in one `BEGIN IMMEDIATE` transaction there, where
    no other write can come between its read and its write (`engine.guarded_writes`)."""
    return dialect_name(bind) == "postgresql"


def has_listen_notify(bind: AsyncConnection | AsyncEngine | Any) -> bool:
    """Whether the database offers LISTEN/NOTIFY for wake-ups (PostgreSQL only)."""
    return dialect_name(bind) == "postgresql"


def is_postgresql_url(url: str | URL) -> bool:
    """Whether an operator URL names a PostgreSQL database (any driver suffix)."""
    return make_url(url).get_backend_name() == "postgresql"


_ASYNC_DRIVERS: Mapping[str, str] = {
    "sqlite": "sqlite+aiosqlite",
    "sqlite+aiosqlite": "sqlite+aiosqlite",
    "postgresql": "postgresql+asyncpg",
    "postgres": "postgresql+asyncpg",
    "postgresql+asyncpg": "postgresql+asyncpg",
}


def sqlite_database_file(url: str | URL) -> str | None:
    """The database file of a SQLite URL, or None (PostgreSQL, or an in-memory database)."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        return None
    database = parsed.database or ""
    if database in ("", ":memory:") or database.startswith("file::memory:") or "mode=memory" in database:
        return None
    return database


def pool_options(url: URL, *, pool_size: int | None, max_overflow: int | None) -> dict[str, Any]:
    """Connection pool sizing for `create_async_engine`: PostgreSQL only (SQLite's pool is per file, unsized)."""
    if url.get_backend_name() == "sqlite":
        return {}
    sizes = (("pool_size", pool_size), ("max_overflow", max_overflow))
    return {name: value for name, value in sizes if value is not None}


def display_url(url: str) -> str:
    """The database URL as an operator may see it in output: the password hidden (`***`)."""
    return make_url(url).render_as_string(hide_password=True)


def async_url(url: str | URL) -> URL:
    """Map an operator URL (`sqlite:///x.db`, `postgresql://…`) to its async driver; refuse anything else."""
    parsed = make_url(url) if isinstance(url, str) else url
    driver = _ASYNC_DRIVERS.get(parsed.drivername)
    if driver is None:
        raise ValueError(f"unsupported database URL scheme {parsed.drivername!r}: use sqlite:/// or postgresql://")
    if driver.startswith("sqlite") and parsed.database in (None, "", ":memory:"):
        raise ValueError("SQLite needs a database file (sqlite:///path); in-memory databases are not shared")
    return parsed.set(drivername=driver)


def engine_options(url: URL, *, timeout: float) -> dict[str, Any]:
    """`create_async_engine` keyword arguments for `url` with statement/lock timeout `timeout` seconds."""
    if url.get_backend_name() == "sqlite":
        return {"connect_args": {"timeout": timeout}}
    milliseconds = str(max(1, int(timeout * 1000)))
    return {
        "connect_args": {
            "timeout": timeout,
            "command_timeout": timeout * 2,
            "server_settings": {"statement_timeout": milliseconds, "lock_timeout": milliseconds},
        },
    }


SqliteSynchronous = Literal["full", "normal"]
"""SQLite's `PRAGMA synchronous` levels an operator may choose (`database.sqlite_synchronous`). `off` is not one:
an OS crash could then corrupt the database, not only lose its last commits."""


def blind_hex(value: str | None) -> str | None:
    """SHA-256 hex of `value`: how the plain step blinds a token hash and a nonce before comparing (S-21); SQLite
    connections have it as the SQL function `candor_blind` (PostgreSQL computes the same with `sha256`)."""
    return None if value is None else hashlib.sha256(value.encode()).hexdigest()


def install_connection_hooks(
    engine: AsyncEngine, *, timeout: float, sqlite_synchronous: SqliteSynchronous = "full"
) -> None:
    """SQLite: WAL, busy timeout, `synchronous`, foreign keys, BEGIN IMMEDIATE emitted by us (§2.2), and the
    process's writers queued in turn (`writer_gate.py`).
    PostgreSQL: a pooled connection the server has closed is replaced at checkout (`_replace_closed_connections`)."""
    if engine.dialect.name == "postgresql":
        _replace_closed_connections(engine)
    if engine.dialect.name != "sqlite":
        return
    sync_engine = engine.sync_engine
    busy_ms = max(1, int(timeout * 1000))
    if sqlite_synchronous not in get_args(SqliteSynchronous):  # never interpolate an unchecked value into SQL
        raise ValueError(f"unknown SQLite synchronous level {sqlite_synchronous!r}")
    synchronous = sqlite_synchronous.upper()
    install_writer_gate(engine, timeout=timeout)  # the process's writers take turns before SQLite's lock

    @event.listens_for(sync_engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # The driver must not open transactions by itself; `_on_begin` decides the BEGIN mode.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout = {busy_ms}")
        cursor.execute("PRAGMA journal_mode = WAL")
        cursor.execute(f"PRAGMA synchronous = {synchronous}")
        cursor.execute("PRAGMA foreign_keys = ON")
        cursor.close()
        # The plain step's blinded token comparison (store/attempts/step_commit.py: PostgreSQL has sha256 built in).
        dbapi_connection.create_function("candor_blind", 1, blind_hex, deterministic=True)

    @event.listens_for(sync_engine, "begin")
    def _on_begin(connection: Any) -> None:
        mode = connection.get_execution_options().get(BEGIN_OPTION, "IMMEDIATE")
        if mode not in ("IMMEDIATE", "DEFERRED", "EXCLUSIVE"):
            raise ValueError(f"unknown SQLite BEGIN mode {mode!r}")
        connection.exec_driver_sql(f"BEGIN {mode}")


def _replace_closed_connections(engine: AsyncEngine) -> None:
    """Discard, at checkout, a pooled connection whose socket the server closed (restart, terminated backend).

    This replaces `pool_pre_ping`, which costs three round trips (BEGIN, ping, ROLLBACK) before every transaction:
    a quarter of a checkpoint commit. asyncpg sees the server close an idle pooled connection as soon as the event
    loop reads the socket's end, so asking it is free. `DisconnectionError` makes the pool drop the connection and
    check out (or open) another one; a connection that dies mid-transaction still fails that transaction, as it
    would with a ping.
    """

    @event.listens_for(engine.sync_engine, "checkout")
    def _on_checkout(dbapi_connection: Any, _record: Any, _proxy: Any) -> None:
        if dbapi_connection.driver_connection.is_closed():
            raise DisconnectionError("the database server closed this pooled connection")


MIGRATION_LOCK_KEY = 0x63616E646F72  # "candor": the PostgreSQL advisory lock key of migrations


async def acquire_migration_lock(connection: AsyncConnection, *, timeout: float) -> None:
    """Take the migration lock inside the connection's open transaction, waiting at most `timeout` (§10.3).

    PostgreSQL: a transaction-scoped advisory lock bounded by `lock_timeout`. SQLite: the caller began the
    transaction with `BEGIN EXCLUSIVE` (execution option `BEGIN_OPTION`), which already holds the write lock;
    its wait is bounded by the busy timeout the engine was created with.
    """
    if dialect_name(connection) == "sqlite":
        return
    milliseconds = str(max(1, int(timeout * 1000)))
    await connection.execute(text("SELECT set_config('lock_timeout', :ms, true)"), {"ms": milliseconds})
    await connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK_KEY})
