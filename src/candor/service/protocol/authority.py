"""Principals and the authority check (spec §4.2, §4.3): who may do what, decided from plain values (pure)."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Literal, Protocol

Permission = Literal["read", "run", "admin"]
AuthorityVerdict = Literal["allowed", "refused", "unavailable"]
PERMISSIONS: frozenset[str] = frozenset({"read", "run", "admin"})

__all__ = ("Permission", "AuthorityVerdict", "PERMISSIONS", "Principal", "KeyFacts", "key_allows", "decide_authority")


@dataclass(frozen=True, kw_only=True, slots=True)
class Principal:
    """An authenticated API key acting inside its own workspace."""

    id: str
    workspace_id: str
    permissions: frozenset[str]

    def can(self, permission: Permission) -> bool:
        return permission in self.permissions


class KeyFacts(Protocol):
    """What is known now about an API key (store.auth.AuthorityFacts is one)."""

    @property
    def principal_exists(self) -> bool: ...
    @property
    def principal_disabled(self) -> bool: ...
    @property
    def permissions(self) -> Collection[str]: ...


def key_allows(key: KeyFacts, verb: Permission) -> bool:
    """§4.3: the key still exists, is not disabled and holds `verb` now. The workspace is judged apart, since an
    archived workspace answers `disabled` for some actions and not at all for others (S-128)."""
    return key.principal_exists and not key.principal_disabled and verb in key.permissions


def decide_authority(key: KeyFacts, *, workspace_archived: bool, verb: Permission = "run") -> AuthorityVerdict:
    """§4.3, S-61, S-127: the authority check of a run: the key allows `verb` and its workspace is not archived."""
    return "allowed" if key_allows(key, verb) and not workspace_archived else "refused"
