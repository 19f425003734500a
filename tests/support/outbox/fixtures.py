"""Fixtures of the outbox tests, imported by the outbox conftests of tests/integration and tests/e2e: a tenant, a
Service with a key ring and a FakeClock, a local receiver."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from candor.service import failpoints
from candor.service.runtime import FakeClock
from candor.service.store.db.engine import bind_key_ring

from . import support
from worker import support as worker_support


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    failpoints.reset({})
    worker_support.reset_control()
    yield


@pytest.fixture
async def tenant(db: Any) -> worker_support.Tenant:
    # Rows staged straight through the engine use the ring a service on this database would bind.
    bind_key_ring(db.engine, support.KEY_RING)
    async with db.engine.begin() as conn:
        return await worker_support.add_tenant(conn)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def receiver() -> AsyncIterator[support.Receiver]:
    server = await support.Receiver().start()
    yield server
    await server.stop()
