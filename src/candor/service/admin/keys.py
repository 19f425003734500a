"""API keys of the caller's workspace (§4.2, §4.4, §8.3 `/v1/keys`): list, create, change permissions, disable.

* The secret is returned once, by `create_key`; only its hash is stored (S-130). No read returns it or its hash.
* A disabled key authenticates no more (401, S-101) and its running runs fail `authority_revoked` at their next
  heartbeat (S-61, S-62).
* No change may leave the workspace without an enabled `admin` key (`update_key`).
* Creating a key in an archived workspace answers 422 `disabled` (S-128); changing or disabling keys stays
  possible there, so a leaked key of an archived workspace can still be shut off (reads keep working there).
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection
from dataclasses import dataclass

from ..core import Service
from ..errors import Conflict, NotFound, PreconditionFailed, RaceLost
from ..protocol.authority import Principal
from ..protocol.requests import checked_key, require
from ..store import workspaces as auth
from ..store.db import read_transaction, write_transaction
from ..store.workspaces import CreatedKey, PrincipalRow
from ._access import audit, recheck_admin
from .rules import checked_limit, checked_name, removes_last_admin

__all__ = ("list_keys_page", "create_key", "update_key", "KeyCreated", "idempotent_key_id")

_RACE_ANSWERS = 3


@dataclass(frozen=True, slots=True)
class KeyCreated:
    """What `create_key` answers: the key, its secret (`None` on a replay) and whether this request made it."""

    principal: PrincipalRow
    secret: str | None
    created: bool


def idempotent_key_id(workspace_id: str, principal_id: str, idempotency_key: str) -> str:
    """The id a key created with `idempotency_key` by `principal_id` gets: the same for every retry (§8.2)."""
    material = "\x00".join((workspace_id, principal_id, idempotency_key)).encode("utf-8")
    return "key_" + hashlib.sha256(material).hexdigest()[:32]


async def list_keys_page(
    service: Service, principal: Principal, *, limit: int = 50, after: tuple[float, str] | None = None
) -> tuple[list[PrincipalRow], bool]:
    """The workspace's keys, oldest first, and whether more follow the page (S-98)."""
    require(principal, "admin")
    checked_limit(limit)
    async with read_transaction(service.engine) as conn:
        rows = await auth.list_principals(conn, workspace_id=principal.workspace_id, limit=limit + 1, after=after)
    return rows[:limit], len(rows) > limit


async def create_key(
    service: Service,
    principal: Principal,
    *,
    name: str,
    permissions: Collection[str],
    idempotency_key: str | None = None,
) -> KeyCreated:
    """A new key of the caller's workspace; the secret is in the answer and nowhere else.

    With `idempotency_key` it is idempotent (§8.2): the key's id is derived from the workspace, the caller and the
    idempotency key (`idempotent_key_id`), so a retry finds the key the first request made. A replay with the same
    name and permissions answers that key **without its secret** (`replayed=True`): the secret exists only as a
    hash, and keeping it to show it again would mean storing a usable credential. A client that lost the first
    answer disables that key and creates another. Other name or permissions → 409 `conflict`, reason
    `idempotency_key_reused`."""
    require(principal, "admin")
    allowed = auth.checked_permissions(permissions)
    key_id = None
    if idempotency_key is not None:
        key_id = idempotent_key_id(principal.workspace_id, principal.id, checked_key(idempotency_key))
    for attempt in range(_RACE_ANSWERS):
        try:
            answer = await _create_key_once(service, principal, name=name, permissions=allowed, key_id=key_id)
            break
        except RaceLost:
            if attempt == _RACE_ANSWERS - 1:
                raise
    if answer.created:
        audit("Key created", principal, key_id=answer.principal.id, permissions=allowed)
    return answer


async def _create_key_once(
    service: Service, principal: Principal, *, name: str, permissions: list[str], key_id: str | None
) -> KeyCreated:
    async with write_transaction(service.engine) as conn:
        await recheck_admin(conn, principal, refuse_archived=True)
        if key_id is not None:
            earlier = await auth.get_principal(conn, principal_id=key_id, workspace_id=principal.workspace_id)
            if earlier is not None:
                if earlier.name != checked_name(name) or sorted(earlier.permissions) != sorted(permissions):
                    raise Conflict("idempotency_key_reused", kind="key", id=key_id)
                return KeyCreated(principal=earlier, secret=None, created=False)
        created: CreatedKey = await auth.create_principal(
            conn,
            workspace_id=principal.workspace_id,
            permissions=permissions,
            entropy=service.entropy,
            name=name,
            principal_id=key_id,
        )
    return KeyCreated(principal=created.principal, secret=created.secret, created=True)


async def update_key(
    service: Service,
    principal: Principal,
    key_id: str,
    *,
    expected_version: int,
    permissions: Collection[str] | None = None,
    disabled: bool | None = None,
) -> PrincipalRow:
    """Set a key's permissions and/or disabled flag (`disabled=False` enables it again).

    The key's version comes from `If-Match` (stale → 412, S-97). A change that would leave the workspace without an
    enabled `admin` key is refused with 409 `conflict`, reason `last_admin_key` (`rules.removes_last_admin`): an
    admin cannot lock the workspace out of key management, not even by disabling their own key. The operator's
    `candor key disable` is not bound by this rule."""
    require(principal, "admin")
    wanted = None if permissions is None else auth.checked_permissions(permissions)
    async with write_transaction(service.engine) as conn:
        await recheck_admin(conn, principal, refuse_archived=False)
        enabled_admins = await auth.count_enabled_admins(conn, workspace_id=principal.workspace_id)
        current = await auth.lock_principal(conn, principal_id=key_id, workspace_id=principal.workspace_id)
        if current is None:
            raise NotFound("key", key_id)
        if expected_version != current.version:
            raise PreconditionFailed(f'"{current.id}:{current.version}"')
        if removes_last_admin(
            is_enabled_admin=current.disabled_at is None and "admin" in current.permissions,
            permissions=wanted,
            disabled=disabled,
            enabled_admins=enabled_admins,
        ):
            raise Conflict("last_admin_key", kind="key", id=key_id)
        updated = await auth.update_principal(conn, current, permissions=wanted, disabled=disabled)
    if updated.version != current.version:
        audit(
            "Key updated",
            principal,
            key_id=key_id,
            permissions=sorted(updated.permissions),
            disabled=updated.disabled_at is not None,
        )
    return updated
