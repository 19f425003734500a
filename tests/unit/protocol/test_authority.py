"""The authority rule (spec §4.3), decided in one place for the worker, interrupts and admin actions."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from candor.service.protocol.authority import Permission, decide_authority, key_allows


@dataclass(frozen=True)
class Key:
    principal_exists: bool = True
    principal_disabled: bool = False
    permissions: frozenset[str] = frozenset({"read", "run"})


@pytest.mark.parametrize(
    ("key", "verb", "allowed"),
    [
        (Key(), "run", True),
        (Key(), "read", True),
        (Key(), "admin", False),
        (Key(permissions=frozenset({"admin"})), "admin", True),
        (Key(permissions=frozenset({"admin"})), "run", False),
        (Key(permissions=frozenset()), "read", False),
        (Key(principal_disabled=True), "run", False),
        (Key(principal_disabled=True, permissions=frozenset({"admin"})), "admin", False),
        (Key(principal_exists=False), "run", False),
    ],
)
def test_key_allows(key: Key, verb: Permission, allowed: bool) -> None:
    """S-61: a key allows a verb while it exists, is not disabled and holds that verb now."""
    assert key_allows(key, verb) is allowed


@pytest.mark.parametrize(
    ("key", "archived", "verb", "verdict"),
    [
        (Key(), False, "run", "allowed"),
        (Key(), True, "run", "refused"),
        (Key(principal_disabled=True), False, "run", "refused"),
        (Key(permissions=frozenset({"read"})), False, "run", "refused"),
        (Key(principal_exists=False), False, "run", "refused"),
        (Key(permissions=frozenset({"admin"})), False, "admin", "allowed"),
        (Key(permissions=frozenset({"admin"})), True, "admin", "refused"),
    ],
)
def test_authority_check_adds_the_workspace(key: Key, archived: bool, verb: Permission, verdict: str) -> None:
    """S-61, S-127: the authority check of a run is the key's rule plus a workspace that is not archived."""
    assert decide_authority(key, workspace_archived=archived, verb=verb) == verdict
