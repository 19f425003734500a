"""Statements sent straight on asyncpg, for the few paths every step or every request takes on PostgreSQL.

SQLAlchemy's `engine.connect()` and `execute()` cost the client more CPU than the round trip they wrap, so the
hottest statements go on the pooled connection's asyncpg connection. The plain step commit (`step_commit`) and request
authentication (`auth.authenticate_request`) use this module; everything else goes through SQLAlchemy.

The connection comes from the engine's own pool, so it carries the codecs SQLAlchemy's dialect set on it (JSON and
JSONB are decoded to Python values) and goes back to the same pool. Statements stay SQLAlchemy Core where they can:
`prepared_statement` compiles one once for the dialect, with its parameters in placeholder order.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, cast

import asyncpg
from sqlalchemy.engine import Dialect
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.sql import ClauseElement, Executable
from sqlalchemy.util import greenlet_spawn

from .engine import (
    UNAVAILABLE_SQLSTATE_PREFIXES,
    UNAVAILABLE_SQLSTATES,
    check_out,
    endpoint_of,
    translate_errors,
    unavailable,
)

__all__ = ("pooled_asyncpg", "driver_errors", "Prepared", "prepared_statement")


@asynccontextmanager
async def pooled_asyncpg(engine: AsyncEngine) -> AsyncIterator[asyncpg.Connection]:
    """A connection of the engine's pool, as the asyncpg connection, checked out and returned through the pool itself
    (`engine.check_out`, cheaper than `engine.connect()`).

    Errors that mean "unavailable" become `StoreUnavailable`, as `engine.translate_errors` does for SQLAlchemy's:
    asyncpg's own (lost connections, timeouts, lock waits, busy servers), the OS's and asyncio's, while checking out
    or while the body runs. A connection the body left inside a transaction (a cancelled call) is terminated, never
    handed back. Returning it otherwise does no I/O (nothing began a transaction through SQLAlchemy, so the pool's
    reset has nothing to roll back): no await a cancellation could interrupt, so no shield is needed.
    """
    with translate_errors(endpoint_of(engine)), driver_errors():
        pooled = await check_out(engine)
        connection: asyncpg.Connection = pooled.driver_connection
        try:
            yield connection
        finally:
            if not connection.is_closed() and connection.is_in_transaction():
                connection.terminate()
            await greenlet_spawn(pooled.close)


@contextmanager
def driver_errors() -> Iterator[None]:
    """asyncpg's errors that mean "unavailable" as `StoreUnavailable`; any other error as it is."""
    try:
        yield
    except (asyncpg.PostgresError, asyncpg.InterfaceError) as error:
        if _unavailable(error):
            raise unavailable(error) from error
        raise


def _unavailable(error: Exception) -> bool:
    """`engine.is_unavailable` for asyncpg's own errors: lost connections, timeouts, lock waits, busy servers."""
    if isinstance(error, asyncpg.InterfaceError):
        return True  # the connection is unusable (closed, or in an undefined state)
    sqlstate = getattr(error, "sqlstate", None) or ""
    return sqlstate in UNAVAILABLE_SQLSTATES or sqlstate.startswith(UNAVAILABLE_SQLSTATE_PREFIXES)


@dataclass(frozen=True, slots=True)
class Prepared:
    """A constant Core statement compiled once for asyncpg (`prepared_statement`): its SQL with `$n` placeholders,
    its parameters in placeholder order with the bind processor of each (JSON values are serialized as SQLAlchemy
    would), and the compiled form that fills in literal values. asyncpg keeps the SQL prepared per connection."""

    sql: str
    names: tuple[str, ...]
    processors: tuple[Callable[[Any], Any] | None, ...]
    compiled: Any

    def arguments(self, params: Mapping[str, Any]) -> list[Any]:
        values = self.compiled.construct_params(params)
        return [
            value if process is None else process(value)
            for value, process in zip((values[name] for name in self.names), self.processors, strict=True)
        ]


@lru_cache(maxsize=256)
def prepared_statement(statement: Executable, dialect: Dialect) -> Prepared:
    """`statement` prepared for `dialect`, once per statement object: pass constants built once."""
    compiled: Any = cast(ClauseElement, statement).compile(dialect=dialect)
    names = tuple(compiled.positiontup or ())
    binds = compiled.binds
    processors = tuple(binds[name].type.dialect_impl(dialect).bind_processor(dialect) for name in names)
    return Prepared(sql=str(compiled), names=names, processors=processors, compiled=compiled)
