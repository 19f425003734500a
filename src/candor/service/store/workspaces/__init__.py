"""Workspaces and principals: API keys, authentication and the authority check (spec §4).

This is the face code outside `store/` imports; modules inside `store/` import each other directly.
"""

from __future__ import annotations

from .auth import (
    Authenticated,
    AuthorityFacts,
    CreatedKey,
    PrincipalRow,
    archive_workspace,
    authenticate_request,
    bootstrap,
    checked_permissions,
    count_enabled_admins,
    create_principal,
    create_workspace,
    disable_principal,
    get_principal,
    get_workspace,
    list_principals,
    list_workspaces,
    lock_principal,
    new_id,
    read_authority,
    update_principal,
)

__all__ = (
    "Authenticated",
    "AuthorityFacts",
    "CreatedKey",
    "PrincipalRow",
    "archive_workspace",
    "authenticate_request",
    "bootstrap",
    "checked_permissions",
    "count_enabled_admins",
    "create_principal",
    "create_workspace",
    "disable_principal",
    "get_principal",
    "get_workspace",
    "list_principals",
    "list_workspaces",
    "lock_principal",
    "new_id",
    "read_authority",
    "update_principal",
)
