"""Fixtures of the worker tests, imported by the worker conftests of tests/integration and tests/e2e: a fresh
`CONTROL` per test and a Service on the `db` test database."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from candor.service import failpoints
from candor.service.core import Service

from . import support


@pytest.fixture(autouse=True)
def control() -> support.Control:
    failpoints.reset({})
    return support.reset_control()


@pytest.fixture
async def service(db: Any) -> AsyncIterator[Service]:
    """A Service on the migrated test database (lease 10 s, heartbeat 0.5 s, scan 0.05 s)."""
    yield support.make_service(db.url, db.engine)


@pytest.fixture
async def tenant(db: Any) -> support.Tenant:
    async with db.engine.begin() as conn:
        return await support.add_tenant(conn)
