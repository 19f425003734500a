"""Connection budgets (§7.8.1, store/db/connections.py): a process's PostgreSQL connections are bounded by its pool
settings, never by `worker.slots`; a full pool or a full server makes work wait (bounded by `database.timeout`)
instead of failing it; the startup check warns when the processes could exceed `max_connections`."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import asyncpg
import pytest
from prometheus_client import REGISTRY
from sqlalchemy import text

from candor.service.core import Service
from candor.service.errors import StoreUnavailable
from candor.service.settings import ServiceSettings
from candor.service.store.db.connections import (
    ConnectionBudget,
    application_name,
    check_server_budget,
    connect_retry_delays,
    connection_budget,
    idle_transaction_limit_ms,
    is_retryable_connect_error,
    patient_connect,
    server_budget_warning,
    watch_connections,
)
from candor.service.store.db.engine import read_transaction


def test_the_budget_counts_the_pool_its_overflow_and_a_workers_listen_connection() -> None:
    """§7.8.1: pool_size + max_overflow (+ the LISTEN and heartbeat connections in a process that runs a worker)."""
    assert connection_budget(pool_size=10, max_overflow=4, runs_worker=True).total == 16
    assert connection_budget(pool_size=10, max_overflow=4, runs_worker=False) == ConnectionBudget(10, 4, 0, 0)


def test_the_server_check_warns_only_when_the_processes_could_exceed_what_the_server_admits() -> None:
    """§7.8.1: the ordinary roles get max_connections − superuser_reserved_connections; the message says what to
    change and where the process count came from."""
    budget = ConnectionBudget(pool=10, overflow=4, listen=1, heartbeat=1)
    fits = server_budget_warning(budget=budget, processes=6, estimated=False, max_connections=100, reserved=3)
    assert fits is None  # 96 ≤ 97
    warned = server_budget_warning(budget=budget, processes=7, estimated=True, max_connections=100, reserved=3)
    assert warned is not None
    assert "112" in warned and "97" in warned and "estimated" in warned and "database.pool_size" in warned


def test_application_names_tell_processes_apart_within_postgresqls_limit() -> None:
    assert application_name("worker", pid=42, host="box.example.com") == "candor-worker-box-42"
    long = application_name("control", pid=1234567, host="h" * 100)
    assert len(long) == 63 and long.endswith("-1234567") and long.startswith("candor-control-hhh")


def test_an_idle_transaction_is_ended_after_twice_the_statement_timeout() -> None:
    """S-24, S-25: a transaction left idle by a frozen process cannot hold its row locks (and the lease sweep) past
    2 x database.timeout, well within the lease (3 x timeout < lease, §3.3)."""
    assert idle_transaction_limit_ms(5.0) == "10000"
    assert idle_transaction_limit_ms(0.9) == "1800"


def test_connect_retries_are_bounded_by_the_budget() -> None:
    delays = connect_retry_delays(1.0)
    assert delays[:4] == [0.05, 0.1, 0.2, 0.4] and sum(delays) <= 1.0
    assert connect_retry_delays(0.01) == []
    assert max(connect_retry_delays(5.0)) == 0.5


@pytest.mark.parametrize(
    ("error", "retryable"),
    [
        (asyncpg.TooManyConnectionsError("sorry, too many clients already"), True),
        (asyncpg.CannotConnectNowError("the database system is starting up"), True),
        (ConnectionRefusedError(111, "Connection refused"), True),
        (ConnectionResetError(104, "reset"), True),
        (asyncpg.InvalidPasswordError("password authentication failed"), False),
        (asyncpg.InvalidCatalogNameError('database "x" does not exist'), False),
        (OSError("no route"), False),
    ],
)
def test_only_a_server_that_is_full_or_restarting_is_waited_for(error: BaseException, retryable: bool) -> None:
    """§7.8.1: a full or restarting server is waited for; a wrong password or database fails at once."""
    assert is_retryable_connect_error(error) is retryable


async def test_a_full_server_is_waited_for_within_the_timeout() -> None:
    """§7.8.1: `too many clients` twice, then a connection: the connect waits and succeeds."""
    tries: list[float] = []

    async def connect(**kwargs: Any) -> str:
        tries.append(kwargs["timeout"])
        if len(tries) < 3:
            raise asyncpg.TooManyConnectionsError("sorry, too many clients already")
        return "connection"

    assert await patient_connect(2.0, connect=connect)(timeout=2.0) == "connection"
    assert len(tries) == 3 and all(0 < t <= 2.0 for t in tries)


async def test_a_server_that_stays_full_fails_the_connect_after_the_timeout() -> None:
    """§7.8.1: the wait is bounded by `database.timeout`, then the last error is raised."""

    async def connect(**kwargs: Any) -> str:
        raise asyncpg.TooManyConnectionsError("sorry, too many clients already")

    started = time.monotonic()
    with pytest.raises(asyncpg.TooManyConnectionsError):
        await patient_connect(0.4, connect=connect)(timeout=0.4)
    assert time.monotonic() - started < 0.6


async def test_a_wrong_password_is_not_retried() -> None:
    calls = 0

    async def connect(**kwargs: Any) -> str:
        nonlocal calls
        calls += 1
        raise asyncpg.InvalidPasswordError("password authentication failed")

    with pytest.raises(asyncpg.InvalidPasswordError):
        await patient_connect(2.0, connect=connect)(timeout=2.0)
    assert calls == 1


@pytest.mark.postgres
async def test_a_full_pool_makes_work_wait_for_a_connection_not_fail(postgres_url: str) -> None:
    """§7.8.1: with every connection of the pool (1 + 0 overflow) busy, a transaction waits for the connection to
    come back and then runs; waiting longer than `database.timeout` is `StoreUnavailable`. Connections carry
    the process's `application_name`."""
    settings = ServiceSettings(database={"url": postgres_url, "pool_size": 1, "max_overflow": 0, "timeout": 0.5})
    service = await Service.open(settings, role="worker")
    try:
        async with service.engine.connect() as held:
            name = (await held.execute(text("SELECT current_setting('application_name')"))).scalar_one()
            assert name == application_name("worker")
            idle = await held.execute(text("SELECT current_setting('idle_in_transaction_session_timeout')"))
            assert idle.scalar_one() == "1s"  # 2 x database.timeout

            async def read() -> int:
                async with read_transaction(service.engine) as conn:
                    return int((await conn.execute(text("SELECT 1"))).scalar_one())

            waiting = asyncio.create_task(read())
            await asyncio.sleep(0.2)
            assert not waiting.done()
        assert await waiting == 1  # got the connection once it was returned
        async with service.engine.connect():
            with pytest.raises(StoreUnavailable):
                await read()
    finally:
        await service.close()


