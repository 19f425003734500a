"""Fixtures of the service's MCP tests: a tenant on the `db` test database; and `mcp_support` (the tool server's
helpers in tests/mcp_tools, shared with the harness tests) made importable."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from worker import support

TOOLS_DIR = Path(__file__).resolve().parents[2] / "mcp_tools"
if str(TOOLS_DIR) not in sys.path:
    sys.path.insert(0, str(TOOLS_DIR))


@pytest.fixture
async def tenant(db: Any) -> support.Tenant:
    async with db.engine.begin() as conn:
        return await support.add_tenant(conn)
