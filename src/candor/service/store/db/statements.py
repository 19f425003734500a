"""Running the hot constant statements: several writes in one round trip (`execute_together`), and a statement
sent on asyncpg directly, inside the caller's transaction or, outside one, committing on its own (`fetch_rows`).

Through SQLAlchemy's `AsyncConnection.execute` a statement costs the client its execution path (a greenlet hop, the
compiled-cache lookup, an execution context, result processing) on top of asyncpg's own work, so the resume sends its
read and its guarded write this way, outside any transaction. `fetch_rows` sends a constant Core statement, compiled
once, on the same connection and in the same transaction if there is one, so callers keep SQLAlchemy's transactions, its
SQLite support and its error types.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

import asyncpg
from sqlalchemy import exc as sa_exc
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql import Executable
from sqlalchemy.sql.dml import UpdateBase

from .dialect import statements_on_driver, writes_as_ctes
from .pg_driver import driver_errors, prepared_statement

__all__ = ("execute_together", "fetch_rows")


async def execute_together(
    conn: AsyncConnection, leading: Sequence[UpdateBase], last: UpdateBase, params: Mapping[str, Any]
) -> Sequence[Mapping[Any, Any]]:
    """Execute the writes `leading`, then `last` (which returns rows), with `params`, in one round trip where the
    database allows; returns `last`'s rows (`fetch_rows`).

    PostgreSQL: one statement, `leading` attached to `last` as data-modifying CTEs. They all see the snapshot the
    statement starts with, not each other's rows, and foreign keys are checked when the statement ends, so the
    writes must not read what another of them writes (inserting rows that reference each other is fine). SQLite
    has no data-modifying CTEs: one statement after the other, in order. A checkpoint commit sends its rows this
    way (§7.8): every round trip inside the fenced transaction is paid at every durable step. The statements share
    `params`, so no parameter name may also be a column name of a table they write (SQLAlchemy would take it as a
    value for that column); give constant statements (built once) so the combined one is built once too.
    """
    if leading and writes_as_ctes(conn):
        return await fetch_rows(conn, _with_ctes(last, tuple(leading)), params)
    for statement in leading:
        await conn.execute(statement, params)
    return await fetch_rows(conn, last, params)


@lru_cache(maxsize=256)
def _with_ctes(last: UpdateBase, leading: tuple[UpdateBase, ...]) -> UpdateBase:
    return last.add_cte(*(statement.cte(f"write_{position}") for position, statement in enumerate(leading)))


async def fetch_rows(
    conn: AsyncConnection, statement: Executable, params: Mapping[str, Any]
) -> Sequence[Mapping[Any, Any]]:
    """The rows of `statement` (a constant Core statement, built once) run with `params` on `conn`, as mappings.

    On PostgreSQL it is sent on `conn`'s asyncpg connection, inside `conn`'s transaction (outside one it commits on
    its own: `engine.guarded_writes`), skipping SQLAlchemy's
    execution path (compiled once, `pg_driver.prepared_statement`); the rows are asyncpg records, read by column
    name like `.mappings()` rows, with the same values (the connection's codecs decode JSON). Two cases still go
    through SQLAlchemy: SQLite, and a transaction SQLAlchemy has begun but not yet sent (it emits BEGIN with its
    first statement, so that statement must be its own). Errors
    read as SQLAlchemy's would to the callers: an integrity violation is `sqlalchemy.exc.IntegrityError`
    (`dialect.violated_constraint` names the constraint), and "unavailable" is `StoreUnavailable`.
    """
    if not statements_on_driver(conn):
        return (await conn.execute(statement, params)).mappings().all()
    pg = await _driver_of(conn)
    if conn.in_transaction() and not pg.is_in_transaction():
        return (await conn.execute(statement, params)).mappings().all()
    prepared = prepared_statement(statement, conn.dialect)
    arguments = prepared.arguments(params)
    with driver_errors():
        try:
            rows: list[asyncpg.Record] = await pg.fetch(prepared.sql, *arguments)
            return rows
        except asyncpg.IntegrityConstraintViolationError as error:
            raise sa_exc.IntegrityError(prepared.sql, arguments, error) from error


_DRIVER = "candor.asyncpg_connection"


async def _driver_of(conn: AsyncConnection) -> asyncpg.Connection:
    """The asyncpg connection under `conn`, remembered in the pooled connection's `info` (which lives as long as that
    database connection: a replaced connection starts with an empty one)."""
    info = conn.info
    driver: asyncpg.Connection | None = info.get(_DRIVER)
    if driver is None:
        driver = info[_DRIVER] = (await conn.get_raw_connection()).driver_connection
    return driver
