"""Operator actions behind `candor bootstrap`, `candor workspace …` and `candor key …` (spec §4.4).

Each action checks that the database schema is exactly the build's (S-122: no process operates on another
schema, bootstrap included) and runs in one write transaction.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar

from .errors import NotFound
from .runtime import Entropy, SystemEntropy
from .settings import ServiceSettings
from .store import workspaces as auth
from .store.db import create_engine, display_url, read_transaction, write_transaction
from .store.schema import require_current_schema

T = TypeVar("T")

__all__ = (
    "bootstrap",
    "create_workspace",
    "archive_workspace",
    "list_workspaces",
    "create_key",
    "disable_key",
    "enable_key",
    "list_keys",
    "rfc3339",
    "startup_lines",
    "has_workspace",
)


def rfc3339(timestamp: float | None) -> str | None:
    """A stored epoch timestamp as RFC 3339 UTC, the form the HTTP API uses (`2026-01-01T00:00:00.000000Z`)."""
    if timestamp is None:
        return None
    return datetime.fromtimestamp(timestamp, UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def startup_lines(settings: ServiceSettings, role: str, *, agents: Sequence[str], workspace_exists: bool) -> list[str]:
    """What `candor serve` prints when it is ready: role, address, database (no password), hosted agents, and how
    to create the first workspace when there is none."""
    database = display_url(settings.database.url)
    lines = [f"candor serve: role {role}, database {database}"]
    if role in ("all", "control"):
        lines.append(f"listening on http://{settings.server.listen} (API docs at /v1/docs)")
    else:
        lines.append(f"listening on http://{settings.server.listen} (health and metrics only)")
    if role in ("all", "worker"):
        lines.append("agents: " + (", ".join(sorted(agents)) or "none configured"))
    if not workspace_exists:
        lines.append("no workspace yet: run `candor bootstrap` to create one and print its admin key")
    return lines


async def has_workspace(engine: Any) -> bool:
    """Whether the database holds at least one workspace."""
    async with read_transaction(engine) as conn:
        return bool(await auth.list_workspaces(conn))


async def _in_transaction(settings: ServiceSettings, action: Callable[[Any], Awaitable[T]], *, write: bool = True) -> T:
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
    return {"workspace_id": row.id, "archived_at": rfc3339(row.archived_at)}


async def list_workspaces(settings: ServiceSettings) -> list[dict[str, Any]]:
    rows = await _in_transaction(settings, auth.list_workspaces, write=False)
    return [{"workspace_id": r.id, "name": r.name, "archived_at": rfc3339(r.archived_at)} for r in rows]


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


def _key(row: auth.PrincipalRow) -> dict[str, Any]:
    return {
        "key_id": row.id,
        "workspace_id": row.workspace_id,
        "name": row.name,
        "permissions": sorted(row.permissions),
        "disabled_at": rfc3339(row.disabled_at),
        "created_at": rfc3339(row.created_at),
    }


async def disable_key(settings: ServiceSettings, key_id: str) -> dict[str, Any]:
    row = await _in_transaction(settings, lambda conn: auth.disable_principal(conn, principal_id=key_id))
    return {"key_id": row.id, "disabled_at": rfc3339(row.disabled_at)}


async def enable_key(settings: ServiceSettings, key_id: str) -> dict[str, Any]:
    """Enable a disabled key again; enabling an enabled key changes nothing."""

    async def enable(conn: Any) -> auth.PrincipalRow:
        found = await auth.get_principal(conn, principal_id=key_id)
        current = (
            None
            if found is None
            else await auth.lock_principal(conn, principal_id=key_id, workspace_id=found.workspace_id)
        )
        if current is None:
            raise NotFound("key", key_id)
        return await auth.update_principal(conn, current, disabled=False)

    return _key(await _in_transaction(settings, enable))


async def list_keys(settings: ServiceSettings, workspace_id: str) -> list[dict[str, Any]]:
    """A workspace's keys, oldest first (never a secret or hash)."""

    async def keys(conn: Any) -> Sequence[auth.PrincipalRow]:
        if await auth.get_workspace(conn, workspace_id) is None:
            raise NotFound("workspace", workspace_id)
        return await auth.list_principals(conn, workspace_id=workspace_id)

    return [_key(row) for row in await _in_transaction(settings, keys, write=False)]
