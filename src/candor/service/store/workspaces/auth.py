"""Workspaces and principals (spec §4): tenants, API keys hashed at rest, authentication and the authority check.

* A secret is `"cnd_" + token_urlsafe(32)` drawn from the injected entropy; only its SHA-256 hex is stored, and a
  presented secret is looked up by that hash and then compared with `hmac.compare_digest` (§4.2, S-130).
* `authenticate()` refuses unknown and disabled keys; a key of an archived workspace still authenticates, with
  `workspace_archived` set, because reads keep working there (S-128).
* `check_run_authority()` is the §4.3 check the worker runs before an attempt and at every heartbeat; commands use
  `read_authority()` for the same facts under their own transaction.
"""

from __future__ import annotations

import base64
import hmac
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Select, and_, bindparam, func, insert, or_, select, update
from sqlalchemy import exc as sa_exc
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.sql import Subquery

from ...errors import AlreadyBootstrapped, AlreadyExists, InvalidArgument, NotFound
from ...protocol.authority import PERMISSIONS, AuthorityVerdict, Principal, decide_authority
from ...protocol.canonical import sha256_hex
from ...protocol.requests import checked_name
from ...runtime import Entropy
from ..db.dialect import statements_on_driver
from ..db.engine import is_unavailable, read_transaction
from ..db.pg_driver import pooled_asyncpg, prepared_statement
from ..schema.dialect import db_now
from ..schema.tables import principals, workspaces

__all__ = (
    "SECRET_PREFIX",
    "WorkspaceRow",
    "PrincipalRow",
    "CreatedKey",
    "Bootstrapped",
    "Authenticated",
    "AuthorityFacts",
    "new_id",
    "new_secret",
    "hash_secret",
    "checked_permissions",
    "create_workspace",
    "archive_workspace",
    "list_workspaces",
    "get_workspace",
    "create_principal",
    "get_principal",
    "list_principals",
    "lock_principal",
    "count_enabled_admins",
    "update_principal",
    "disable_principal",
    "set_permissions",
    "authenticate",
    "authenticate_request",
    "bootstrap",
    "read_authority",
    "authority_facts",
    "authority_subquery",
    "principals_authority",
    "check_run_authority",
)

SECRET_PREFIX = "cnd_"


@dataclass(frozen=True, kw_only=True, slots=True)
class WorkspaceRow:
    id: str
    name: str
    archived_at: float | None
    created_at: float

    @classmethod
    def from_mapping(cls, row: Mapping[Any, Any]) -> WorkspaceRow:
        return cls(id=row["id"], name=row["name"], archived_at=row["archived_at"], created_at=row["created_at"])


