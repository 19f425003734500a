"""Engines (§2.2): async drivers from operator URLs, SQLite WAL and BEGIN IMMEDIATE, the database clock, and the
translation of driver failures into `StoreUnavailable` (503 `unavailable`)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import asyncpg
import pytest
from sqlalchemy import bindparam, insert, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import IntegrityError

from candor.service.errors import StoreUnavailable
from candor.service.store.db.dialect import async_url
from candor.service.store.db.engine import (
    after_commit,
    create_engine,
    guarded_writes,
    read_transaction,
    write_transaction,
)
from candor.service.store.db.statements import fetch_rows
from candor.service.store.schema.dialect import db_now
from candor.service.store.schema.tables import workspaces

from .rows import add_workspace, new_id

_INSERT_WORKSPACE = (
    insert(workspaces)
    .values(id=bindparam("new_id"), name=bindparam("new_name"), created_at=db_now())
    .returning(workspaces.c.id)
)


@pytest.mark.parametrize(
    ("url", "driver"),
    [
        ("sqlite:///candor.db", "sqlite+aiosqlite"),
        ("sqlite+aiosqlite:////var/lib/candor.db", "sqlite+aiosqlite"),
        ("postgresql://u@h:5432/d", "postgresql+asyncpg"),
        ("postgres://u@h/d", "postgresql+asyncpg"),
        ("postgresql+asyncpg://u@h/d", "postgresql+asyncpg"),
    ],
)
def test_operator_urls_map_to_async_drivers(url: str, driver: str) -> None:
    """§2.2: `database.url` keeps the operator's spelling; the engine picks the async driver."""
    assert async_url(url).drivername == driver


@pytest.mark.parametrize("url", ["mysql://u@h/d", "sqlite://", "sqlite:///:memory:", "postgresql+psycopg2://u@h/d"])
def test_unsupported_urls_are_refused(url: str) -> None:
    with pytest.raises(ValueError):
        async_url(url)


async def test_database_clock(db: Any) -> None:
    """§2.2: `db_now()` reads the database clock as float epoch seconds on both dialects."""
    async with read_transaction(db.engine) as conn:
        now = (await conn.execute(select(db_now()))).scalar_one()
    assert abs(now - time.time()) < 5


async def test_sqlite_uses_wal_and_begin_immediate(tmp_path: Any) -> None:
    """§2.2: SQLite runs in WAL mode and a write transaction holds the writer lock from its BEGIN."""
    url = f"sqlite:///{tmp_path / 'lock.db'}"
    first, second = create_engine(url), create_engine(url, timeout=0.2)
    try:
        async with first.connect() as conn:
            assert (await conn.exec_driver_sql("PRAGMA journal_mode")).scalar() == "wal"
            assert (await conn.exec_driver_sql("PRAGMA foreign_keys")).scalar() == 1
        async with write_transaction(first):  # no statement yet: BEGIN IMMEDIATE already holds the lock
            with pytest.raises(StoreUnavailable) as caught:
                async with write_transaction(second):
                    pass
            assert caught.value.code == "unavailable"
            async with read_transaction(second) as conn:  # readers are not blocked in WAL mode
                assert (await conn.execute(text("SELECT 1"))).scalar() == 1
    finally:
        await first.dispose()
        await second.dispose()


async def test_unreachable_database_is_unavailable() -> None:
    """A refused connection surfaces as `StoreUnavailable`, never as a driver exception."""
    engine = create_engine("postgresql://postgres@127.0.0.1:1/none", timeout=1)
    try:
        with pytest.raises(StoreUnavailable):
            async with write_transaction(engine) as conn:
                await conn.execute(text("SELECT 1"))
    finally:
        await engine.dispose()


@pytest.mark.postgres
async def test_statement_timeout_is_unavailable(postgres_url: str) -> None:
    """PostgreSQL: `database.timeout` is the statement timeout; exceeding it → unavailable.

    (SQLite's counterpart, the busy timeout, is covered by the BEGIN IMMEDIATE test.)
    """
    engine = create_engine(postgres_url, timeout=0.2)
    try:
        with pytest.raises(StoreUnavailable):
            async with write_transaction(engine) as conn:
                await conn.execute(text("SELECT pg_sleep(2)"))
    finally:
        await engine.dispose()


