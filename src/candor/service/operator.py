"""Operator actions behind `candor bootstrap`, `candor workspace …` and `candor key …` (spec §4.4).

Each action checks that the database schema is exactly the build's (S-122: no process operates on another
schema, bootstrap included) and runs in one write transaction.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection
from typing import Any, TypeVar

from .runtime import Entropy, SystemEntropy
from .settings import ServiceSettings
from .store import auth
from .store.engine import create_engine, read_transaction, write_transaction
from .store.migrate import require_current_schema

T = TypeVar("T")

__all__ = (
    "bootstrap",
    "create_workspace",
    "archive_workspace",
    "list_workspaces",
    "create_key",
    "disable_key",
)


async def _in_transaction(
    settings: ServiceSettings, action: Callable[[Any], Awaitable[T]], *, write: bool = True
) -> T:
    await require_current_schema(settings.database.url, timeout=settings.database.timeout)
    engine = create_engine(settings.database.url, timeout=settings.database.timeout)
    try:
        transaction = write_transaction if write else read_transaction
        async with transaction(engine) as conn:
            return await action(conn)
    finally:
        await engine.dispose()


async def bootstrap(settings: ServiceSettings, *, entropy: Entropy | None = None) -> dict[str, str]:
    """The first workspace and its admin key; refuses when any workspace exists (S-130)."""
    source = entropy or SystemEntropy()
    created = await _in_transaction(settings, lambda conn: auth.bootstrap(conn, entropy=source))
    return created.printed()


async def create_workspace(settings: ServiceSettings, name: str, *, entropy: Entropy | None = None) -> dict[str, Any]:
    source = entropy or SystemEntropy()
    row = await _in_transaction(settings, lambda conn: auth.create_workspace(conn, name=name, entropy=source))
    return {"workspace_id": row.id, "name": row.name}


async def archive_workspace(settings: ServiceSettings, workspace_id: str) -> dict[str, Any]:
    """Immediate and irreversible; running runs fail `authority_revoked` at their next heartbeat (S-127)."""
    row = await _in_transaction(settings, lambda conn: auth.archive_workspace(conn, workspace_id))
    return {"workspace_id": row.id, "archived_at": row.archived_at}


async def list_workspaces(settings: ServiceSettings) -> list[dict[str, Any]]:
    rows = await _in_transaction(settings, auth.list_workspaces, write=False)
    return [{"workspace_id": r.id, "name": r.name, "archived_at": r.archived_at} for r in rows]


async def create_key(
    settings: ServiceSettings,
    workspace_id: str,
    permissions: Collection[str],
    *,
    name: str = "key",
    entropy: Entropy | None = None,
) -> dict[str, Any]:
    """A new API key; the secret is printed once and only its hash is stored (S-130)."""
    source = entropy or SystemEntropy()
    created = await _in_transaction(
        settings,
        lambda conn: auth.create_principal(
            conn, workspace_id=workspace_id, permissions=permissions, entropy=source, name=name
        ),
    )
    return {
        "workspace_id": workspace_id,
        "key_id": created.principal.id,
        "permissions": sorted(created.principal.permissions),
        "secret": created.secret,
    }


async def disable_key(settings: ServiceSettings, key_id: str) -> dict[str, Any]:
    row = await _in_transaction(settings, lambda conn: auth.disable_principal(conn, principal_id=key_id))
    return {"key_id": row.id, "disabled_at": row.disabled_at}
