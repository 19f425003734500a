"""Workspaces, keys, authentication and the run authority check (§4): S-61, S-62, S-127, S-128, S-130."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
from sqlalchemy import event, select

from candor.service.errors import AlreadyBootstrapped, AlreadyExists, InvalidArgument, NotFound
from candor.service.store.db.engine import read_transaction, write_transaction
from candor.service.store.schema.tables import principals, workspaces
from candor.service.store.workspaces import auth as auth

from commands.helpers import count, make_service, new_key, new_workspace


async def test_bootstrap_creates_admin_key_and_stores_only_the_hash(db: Any) -> None:
    """S-130: bootstrap makes the first workspace and an admin key; only the SHA-256 of the secret is stored."""
    service = make_service(db)
    async with write_transaction(service.engine) as conn:
        made = await auth.bootstrap(conn, entropy=service.entropy)
    printed = made.printed()
    assert set(printed) == {"workspace_id", "key_id", "secret"}
    assert printed["workspace_id"].startswith("wsp_") and printed["key_id"].startswith("key_")
    assert printed["secret"].startswith("cnd_") and len(printed["secret"]) == 4 + 43
    async with read_transaction(service.engine) as conn:
        row = (await conn.execute(select(principals))).mappings().one()
        assert row["secret_hash"] == hashlib.sha256(printed["secret"].encode()).hexdigest()
        assert printed["secret"] not in {str(value) for value in row.values()}
        assert sorted(row["permissions"]) == ["admin", "read", "run"]
        found = await auth.authenticate(conn, printed["secret"])
    assert found is not None and found.principal.id == printed["key_id"] and not found.workspace_archived


async def test_bootstrap_refuses_when_any_workspace_exists(db: Any) -> None:
    """S-130: a second bootstrap refuses and changes nothing."""
    service = make_service(db)
    await new_workspace(service)
    with pytest.raises(AlreadyBootstrapped):
        async with write_transaction(service.engine) as conn:
            await auth.bootstrap(conn, entropy=service.entropy)
    assert await count(service, workspaces) == 1
    assert await count(service, principals) == 0


async def test_authenticate_refuses_unknown_and_disabled_keys(db: Any) -> None:
    """§4.2: an unknown secret or a disabled key does not authenticate."""
    service = make_service(db)
    workspace_id = await new_workspace(service)
    async with write_transaction(service.engine) as conn:
        created = await auth.create_principal(
            conn, workspace_id=workspace_id, permissions=["read"], entropy=service.entropy
        )
        assert await auth.authenticate(conn, created.secret) is not None
        assert await auth.authenticate(conn, created.secret + "x") is None
        assert await auth.authenticate(conn, "") is None
        first = await auth.disable_principal(conn, principal_id=created.principal.id)
        again = await auth.disable_principal(conn, principal_id=created.principal.id)
        assert again.disabled_at == first.disabled_at
        assert await auth.authenticate(conn, created.secret) is None


async def test_archived_workspace_still_authenticates_for_reads(db: Any) -> None:
    """S-128: keys of an archived workspace authenticate, flagged, so GETs keep working."""
    service = make_service(db)
    workspace_id = await new_workspace(service)
    async with write_transaction(service.engine) as conn:
        created = await auth.create_principal(
            conn, workspace_id=workspace_id, permissions=["read", "run"], entropy=service.entropy
        )
        first = await auth.archive_workspace(conn, workspace_id)
        again = await auth.archive_workspace(conn, workspace_id)
        found = await auth.authenticate(conn, created.secret)
    assert first.archived_at is not None and again.archived_at == first.archived_at
    assert found is not None and found.workspace_archived


async def test_workspace_names_are_unique_and_listed(db: Any) -> None:
    """§5.1: workspace names are unique; list shows every workspace."""
    service = make_service(db)
    async with write_transaction(service.engine) as conn:
        await auth.create_workspace(conn, name="acme", entropy=service.entropy)
    with pytest.raises(AlreadyExists):
        async with write_transaction(service.engine) as conn:
            await auth.create_workspace(conn, name="acme", entropy=service.entropy)
    async with read_transaction(service.engine) as conn:
        assert [w.name for w in await auth.list_workspaces(conn)] == ["acme"]
    with pytest.raises(NotFound):
        async with write_transaction(service.engine) as conn:
            await auth.archive_workspace(conn, "wsp_" + "0" * 32)


@pytest.mark.parametrize("permissions", [["read", "write"], "run", ["owner"]])
async def test_permissions_must_be_read_run_admin(db: Any, permissions: Any) -> None:
    """§4.2: permissions ⊆ {read, run, admin}."""
    service = make_service(db)
    workspace_id = await new_workspace(service)
    with pytest.raises(InvalidArgument) as caught:
        async with write_transaction(service.engine) as conn:
            await auth.create_principal(
                conn, workspace_id=workspace_id, permissions=permissions, entropy=service.entropy
            )
    assert caught.value.fields == (("permissions", "unknown_permission"),)


async def test_run_authority_check(db: Any) -> None:
    """S-61, S-62, S-127, §4.3: allowed; refused once disabled, without `run`, in an archived workspace, or missing."""
    service = make_service(db)
    key = await new_key(service)
    other = await new_key(service)
    async with write_transaction(service.engine) as conn:
        assert await auth.check_run_authority(conn, key.id) == "allowed"
        assert await auth.check_run_authority(conn, "key_" + "0" * 32) == "refused"
        await auth.set_permissions(conn, principal_id=key.id, permissions=["read"])
        assert await auth.check_run_authority(conn, key.id) == "refused"  # S-62
        await auth.set_permissions(conn, principal_id=key.id, permissions=["read", "run"])
        assert await auth.check_run_authority(conn, key.id) == "allowed"
        await auth.disable_principal(conn, principal_id=key.id)
        assert await auth.check_run_authority(conn, key.id) == "refused"  # S-61
        assert await auth.check_run_authority(conn, other.id) == "allowed"
        await auth.archive_workspace(conn, other.workspace_id)
        assert await auth.check_run_authority(conn, other.id) == "refused"  # S-127


async def test_key_management_is_scoped_to_its_workspace(db: Any) -> None:
    """S-126: a key id of another workspace is not found."""
    service = make_service(db)
    key = await new_key(service)
    other_workspace = await new_workspace(service)
    with pytest.raises(NotFound):
        async with write_transaction(service.engine) as conn:
            await auth.disable_principal(conn, principal_id=key.id, workspace_id=other_workspace)
    async with read_transaction(service.engine) as conn:
        assert await auth.list_principals(conn, workspace_id=other_workspace) == []
        assert [p.id for p in await auth.list_principals(conn, workspace_id=key.workspace_id)] == [key.id]


async def test_a_request_authenticates_in_one_statement_outside_sqlalchemy_on_postgresql(db: Any) -> None:
    """§4.2, S-101, S-128: `authenticate_request` (what every API request runs) finds a key's principal, refuses an
    unknown secret, an empty one and a disabled key from its next request, and flags an archived workspace; on
    PostgreSQL it sends its one statement on asyncpg directly (nothing through SQLAlchemy's execute)."""
    service = make_service(db)
    workspace_id = await new_workspace(service)
    async with write_transaction(service.engine) as conn:
        created = await auth.create_principal(
            conn, workspace_id=workspace_id, permissions=["read", "run"], entropy=service.entropy
        )
    statements: list[str] = []
    listen = service.engine.sync_engine
    record = lambda *args: statements.append(args[2])  # noqa: E731 - (conn, cursor, statement, ...)
    event.listen(listen, "before_cursor_execute", record)
    try:
        found = await auth.authenticate_request(service.engine, created.secret)
        unknown = await auth.authenticate_request(service.engine, created.secret + "x")
        empty = await auth.authenticate_request(service.engine, "")
    finally:
        event.remove(listen, "before_cursor_execute", record)
    assert found is not None and not found.workspace_archived
    assert (found.principal.id, found.principal.workspace_id) == (created.principal.id, workspace_id)
    assert found.principal.permissions == frozenset({"read", "run"})
    assert unknown is None and empty is None
    assert (statements == []) == (db.kind == "postgresql")  # SQLite reads through SQLAlchemy, in a transaction
    async with write_transaction(service.engine) as conn:
        await auth.archive_workspace(conn, workspace_id)
    archived = await auth.authenticate_request(service.engine, created.secret)
    assert archived is not None and archived.workspace_archived
    async with write_transaction(service.engine) as conn:
        await auth.disable_principal(conn, principal_id=created.principal.id)
    assert await auth.authenticate_request(service.engine, created.secret) is None
