"""Fixtures of the provider tests, imported by the provider conftests of tests/integration and tests/e2e: the API key
variable and a tenant on the `db` test database."""

from __future__ import annotations

import secrets
from typing import Any

import pytest

from .support import KEY_ENV
from worker import support


@pytest.fixture
def api_key(monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh secret in `SCRIPTED_OPENAI_KEY`, the variable the agent's model settings name."""
    key = f"sk-scripted-{secrets.token_hex(16)}"
    monkeypatch.setenv(KEY_ENV, key)
    return key


@pytest.fixture
async def tenant(db: Any) -> support.Tenant:
    async with db.engine.begin() as conn:
        return await support.add_tenant(conn)