@dataclass(frozen=True, kw_only=True, slots=True)
class PrincipalRow:
    """A principal (API key) without its secret hash."""

    id: str
    workspace_id: str
    name: str
    permissions: frozenset[str]
    disabled_at: float | None
    version: int
    created_at: float

    @classmethod
    def from_mapping(cls, row: Mapping[Any, Any]) -> PrincipalRow:
        return cls(
            id=row["id"],
            workspace_id=row["workspace_id"],
            name=row["name"],
            permissions=frozenset(row["permissions"]),
            disabled_at=row["disabled_at"],
            version=row["version"],
            created_at=row["created_at"],
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class CreatedKey:
    principal: PrincipalRow
    secret: str
    """Shown once; only its hash is stored."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Bootstrapped:
    workspace: WorkspaceRow
    key: CreatedKey

    def printed(self) -> dict[str, str]:
        """§4.4: the one JSON object `candor bootstrap` prints."""
        return {"workspace_id": self.workspace.id, "key_id": self.key.principal.id, "secret": self.key.secret}


@dataclass(frozen=True, kw_only=True, slots=True)
class Authenticated:
    principal: Principal
    workspace_archived: bool
    """S-128: reads keep working; writes answer `disabled`."""


@dataclass(frozen=True, kw_only=True, slots=True)
class AuthorityFacts:
    """What the §4.3 check looks at, read without locks."""

    principal_exists: bool
    principal_disabled: bool
    permissions: frozenset[str]
    workspace_id: str | None
    workspace_archived: bool

    def verdict(self) -> AuthorityVerdict:
        return decide_authority(self, workspace_archived=self.workspace_archived)


_MISSING = AuthorityFacts(
    principal_exists=False,
    principal_disabled=False,
    permissions=frozenset(),
    workspace_id=None,
    workspace_archived=False,
)


def new_id(prefix: str, entropy: Entropy) -> str:
    """`<prefix>_` + 32 lowercase hex digits (§4.1) drawn from `entropy`."""
    return f"{prefix}_{entropy.token_bytes(16).hex()}"


def new_secret(entropy: Entropy) -> str:
    """`"cnd_" + token_urlsafe(32)` with the bytes drawn from `entropy`."""
    return SECRET_PREFIX + base64.urlsafe_b64encode(entropy.token_bytes(32)).rstrip(b"=").decode("ascii")


def hash_secret(secret: str) -> str:
    """SHA-256 hex of the secret's UTF-8 bytes: the only form stored (S-130)."""
    return sha256_hex(secret)


def checked_permissions(permissions: Collection[str]) -> list[str]:
    """Sorted permissions, each one of `read`, `run`, `admin`; otherwise `InvalidArgument` (field `permissions`)."""
    chosen = set() if isinstance(permissions, str) else set(permissions)
    if isinstance(permissions, str) or not chosen <= PERMISSIONS:
        raise InvalidArgument(fields=[("permissions", "unknown_permission")])
    return sorted(chosen)


# --- workspaces --------------------------------------------------------------------------------------------------


async def get_workspace(conn: AsyncConnection, workspace_id: str) -> WorkspaceRow | None:
    row = (await conn.execute(select(workspaces).where(workspaces.c.id == workspace_id))).mappings().first()
    return None if row is None else WorkspaceRow.from_mapping(row)


async def create_workspace(conn: AsyncConnection, *, name: str, entropy: Entropy) -> WorkspaceRow:
    """A new workspace; a taken name → `AlreadyExists("workspace")`."""
    name = checked_name(name)
    taken = await conn.scalar(select(workspaces.c.id).where(workspaces.c.name == name))
    if taken is not None:
        raise AlreadyExists("workspace")
    workspace_id = new_id("wsp", entropy)
    try:
        await conn.execute(insert(workspaces).values(id=workspace_id, name=name, created_at=db_now()))
    except sa_exc.IntegrityError as exc:  # a concurrent create took the name
        raise AlreadyExists("workspace") from exc
    created = await get_workspace(conn, workspace_id)
    assert created is not None
    return created


async def archive_workspace(conn: AsyncConnection, workspace_id: str) -> WorkspaceRow:
    """§4.4: immediate and irreversible; archiving again keeps the first `archived_at`."""
    await conn.execute(
        update(workspaces)
        .where(workspaces.c.id == workspace_id, workspaces.c.archived_at.is_(None))
        .values(archived_at=db_now())
    )
    archived = await get_workspace(conn, workspace_id)
    if archived is None:
        raise NotFound("workspace", workspace_id)
    return archived


async def list_workspaces(conn: AsyncConnection) -> list[WorkspaceRow]:
    query = select(workspaces).order_by(workspaces.c.created_at, workspaces.c.id)
    return [WorkspaceRow.from_mapping(row) for row in (await conn.execute(query)).mappings()]


# --- principals --------------------------------------------------------------------------------------------------


def _principal_query(principal_id: str, workspace_id: str | None) -> Any:
    query = select(principals).where(principals.c.id == principal_id)
    return query if workspace_id is None else query.where(principals.c.workspace_id == workspace_id)


async def get_principal(
    conn: AsyncConnection, *, principal_id: str, workspace_id: str | None = None
) -> PrincipalRow | None:
    """The principal; with `workspace_id`, only if it belongs to that workspace (S-126)."""
    row = (await conn.execute(_principal_query(principal_id, workspace_id))).mappings().first()
    return None if row is None else PrincipalRow.from_mapping(row)


async def list_principals(
    conn: AsyncConnection, *, workspace_id: str, limit: int | None = None, after: tuple[float, str] | None = None
) -> list[PrincipalRow]:
    """A workspace's principals, oldest first (`created_at`, then `id`); `after` is the keyset of the previous page."""
    p = principals.c
    query = select(principals).where(p.workspace_id == workspace_id)
    if after is not None:
        query = query.where(or_(p.created_at > after[0], and_(p.created_at == after[0], p.id > after[1])))
    query = query.order_by(p.created_at, p.id)
    if limit is not None:
        query = query.limit(limit)
    return [PrincipalRow.from_mapping(row) for row in (await conn.execute(query)).mappings()]


async def lock_principal(conn: AsyncConnection, *, principal_id: str, workspace_id: str) -> PrincipalRow | None:
    """The principal of `workspace_id`, locked for the rest of the transaction (S-126: others read as unknown)."""
    row = (await conn.execute(_principal_query(principal_id, workspace_id).with_for_update())).mappings().first()
    return None if row is None else PrincipalRow.from_mapping(row)


async def count_enabled_admins(conn: AsyncConnection, *, workspace_id: str) -> int:
    """How many enabled keys of `workspace_id` hold `admin`, with those rows locked so that two admins cannot
    concurrently take away each other's access (the last-admin rule of `candor.service.admin.keys`)."""
    p = principals.c
    query = select(p.id, p.permissions).where(p.workspace_id == workspace_id, p.disabled_at.is_(None))
    rows = (await conn.execute(query.order_by(p.id).with_for_update())).all()  # one lock order: no deadlock
    return sum(1 for row in rows if "admin" in (row.permissions or ()))


async def update_principal(
    conn: AsyncConnection,
    current: PrincipalRow,
    *,
    permissions: Collection[str] | None = None,
    disabled: bool | None = None,
) -> PrincipalRow:
    """Set a locked key's permissions and/or disabled flag; the version increments only when something changes.

    Disabling keeps the first `disabled_at` (S-61); `disabled=False` enables the key again.
    """
    values: dict[str, Any] = {}
    if permissions is not None and frozenset(allowed := checked_permissions(permissions)) != current.permissions:
        values["permissions"] = allowed
    if disabled is True and current.disabled_at is None:
        values["disabled_at"] = db_now()
    elif disabled is False and current.disabled_at is not None:
        values["disabled_at"] = None
    if values:
        p = principals.c
        await conn.execute(
            update(principals)
            .where(p.id == current.id, p.workspace_id == current.workspace_id)
            .values(**values, version=p.version + 1)
        )
    row = await get_principal(conn, principal_id=current.id, workspace_id=current.workspace_id)
    assert row is not None
    return row


async def create_principal(
    conn: AsyncConnection,
    *,
    workspace_id: str,
    permissions: Collection[str],
    entropy: Entropy,
    name: str = "key",
    principal_id: str | None = None,
) -> CreatedKey:
    """A new API key of `workspace_id`; the secret is returned once and only its hash is stored (S-130).

    `principal_id` is given for an idempotent create (`idempotent_key_id`); a concurrent create with the same id
    loses on the primary key (`RaceLost`)."""
    allowed = checked_permissions(permissions)
    name = checked_name(name)
    if await get_workspace(conn, workspace_id) is None:
        raise NotFound("workspace", workspace_id)
    principal_id = principal_id or new_id("key", entropy)
    secret = new_secret(entropy)
    await conn.execute(
        insert(principals).values(
            id=principal_id,
            workspace_id=workspace_id,
            name=name,
            secret_hash=hash_secret(secret),
            permissions=allowed,
            version=1,
            created_at=db_now(),
        )
    )
    created = await get_principal(conn, principal_id=principal_id)
    assert created is not None
    return CreatedKey(principal=created, secret=secret)


async def disable_principal(
    conn: AsyncConnection, *, principal_id: str, workspace_id: str | None = None
) -> PrincipalRow:
    """S-61: disable a key; disabling again changes nothing."""
    query = update(principals).where(principals.c.id == principal_id, principals.c.disabled_at.is_(None))
    if workspace_id is not None:
        query = query.where(principals.c.workspace_id == workspace_id)
    await conn.execute(query.values(disabled_at=db_now(), version=principals.c.version + 1))
    row = await get_principal(conn, principal_id=principal_id, workspace_id=workspace_id)
    if row is None:
        raise NotFound("key", principal_id)
    return row


async def set_permissions(
    conn: AsyncConnection, *, principal_id: str, permissions: Collection[str], workspace_id: str | None = None
) -> PrincipalRow:
    """S-62: replace a key's permissions (its running runs lose `run` at the next heartbeat)."""
    allowed = checked_permissions(permissions)
    query = update(principals).where(principals.c.id == principal_id)
    if workspace_id is not None:
        query = query.where(principals.c.workspace_id == workspace_id)
    await conn.execute(query.values(permissions=allowed, version=principals.c.version + 1))
    row = await get_principal(conn, principal_id=principal_id, workspace_id=workspace_id)
    if row is None:
        raise NotFound("key", principal_id)
    return row


def _authority_select(prefix: str) -> Select[Any]:
    """The §4.3 facts of a principal, columns carrying `prefix`: `authority_facts` reads a row of it."""
    return select(
        principals.c.workspace_id.label(f"{prefix}workspace_id"),
        principals.c.permissions.label(f"{prefix}permissions"),
        principals.c.disabled_at.label(f"{prefix}disabled_at"),
        workspaces.c.archived_at.label(f"{prefix}archived_at"),
    ).join(workspaces, workspaces.c.id == principals.c.workspace_id)


# Every request runs these two: built once, so SQLAlchemy neither rebuilds them nor recomputes their cache keys.
_AUTHENTICATE = (
    select(principals, workspaces.c.archived_at.label("workspace_archived_at"))
    .join(workspaces, workspaces.c.id == principals.c.workspace_id)
    .where(principals.c.secret_hash == bindparam("presented_hash"))
)
_READ_AUTHORITY = _authority_select("").where(principals.c.id == bindparam("authority_principal_id"))


async def authenticate(conn: AsyncConnection, secret: str) -> Authenticated | None:
    """The principal holding `secret`, or `None` for an unknown or disabled key (→ 401 `unauthenticated`), read on
    `conn` (inside its transaction, if any). A request authenticates with `authenticate_request`."""
    if not secret:
        return None
    presented = hash_secret(secret)
    row = (await conn.execute(_AUTHENTICATE, {"presented_hash": presented})).mappings().first()
    return _authenticated(row, presented)


async def authenticate_request(engine: AsyncEngine, secret: str) -> Authenticated | None:
    """`authenticate` as every API request runs it: one statement on a pooled connection, outside any transaction
    (no BEGIN/ROLLBACK round trips), and on PostgreSQL straight on asyncpg (`pg_driver`: about a third of the
    client CPU of the same statement through SQLAlchemy). Nothing is cached: a key disabled by any process stops
    authenticating at its next request (§4.2)."""
    if not secret:
        return None
    presented = hash_secret(secret)
    row: Mapping[Any, Any] | None
    if statements_on_driver(engine):
        async with pooled_asyncpg(engine) as pg:
            statement = prepared_statement(_AUTHENTICATE, engine.dialect)
            row = await pg.fetchrow(statement.sql, *statement.arguments({"presented_hash": presented}))
    else:
        async with read_transaction(engine) as conn:
            row = (await conn.execute(_AUTHENTICATE, {"presented_hash": presented})).mappings().first()
    return _authenticated(row, presented)


def _authenticated(row: Mapping[Any, Any] | None, presented: str) -> Authenticated | None:
    if row is None or not hmac.compare_digest(row["secret_hash"], presented) or row["disabled_at"] is not None:
        return None
    principal = Principal(id=row["id"], workspace_id=row["workspace_id"], permissions=frozenset(row["permissions"]))
    return Authenticated(principal=principal, workspace_archived=row["workspace_archived_at"] is not None)


async def bootstrap(conn: AsyncConnection, *, entropy: Entropy, name: str = "default") -> Bootstrapped:
    """§2.1, S-130: the first workspace and its admin key; `AlreadyBootstrapped` if any workspace exists."""
    if await conn.scalar(select(func.count()).select_from(workspaces)):
        raise AlreadyBootstrapped()
    try:
        workspace = await create_workspace(conn, name=name, entropy=entropy)
    except AlreadyExists as exc:  # a concurrent bootstrap won
        raise AlreadyBootstrapped() from exc
    key = await create_principal(
        conn, workspace_id=workspace.id, permissions=("read", "run", "admin"), entropy=entropy, name="bootstrap"
    )
    return Bootstrapped(workspace=workspace, key=key)


# --- authority ---------------------------------------------------------------------------------------------------


async def read_authority(conn: AsyncConnection, principal_id: str) -> AuthorityFacts:
    """The facts of the §4.3 check: the principal, its permissions and its workspace, read without locks."""
    row = (await conn.execute(_READ_AUTHORITY, {"authority_principal_id": principal_id})).mappings().first()
    return authority_facts(row)


def authority_facts(row: Mapping[Any, Any] | None, prefix: str = "") -> AuthorityFacts:
    """The facts from a row of `_authority_select(prefix)` (or `_READ_AUTHORITY`); `None`, or a row whose
    principal columns are NULL (an outer join that found no principal), is a missing principal."""
    if row is None or row[f"{prefix}workspace_id"] is None:
        return _MISSING
    return AuthorityFacts(
        principal_exists=True,
        principal_disabled=row[f"{prefix}disabled_at"] is not None,
        permissions=frozenset(row[f"{prefix}permissions"]),
        workspace_id=row[f"{prefix}workspace_id"],
        workspace_archived=row[f"{prefix}archived_at"] is not None,
    )


def authority_subquery(prefix: str, principal_param: str) -> Subquery:
    """`_READ_AUTHORITY` as a subquery whose columns carry `prefix`, for the principal bound as `principal_param`:
    a statement that also reads other rows can read the §4.3 facts in the same round trip (`authority_facts`)."""
    return _authority_select(prefix).where(principals.c.id == bindparam(principal_param)).subquery(f"{prefix}facts")


def principals_authority(prefix: str) -> Subquery:
    """The §4.3 facts of every principal, columns carrying `prefix`, plus `{prefix}principal_id` to join on: a
    statement reading many rows (runs, say) outer-joins it on their principal and reads each row's facts with it
    (`authority_facts`; a principal not found reads as missing)."""
    return (
        _authority_select(prefix)
        .add_columns(principals.c.id.label(f"{prefix}principal_id"))
        .subquery(f"{prefix}principals")
    )


async def check_run_authority(conn: AsyncConnection, principal_id: str) -> AuthorityVerdict:
    """§4.3: `allowed`, `refused` (missing, disabled, without `run`, or archived workspace) or `unavailable`.

    `unavailable` means the database could not answer; on PostgreSQL the caller's transaction is then unusable
    and must be rolled back.
    """
    try:
        facts = await read_authority(conn, principal_id)
    except (sa_exc.SQLAlchemyError, OSError, TimeoutError) as error:
        if is_unavailable(error):
            return "unavailable"
        raise
    return facts.verdict()
