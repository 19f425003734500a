"""Database fixtures (a plugin: `pytest_plugins` in tests/conftest.py): every store test runs on SQLite and on
PostgreSQL.

* `empty_db` – an empty database URL (`sqlite:///<tmp>/candor.db`, or a PostgreSQL database whose `public` schema
  was just dropped and recreated);
* `db` – a database migrated to head and holding no rows, with an engine (`TestDatabase`).

PostgreSQL: one database named `candor_test_<pid>_<hex>` is created per test session on the server at
`CANDOR_TEST_POSTGRES_URL` (default `postgresql://postgres@127.0.0.1:5432/test`) and dropped at the end. Every
`empty_db` test starts from an empty `public` schema; every `db` test starts from the migrated schema with all rows
deleted (the schema is rebuilt whenever a test may have changed it), so tests are independent. An unreachable
server skips the PostgreSQL cases, unless `CANDOR_REQUIRE_POSTGRES=1` (CI), which makes them fail.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import sqlite3
from collections.abc import AsyncIterator, Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import asyncpg
import pytest
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine

from candor.service.store.db.engine import create_engine
from candor.service.store.schema.migration import migrate
from candor.service.store.schema.tables import metadata

DEFAULT_POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/test"
POSTGRES_URL = os.environ.get("CANDOR_TEST_POSTGRES_URL", DEFAULT_POSTGRES_URL)
REQUIRE_POSTGRES = os.environ.get("CANDOR_REQUIRE_POSTGRES") == "1"

DbKind = Literal["sqlite", "postgresql"]
DB_KINDS = ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]


@dataclass(frozen=True)
class TestDatabase:
    """A migrated test database."""

    __test__ = False

    kind: DbKind
    url: str
    """Operator-style URL (`sqlite:///…`, `postgresql://…`), as `database.url` would hold it."""
    engine: AsyncEngine


def _run_in_thread(coroutine: Coroutine[Any, Any, Any]) -> Any:
    """Run a coroutine on a private loop, whatever loop the caller is in."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


def _dsn(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


async def _admin(statement: str) -> None:
    connection = await asyncpg.connect(_dsn(POSTGRES_URL), timeout=5)
    try:
        await connection.execute(statement)
    finally:
        await connection.close()


@dataclass
class _PostgresDatabase:
    url: str
    migrated: bool = False
    """Whether `public` holds exactly the migrated schema (then `db` only deletes rows, which is much faster)."""


@pytest.fixture(scope="session")
def postgres_database() -> Iterator[_PostgresDatabase]:
    """A database created for this test session on the server at `CANDOR_TEST_POSTGRES_URL`, dropped afterwards."""
    name = f"candor_test_{os.getpid()}_{secrets.token_hex(4)}"
    try:
        _run_in_thread(_admin(f'CREATE DATABASE "{name}"'))
    except (TimeoutError, OSError, asyncpg.PostgresError) as exc:
        message = f"PostgreSQL not reachable at {make_url(POSTGRES_URL)!r}: {type(exc).__name__}: {exc}"
        if REQUIRE_POSTGRES:
            pytest.fail(message + " (CANDOR_REQUIRE_POSTGRES=1)", pytrace=False)
        pytest.skip(message + " (set CANDOR_REQUIRE_POSTGRES=1 to fail instead)")
    url = make_url(POSTGRES_URL).set(drivername="postgresql", database=name)
    try:
        yield _PostgresDatabase(url=url.render_as_string(hide_password=False))
    finally:
        _run_in_thread(_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture
def postgres_url(postgres_database: _PostgresDatabase) -> str:
    """URL of the session's PostgreSQL database (contents unspecified; for tests that bring their own tables)."""
    postgres_database.migrated = False
    return postgres_database.url


@pytest.fixture(params=DB_KINDS)
def db_kind(request: pytest.FixtureRequest) -> DbKind:
    kind: DbKind = request.param  # one of DB_KINDS
    return kind


@pytest.fixture
def _postgres(db_kind: DbKind, request: pytest.FixtureRequest) -> _PostgresDatabase | None:
    return request.getfixturevalue("postgres_database") if db_kind == "postgresql" else None


async def _execute(url: str, statement: str) -> None:
    connection = await asyncpg.connect(_dsn(url), timeout=5)
    try:
        await connection.execute("SET lock_timeout = '10s'")
        await connection.execute(statement)
    finally:
        await connection.close()


_RESET_SCHEMA = "DROP SCHEMA IF EXISTS public CASCADE; CREATE SCHEMA public"
_DELETE_ROWS = "; ".join(f'DELETE FROM "{table.name}"' for table in reversed(metadata.sorted_tables))


@pytest.fixture
async def empty_db(_postgres: _PostgresDatabase | None, tmp_path: Any) -> str:
    """An empty database's URL: a new SQLite file, or the PostgreSQL session database with a fresh `public`."""
    if _postgres is None:
        return f"sqlite:///{tmp_path / 'candor.db'}"
    _postgres.migrated = False
    await _execute(_postgres.url, _RESET_SCHEMA)
    return _postgres.url


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite file migrated to head once per session; every SQLite `db` test starts from a copy of it."""
    path = tmp_path_factory.mktemp("sqlite-template") / "candor.db"
    _run_in_thread(migrate(f"sqlite:///{path}", lock_timeout=30))
    return path


def copy_sqlite(source: Path, target: Path) -> None:
    """A consistent copy through SQLite's backup API (the template may be in WAL mode)."""
    with contextlib.closing(sqlite3.connect(source)) as src, contextlib.closing(sqlite3.connect(target)) as dst:
        src.backup(dst)


@pytest.fixture
async def db(
    db_kind: DbKind, _postgres: _PostgresDatabase | None, tmp_path: Any, request: pytest.FixtureRequest
) -> AsyncIterator[TestDatabase]:
    """A database migrated to head and holding no rows, with an engine that is disposed afterwards.

    Tests must not change the schema through `db` (use `empty_db` for that): on PostgreSQL, consecutive `db` tests
    share the migrated schema and only its rows are deleted in between; on SQLite each test gets a copy of a file
    migrated once per session (`sqlite_template`), not a migration of its own.
    """
    if _postgres is None:
        path = tmp_path / "candor.db"
        copy_sqlite(request.getfixturevalue("sqlite_template"), path)
        url = f"sqlite:///{path}"
    else:
        url = _postgres.url
        if _postgres.migrated:
            await _execute(url, _DELETE_ROWS)
        else:
            await _execute(url, _RESET_SCHEMA)
            await migrate(url, lock_timeout=30)
            _postgres.migrated = True
    engine = create_engine(url)
    try:
        yield TestDatabase(kind=db_kind, url=url, engine=engine)
    finally:
        await engine.dispose()


@pytest.fixture
def restore_logging() -> Iterator[None]:
    """Put candor's and uvicorn's loggers back as they were after a test that configures logging."""
    loggers = [logging.getLogger(name) for name in ("candor", "uvicorn.error", "uvicorn.access")]
    saved = [(lg.handlers[:], lg.level, lg.propagate, lg.disabled) for lg in loggers]
    yield
    for lg, (handlers, level, propagate, disabled) in zip(loggers, saved, strict=True):
        lg.handlers[:] = handlers
        lg.setLevel(level)
        lg.propagate = propagate
        lg.disabled = disabled
