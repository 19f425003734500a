"""Counting a test's committed write transactions through SQLAlchemy events (issue 12: what a step or a pass costs
in commits)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import event

__all__ = ("statements_sent", "write_transactions")


@contextmanager
def write_transactions(engine: Any) -> Iterator[list[list[str]]]:
    """The statements of every committed transaction that wrote something, one list per transaction."""
    done: list[list[str]] = []
    current: dict[int, list[str]] = {}

    def record(conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        current.setdefault(id(conn), []).append(" ".join(statement.split()).upper())

    def commit(conn: Any) -> None:
        sent = current.pop(id(conn), [])
        if any(word in s for s in sent for word in ("INSERT ", "UPDATE ", "DELETE ")):
            done.append(sent)

    def rollback(conn: Any) -> None:
        current.pop(id(conn), None)

    sync = engine.sync_engine
    event.listen(sync, "before_cursor_execute", record)
    event.listen(sync, "commit", commit)
    event.listen(sync, "rollback", rollback)
    try:
        yield done
    finally:
        event.remove(sync, "before_cursor_execute", record)
        event.remove(sync, "commit", commit)
        event.remove(sync, "rollback", rollback)


@contextmanager
def statements_sent(engine: Any) -> Iterator[list[str]]:
    """Every statement SQLAlchemy sends meanwhile, whitespace collapsed and upper-cased (the PostgreSQL step
    commits go to asyncpg directly and are not among them)."""
    sent: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        sent.append(" ".join(statement.split()).upper())

    event.listen(engine.sync_engine, "before_cursor_execute", record)
    try:
        yield sent
    finally:
        event.remove(engine.sync_engine, "before_cursor_execute", record)