async def test_integrity_errors_are_not_translated(db: Any) -> None:
    """Constraint violations stay `IntegrityError` for the statement modules to interpret."""
    with pytest.raises(IntegrityError):
        async with write_transaction(db.engine) as conn:
            await conn.execute(text("INSERT INTO workspaces (id, name, created_at) VALUES ('w', 'n', 1)"))
            await conn.execute(text("INSERT INTO workspaces (id, name, created_at) VALUES ('w', 'n', 1)"))
    async with write_transaction(db.engine) as conn:
        await add_workspace(conn)


@pytest.mark.postgres
async def test_a_connection_closed_by_the_server_is_replaced_at_checkout(postgres_url: str) -> None:
    """§2.2: a pooled connection whose backend was terminated (a restart, an operator) is not handed to the next
    transaction: it is replaced at checkout without a ping round trip, and the transaction succeeds."""
    engine = create_engine(postgres_url)
    try:
        async with write_transaction(engine) as conn:
            terminated_pid = (await conn.execute(text("SELECT pg_backend_pid()"))).scalar_one()
        admin = await asyncpg.connect(make_url(postgres_url).set(drivername="postgresql").render_as_string(False))
        try:
            assert await admin.fetchval("SELECT pg_terminate_backend($1)", terminated_pid)
        finally:
            await admin.close()
        await asyncio.sleep(0.2)  # the connection sits idle in the pool while the server closes it
        async with write_transaction(engine) as conn:
            assert (await conn.execute(text("SELECT pg_backend_pid()"))).scalar_one() != terminated_pid
    finally:
        await engine.dispose()


async def test_guarded_writes_commit_each_statement_on_postgresql_and_one_transaction_on_sqlite(db: Any) -> None:
    """§8.6 as `store/threads/resume.py` runs it (S-85): on PostgreSQL `guarded_writes` holds no transaction, each statement
    sent with `fetch_rows` commits on its own and another connection sees it before the block ends; on SQLite the
    block is one `BEGIN IMMEDIATE` transaction, committed when it ends. `after_commit` hooks run once the block has
    ended without an error, never after an error."""
    ran: list[str] = []
    async with guarded_writes(db.engine) as conn:
        workspace_id = new_id("wsp")
        await fetch_rows(conn, _INSERT_WORKSPACE, {"new_id": workspace_id, "new_name": workspace_id})
        after_commit(conn, lambda: ran.append("committed"))
        assert conn.in_transaction() == (db.kind == "sqlite")
        if db.kind == "postgresql":  # already committed: another connection sees it
            async with read_transaction(db.engine) as other:
                assert await other.scalar(select(workspaces.c.id).where(workspaces.c.id == workspace_id))
        assert ran == []
    assert ran == ["committed"]
    with pytest.raises(ValueError):
        async with guarded_writes(db.engine) as conn:
            after_commit(conn, lambda: ran.append("failed"))
            raise ValueError("the command refused")
    assert ran == ["committed"]


@pytest.mark.parametrize("db_kind", ["postgresql"], indirect=True)  # SQLite's block is a write transaction
async def test_guarded_writes_refuse_a_transaction_left_open(db: Any) -> None:
    """A statement sent through SQLAlchemy's `execute` begins a transaction that the connection's return would roll
    back: `guarded_writes` raises instead of dropping the write silently, and nothing is committed."""
    workspace_id = new_id("wsp")
    with pytest.raises(RuntimeError, match="left open"):
        async with guarded_writes(db.engine) as conn:
            await conn.execute(_INSERT_WORKSPACE, {"new_id": workspace_id, "new_name": workspace_id})
    async with read_transaction(db.engine) as other:
        assert await other.scalar(select(workspaces.c.id).where(workspaces.c.id == workspace_id)) is None
