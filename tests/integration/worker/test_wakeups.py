"""Cross-process wake-ups on PostgreSQL (§2.2 `LISTEN`/`NOTIFY` on `candor_wake`, §7.1 step 3, S-121 `notify`)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import sys
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from candor.service.store.db.dialect import sqlite_database_file as sqlite_file
from candor.service.store.db.engine import create_engine
from candor.service.store.wakeups.local_wake import wake_directory
from candor.service.store.wakeups.notify import CHANNEL, Notifier, listen_for_wakeups, plain_postgres_dsn


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
            listen_for_wakeups(self.url, on_wake=self.woken.set, on_connected=self._on_connected, retry_seconds=0.05)
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
async def test_a_sqlite_notifier_wakes_a_listener_of_the_same_file(db: Any) -> None:
    """§2.2, §7.1 step 3 (issue 12): on a SQLite file a run made due by one process wakes the listening worker loops
    through their sockets in the database's wake-up directory, not at their next scan; the listener reports itself
    connected and removes its socket when it stops."""
    notifier = Notifier(create_engine(db.url))
    try:
        async with _Listener(db.url) as listener:
            assert listener.states == [True]
            directory = wake_directory(sqlite_file(db.url) or "")
            assert len(list(directory.glob("*.sock"))) == 1
            notifier.notify()
            await asyncio.wait_for(listener.woken.wait(), 5)
        assert list(directory.glob("*.sock")) == []
    finally:
        await notifier.close()


@ON_SQLITE
async def test_a_dead_listeners_socket_is_removed_by_the_next_notify(db: Any, tmp_path: Any) -> None:
    """A worker killed with SIGKILL leaves its socket behind; a send to it is refused and the notifier removes it."""
    directory = wake_directory(sqlite_file(db.url) or "")
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    stale = directory / "999999-dead.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(stale))
    sock.close()  # bound, then closed: like a process that died without cleaning up
    notifier = Notifier(db.engine)
    notifier.notify()
    await notifier.close()
    assert not stale.exists()


def test_a_long_database_path_gets_a_short_wake_directory(tmp_path: Any) -> None:
    """Unix socket paths are limited (~107 bytes): a deep database path moves the directory to the temp dir, keyed
    by the database's real path, so every process still picks the same one."""
    deep = tmp_path / ("d" * 80) / "candor.db"
    chosen = wake_directory(str(deep))
    assert len(str(chosen)) + 40 <= 100
    assert chosen == wake_directory(str(deep))
    assert wake_directory(str(tmp_path / ("e" * 80) / "candor.db")) != chosen
    assert wake_directory("/tmp/x/candor.db") == Path("/tmp/x/candor.db.wake")


_CHILD = """
import asyncio, sys
from candor.service.store.wakeups.notify import listen_for_wakeups

async def main():
    ready = asyncio.Event()
    woken = asyncio.Event()
    task = asyncio.create_task(listen_for_wakeups(sys.argv[1], on_wake=woken.set, on_connected=lambda ok: ok and ready.set()))
    await ready.wait()
    await asyncio.sleep(0)
    woken.clear()  # the scan-once-on-start wake-up
    print("ready", flush=True)
    await asyncio.wait_for(woken.wait(), 10)
    print("woken", flush=True)
    task.cancel()

asyncio.run(main())
"""


@ON_SQLITE
async def test_a_sqlite_wake_up_crosses_processes(db: Any) -> None:
    """Issue 12: two processes on one SQLite file; the other process's listener is woken by this one's notify."""
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _CHILD, db.url, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    assert child.stdout is not None
    notifier = Notifier(db.engine)
    try:
        line = await asyncio.wait_for(child.stdout.readline(), 30)
        assert line.strip() == b"ready", (line, await child.stderr.read() if child.stderr else b"")
        notifier.notify()
        assert (await asyncio.wait_for(child.stdout.readline(), 10)).strip() == b"woken"
        assert await asyncio.wait_for(child.wait(), 10) == 0
    finally:
        await notifier.close()
        if child.returncode is None:
            child.kill()
            await child.wait()


async def test_an_in_memory_sqlite_database_has_nothing_to_listen_to() -> None:
    """No other process shares an in-memory database: there is no wake-up directory and the listener returns."""
    url = "sqlite+aiosqlite:///:memory:"
    assert sqlite_file(url) is None
    states: list[bool] = []
    await asyncio.wait_for(listen_for_wakeups(url, on_wake=lambda: None, on_connected=states.append), 1)
    assert states == []
