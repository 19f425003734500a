"""What an operator reads when the database cannot be reached: where candor looked, and why it failed.

"database unreachable (StoreUnavailable)" named neither; a person with three PostgreSQL servers on the network
needs the host and port to know which one is down, and "connection refused" apart from "timed out".
"""

from __future__ import annotations

from sqlalchemy.engine import make_url

from ...protocol.db_faults import plain_cause
from .dialect import is_postgresql_url

__all__ = ("database_location", "unreachable_message")

_POSTGRESQL_PORT = 5432


def database_location(url: str) -> str:
    """Where `url` points, never its password: `db.internal:5432/candor` for PostgreSQL (the default port
    spelled out), the file path for SQLite."""
    parsed = make_url(url)
    if not is_postgresql_url(url):  # SQLite, the only other backend (dialect.async_url refuses the rest)
        return f"file {parsed.database}"
    host = parsed.host or "localhost"
    port = parsed.port or _POSTGRESQL_PORT
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return f"{where}/{parsed.database}" if parsed.database else where


def unreachable_message(url: str, error: BaseException) -> str:
    """`database unreachable at 127.0.0.1:5432/candor (connection refused)`: the cause in the words of
    `protocol/db_faults.plain_cause`, the same chain the log lines read."""
    return f"database unreachable at {database_location(url)} ({plain_cause(error)})"
