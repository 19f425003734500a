"""Cross-process wake-ups on PostgreSQL (§2.2 `LISTEN`/`NOTIFY` on `candor_wake`, §7.1 step 3, S-121 `notify`)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import asyncpg
import pytest

from candor.service.store.engine import create_engine
from candor.service.store.notify import CHANNEL, Notifier, listen_for_wakeups, plain_postgres_dsn


class _Listener:
    """Runs `listen_for_wakeups` in a task and records what it reports."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.woken = asyncio.Event()
        self.states: list[bool] = []
        self.connected = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    def _on_connected(self, ok: bool) -> None:
        self.states.append(ok)
        if ok:
            self.connected.set()
        else:
            self.connected.clear()

    async def __aenter__(self) -> _Listener:
        self.task = asyncio.create_task(
            listen_for_wakeups(
                self.url, on_wake=self.woken.set, on_connected=self._on_connected, retry_seconds=0.05
            )
        )
        await asyncio.wait_for(self.connected.wait(), 10)
        self.woken.clear()  # the scan-once-on-connect wake-up
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.task is not None
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


ON_POSTGRES = pytest.mark.parametrize("db_kind", [pytest.param("postgresql", marks=pytest.mark.postgres)])
ON_SQLITE = pytest.mark.parametrize("db_kind", ["sqlite"])


@ON_POSTGRES
async def test_a_notify_from_another_engine_wakes_the_listener(db: Any) -> None:
    """§2.2, §7.1 step 3: a run made due by one process (`Service.wake_workers` → `NOTIFY candor_wake`) wakes the
    worker loops of other processes at once instead of at their next `worker.scan_seconds` scan."""
    other_process = create_engine(db.url)
    notifier = Notifier(other_process)
    try:
        async with _Listener(db.url) as listener:
            notifier.notify()
            notifier.notify()  # coalesced behind the first; still delivered
            await asyncio.wait_for(listener.woken.wait(), 10)
    finally:
        await notifier.close()
        await other_process.dispose()


@ON_POSTGRES
async def test_losing_the_listen_connection_degrades_then_recovers(db: Any) -> None:
    """S-121: losing the notification connection is reported (`degraded: ["notify"]` in `/readyz`), the listener
    reconnects by itself, and after reconnecting it wakes the loop once to cover notifications it missed."""
    async with _Listener(db.url) as listener:
        admin = await asyncpg.connect(plain_postgres_dsn(db.url))
        try:
            terminated = await admin.fetchval(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = current_database() AND query = $1 AND pid <> pg_backend_pid()",
                f'LISTEN "{CHANNEL}"',
            )
        finally:
            await admin.close()
        assert terminated == 1
        async with asyncio.timeout(10):
            while False not in listener.states:
                await asyncio.sleep(0.01)
            await listener.connected.wait()
        assert listener.states[:3] == [True, False, True]
        assert listener.woken.is_set()


@ON_SQLITE
async def test_sqlite_has_nothing_to_listen_to(db: Any) -> None:
    """§2.2: on SQLite (one machine, one writer) the notifier sends nothing and the listener returns at once; the
    in-process `Service.wakeups` event does the waking."""
    states: list[bool] = []
    await asyncio.wait_for(listen_for_wakeups(db.url, on_wake=lambda: None, on_connected=states.append), 1)
    notifier = Notifier(db.engine)
    notifier.notify()
    await notifier.close()
    assert states == [] and notifier._task is None
