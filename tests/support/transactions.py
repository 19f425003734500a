"""Counting a test's committed write transactions through SQLAlchemy events (issue 12: what a step or a pass costs
in commits)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import asyncpg
from sqlalchemy import event

__all__ = ("statements_sent", "write_transactions", "sent_in_transactions_on_driver")


@contextmanager
def write_transactions(engine: Any) -> Iterator[list[list[str]]]:
    """The statements of every committed transaction that wrote something, one list per transaction (those
    `statements.fetch_rows` sends on asyncpg inside it included)."""
    done: list[list[str]] = []
    current: dict[int, list[str]] = {}

    def record_on_driver(driver: Any, statement: str) -> None:
        current.setdefault(id(driver), []).append(" ".join(statement.split()).upper())

    def record(conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        record_on_driver(conn.connection.driver_connection, statement)

    def commit(conn: Any) -> None:
        sent = current.pop(id(conn.connection.driver_connection), [])
        if any(word in s for s in sent for word in ("INSERT ", "UPDATE ", "DELETE ")):
            done.append(sent)

    def rollback(conn: Any) -> None:
        current.pop(id(conn.connection.driver_connection), None)

    sync = engine.sync_engine
    event.listen(sync, "before_cursor_execute", record)
    event.listen(sync, "commit", commit)
    event.listen(sync, "rollback", rollback)
    try:
        with sent_in_transactions_on_driver(record_on_driver):
            yield done
    finally:
        event.remove(sync, "before_cursor_execute", record)
        event.remove(sync, "commit", commit)
        event.remove(sync, "rollback", rollback)


@contextmanager
def statements_sent(engine: Any) -> Iterator[list[str]]:
    """Every statement SQLAlchemy sends meanwhile, and those `statements.fetch_rows` sends on asyncpg inside its
    transactions, whitespace collapsed and upper-cased (the PostgreSQL step commits go to asyncpg directly, outside
    any SQLAlchemy transaction, and are not among them)."""
    sent: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        sent.append(" ".join(statement.split()).upper())

    event.listen(engine.sync_engine, "before_cursor_execute", record)
    try:
        with sent_in_transactions_on_driver(lambda _driver, statement: record(None, None, statement)):
            yield sent
    finally:
        event.remove(engine.sync_engine, "before_cursor_execute", record)


@contextmanager
def sent_in_transactions_on_driver(record: Callable[[Any, str], None]) -> Iterator[None]:
    """Call `record(asyncpg_connection, statement)` for each statement `statements.fetch_rows` sends on asyncpg,
    which no SQLAlchemy event sees. It is the one caller of `asyncpg.Connection.fetch` (SQLAlchemy runs prepared
    statements, the step commits `fetchrow`), so wrapping that method records exactly these, in order."""
    original = asyncpg.Connection.fetch

    async def fetch(self: Any, query: str, *args: Any, **kwargs: Any) -> Any:
        record(self, query)
        return await original(self, query, *args, **kwargs)

    asyncpg.Connection.fetch = fetch
    try:
        yield
    finally:
        asyncpg.Connection.fetch = original
