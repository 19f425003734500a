"""Fixtures of the service's MCP tests: a tenant on the `db` test database; `mcp_support` (the tool server's
helpers, shared with the harness tests) is in tests/support."""

from __future__ import annotations

from typing import Any

import pytest

from worker import support


@pytest.fixture
async def tenant(db: Any) -> support.Tenant:
    async with db.engine.begin() as conn:
        return await support.add_tenant(conn)
