"""Cross-process wake-ups (§2.2): `NOTIFY candor_wake` when runs become due, `LISTEN` in workers; on SQLite the
same through unix datagram sockets next to the database file (`local_wake`).

Within one process `Service.wakeups` (an `asyncio.Event`) already wakes the worker loop; across processes a run
accepted by the control process (or requeued by a sweep) should not wait for a worker's next `worker.scan_seconds`
scan. A wake-up is an optimisation, never the only way a run gets claimed: every worker still scans. `Notifier`
sends, `listen_for_wakeups` receives; an in-memory SQLite database has no other process to wake.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

import asyncpg
from sqlalchemy import text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.ext.asyncio import AsyncEngine

from ...protocol.db_faults import describe_database_error
from ..db.dialect import has_listen_notify, is_postgresql_url, sqlite_database_file
from .local_wake import LocalWakeups

__all__ = ("CHANNEL", "Notifier", "listen_for_wakeups", "is_postgres_url", "plain_postgres_dsn")

CHANNEL = "candor_wake"
_NOTIFY = text("SELECT pg_notify(:channel, '')")
log = logging.getLogger("candor.notify")


def is_postgres_url(url: str | URL) -> bool:
    return is_postgresql_url(url)


def plain_postgres_dsn(url: str | URL) -> str:
    """The operator URL as a DSN asyncpg accepts (no `+driver` part)."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


class Notifier:
    """Sends coalesced, best-effort `NOTIFY candor_wake` through the service's engine (PostgreSQL), or datagrams to
    the workers' sockets next to the database file (SQLite).

    `notify()` is called after the commit that made a run due. It is fire-and-forget and coalesced: at most one
    send in flight and one queued behind it."""

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine
        self._enabled = has_listen_notify(engine)
        path = sqlite_database_file(engine.url)
        self._local = LocalWakeups(path) if path is not None else None
        self._task: asyncio.Task[None] | None = None
        self._again = False

    def notify(self) -> None:
        """Ask every listening worker to scan now. Safe to call from any coroutine of the running loop."""
        if self._local is not None:
            self._local.notify()
            return
        if not self._enabled:
            return
        if self._task is not None and not self._task.done():
            self._again = True  # the send in flight may have started before the caller's commit
            return
        self._task = asyncio.get_running_loop().create_task(self._send(), name="candor-notify")

    async def _send(self) -> None:
        while True:
            self._again = False
            try:
                async with self._engine.connect() as conn:
                    # Autocommit: one round trip, delivered at once (no BEGIN and COMMIT around it).
                    conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
                    await conn.execute(_NOTIFY, {"channel": CHANNEL})
            except Exception as exc:  # noqa: BLE001 - best effort: the workers' scans pick the run up anyway
                log.debug("Wake-up notification not sent", extra={"error_type": type(exc).__name__})
            if not self._again:
                return

    async def close(self) -> None:
        """Wait for a send in flight (so the engine can be disposed cleanly)."""
        if self._local is not None:
            self._local.close()
        if self._task is not None:
            with contextlib.suppress(Exception):
                await self._task


async def listen_for_wakeups(
    url: str | URL,
    *,
    on_wake: Callable[[], None],
    on_connected: Callable[[bool], None],
    retry_seconds: float = 1.0,
    max_retry_seconds: float = 30.0,
) -> None:
    """LISTEN on `candor_wake` until cancelled, calling `on_wake()` per notification.

    `on_connected(True)` once listening, `on_connected(False)` whenever the connection is lost or cannot be made;
    reconnects with doubling backoff capped at `max_retry_seconds`. One dedicated asyncpg connection listens; while
    it is lost the process reports `degraded` (`/readyz` says `"degraded": ["notify"]`, S-121) and scans keep the
    worker working. On a SQLite file the same through this process's socket in the wake-up directory
    (`local_wake.LocalWakeups`); returns at once for an in-memory SQLite database.
    """
    path = sqlite_database_file(url)
    if path is not None:
        await _listen_locally(LocalWakeups(path), on_wake, on_connected, retry_seconds, max_retry_seconds)
        return
    if not is_postgres_url(url):
        return
    dsn = plain_postgres_dsn(url)
    delay = retry_seconds
    while True:
        lost = asyncio.Event()
        conn: Any = None
        try:
            conn = await asyncpg.connect(dsn)
            conn.add_termination_listener(lambda _conn, lost=lost: lost.set())
            await conn.add_listener(CHANNEL, lambda *_args: on_wake())
            on_connected(True)
            delay = retry_seconds
            # A wake-up may have been sent while we were not listening: scan once now.
            on_wake()
            await lost.wait()
            log.warning("Wake-up connection lost; workers fall back to scanning")
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - any failure to listen degrades to scanning, then retries
            cause = describe_database_error(exc)
            log.warning("Wake-up connection unavailable", extra={"error_type": type(exc).__name__, "cause": cause})
        finally:
            if conn is not None and not conn.is_closed():
                with contextlib.suppress(Exception):
                    await asyncio.shield(conn.close(timeout=2))
        on_connected(False)
        await asyncio.sleep(delay)
        delay = min(max_retry_seconds, delay * 2)


async def _listen_locally(
    local: LocalWakeups,
    on_wake: Callable[[], None],
    on_connected: Callable[[bool], None],
    retry_seconds: float,
    max_retry_seconds: float,
) -> None:
    delay = retry_seconds
    while True:
        try:
            await local.listen(on_wake, on_ready=lambda: on_connected(True))
        except OSError as exc:
            log.warning("Wake-up socket unavailable", extra={"error_type": type(exc).__name__, "error": str(exc)})
        on_connected(False)
        await asyncio.sleep(delay)
        delay = min(max_retry_seconds, delay * 2)
