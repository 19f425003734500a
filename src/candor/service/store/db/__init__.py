"""Engines and transactions, connection budgets, statements straight on asyncpg, the SQLite writer gate, the
connection-level dialect branches and the words for an unreachable database.

This is the face code outside `store/` imports; modules inside `store/` import each other directly.
"""

from __future__ import annotations

from .connections import application_name, check_server_budget, connection_budget, watch_connections
from .dialect import async_url, display_url, is_postgresql_url
from .engine import (
    Engine,
    WriteConnection,
    bind_key_ring,
    create_engine,
    guarded_writes,
    is_unavailable,
    read_transaction,
    write_transaction,
)
from .unreachable import unreachable_message

__all__ = (
    "Engine",
    "WriteConnection",
    "application_name",
    "async_url",
    "bind_key_ring",
    "check_server_budget",
    "connection_budget",
    "create_engine",
    "display_url",
    "guarded_writes",
    "is_postgresql_url",
    "is_unavailable",
    "read_transaction",
    "unreachable_message",
    "watch_connections",
    "write_transaction",
)