@pytest.mark.postgres
async def test_the_startup_check_reads_the_servers_limit(postgres_url: str, caplog: Any) -> None:
    """§7.8.1: more configured processes than the server admits log a warning naming the budget; a count that fits
    logs nothing; the estimate counts this process."""
    service = await Service.open(ServiceSettings(database={"url": postgres_url}), role="control")
    budget = connection_budget(pool_size=10, max_overflow=4, runs_worker=False)
    try:
        with caplog.at_level(logging.WARNING, logger="candor.connections"):
            assert await check_server_budget(service.engine, budget, processes=1) is None
            warned = await check_server_budget(service.engine, budget, processes=10000)
        assert warned is not None and "database.processes" in warned
        assert [r.getMessage() for r in caplog.records] == [warned]
    finally:
        await service.close()


@pytest.mark.postgres
async def test_the_gauge_counts_the_pools_connections(postgres_url: str) -> None:
    """`candor_db_connections{role="pool", state}` follows the pool; the limit gauge is the budget."""
    settings = ServiceSettings(database={"url": postgres_url, "pool_size": 2, "max_overflow": 1})
    service = await Service.open(settings, runs_worker=True)
    budget = connection_budget(pool_size=2, max_overflow=1, runs_worker=True)
    listening = watch_connections(service.engine, budget, heartbeat_engine=service.lease_engine)

    def gauge(role: str, state: str) -> float | None:
        return REGISTRY.get_sample_value("candor_db_connections", {"role": role, "state": state})

    try:
        held = [await service.engine.connect() for _ in range(3)]
        assert (gauge("pool", "in_use"), gauge("pool", "idle")) == (3.0, 0.0)
        for connection in held:
            await connection.close()
        assert (gauge("pool", "in_use"), gauge("pool", "idle")) == (0.0, 2.0)
        assert REGISTRY.get_sample_value("candor_db_connection_limit", {"role": "pool"}) == 3.0
        assert REGISTRY.get_sample_value("candor_db_connection_limit", {"role": "listen"}) == 1.0
        assert REGISTRY.get_sample_value("candor_db_connection_limit", {"role": "heartbeat"}) == 1.0
        assert service.lease_engine is not None
        async with service.heartbeat_engine.connect():
            assert gauge("heartbeat", "in_use") == 1.0
        assert (gauge("heartbeat", "in_use"), gauge("heartbeat", "idle")) == (0.0, 1.0)
        listening(True)
        assert gauge("listen", "in_use") == 1.0
    finally:
        await service.close()
