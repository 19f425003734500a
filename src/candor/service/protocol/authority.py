"""Principals and the authority check (spec §4.2, §4.3): who may do what, decided from plain values (pure)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Permission = Literal["read", "run", "admin"]
AuthorityVerdict = Literal["allowed", "refused", "unavailable"]
PERMISSIONS: frozenset[str] = frozenset({"read", "run", "admin"})

__all__ = ("Permission", "AuthorityVerdict", "PERMISSIONS", "Principal", "decide_authority")


@dataclass(frozen=True, kw_only=True, slots=True)
class Principal:
    """An authenticated API key acting inside its own workspace."""

    id: str
    workspace_id: str
    permissions: frozenset[str]

    def can(self, permission: Permission) -> bool:
        return permission in self.permissions


def decide_authority(
    *,
    principal_exists: bool,
    principal_disabled: bool,
    permissions: frozenset[str],
    workspace_archived: bool,
    verb: Permission = "run",
) -> AuthorityVerdict:
    """§4.3: the principal still exists, is not disabled, holds `verb`, and its workspace is not archived."""
    if not principal_exists or principal_disabled or verb not in permissions or workspace_archived:
        return "refused"
    return "allowed"
