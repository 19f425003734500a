"""Statements straight on asyncpg (`store/db/pg_driver.py`): errors that mean "unavailable" become `StoreUnavailable`
(503 `unavailable`) as they do through SQLAlchemy, others stay the driver's; a connection the body left inside a
transaction never goes back to the pool; Core statements are compiled once with their parameters in order."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest
from sqlalchemy import bindparam, select

from candor.service.errors import StoreUnavailable
from candor.service.store.db.engine import create_engine
from candor.service.store.db.pg_driver import pooled_asyncpg, prepared_statement
from candor.service.store.schema.tables import principals

pytestmark = pytest.mark.postgres


async def test_an_unreachable_server_is_unavailable() -> None:
    engine = create_engine("postgresql://postgres@127.0.0.1:1/none", timeout=1)
    try:
        with pytest.raises(StoreUnavailable):
            async with pooled_asyncpg(engine) as pg:
                await pg.fetchval("SELECT 1")
    finally:
        await engine.dispose()


async def test_a_statement_timeout_is_unavailable_and_other_errors_stay_the_drivers(postgres_url: str) -> None:
    engine = create_engine(postgres_url, timeout=0.2)
    try:
        with pytest.raises(StoreUnavailable):
            async with pooled_asyncpg(engine) as pg:
                await pg.execute("SELECT pg_sleep(2)")
        with pytest.raises(asyncpg.UndefinedTableError):
            async with pooled_asyncpg(engine) as pg:
                await pg.fetchval("SELECT 1 FROM no_such_table")
        async with pooled_asyncpg(engine) as pg:  # the pool still hands out working connections
            assert await pg.fetchval("SELECT 1") == 1
    finally:
        await engine.dispose()


async def test_a_connection_left_inside_a_transaction_is_terminated_not_pooled(postgres_url: str) -> None:
    """A cancelled body can leave its transaction open: the next checkout must never find it open."""
    engine = create_engine(postgres_url)
    try:
        with pytest.raises(asyncio.CancelledError):
            async with pooled_asyncpg(engine) as pg:
                await pg.execute("BEGIN")
                left = pg
                raise asyncio.CancelledError
        assert left.is_closed()
        async with pooled_asyncpg(engine) as pg:
            assert not pg.is_in_transaction()
            assert await pg.fetchval("SELECT 1") == 1
    finally:
        await engine.dispose()


def test_a_prepared_statement_sends_each_argument_in_its_placeholders_place() -> None:
    """The arguments follow the `$n` order of the compiled SQL, whatever order the mapping has, with SQLAlchemy's
    bind processing (a JSON value goes as its JSON text) and the statement's own literal values filled in."""
    dialect = create_engine("postgresql://postgres@127.0.0.1:1/none").dialect
    statement = select(principals.c.id).where(
        principals.c.workspace_id == bindparam("workspace"),
        principals.c.permissions == bindparam("permissions", type_=principals.c.permissions.type),
        principals.c.secret_hash == bindparam("hash"),
        principals.c.name == "fixed",
    )
    prepared = prepared_statement(statement, dialect)
    assert "principals.workspace_id = $1" in prepared.sql and "principals.secret_hash = $3" in prepared.sql
    arguments = prepared.arguments({"hash": "h", "permissions": ["read"], "workspace": "w"})
    assert arguments == ["w", '["read"]', "h", "fixed"]
    assert prepared_statement(statement, dialect) is prepared  # compiled once
