"""SQLite writers of one process take turns, in FIFO order, before they ask SQLite for its writer lock.

SQLite's busy handler sleeps between tries and is not woken when the lock is released, so with many slots
committing at once a few writers waited close to `database.timeout` while others went first. Every write
transaction of a process on a SQLite engine (step commits and `engine.write_transaction` alike) waits for its turn
on an `asyncio.Lock` here: the turns share the waiting out evenly, they do not make the writer faster. SQLite's lock
stays the authority (other processes' writers still meet it), nothing relies on the turns for correctness, and a
turn is waited for at most `database.timeout`, then the database counts as unavailable. PostgreSQL engines have no
gate: row locks let their writers run at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from types import TracebackType
from weakref import WeakKeyDictionary

from sqlalchemy.engine import Engine
from sqlalchemy.ext.asyncio import AsyncEngine

from ...errors import StoreUnavailable
from ...metrics import SQLITE_WRITER_WAIT

__all__ = ("WriterGate", "install_writer_gate", "writer_turn")

_GATES: WeakKeyDictionary[Engine, WriterGate] = WeakKeyDictionary()


class WriterGate:
    """The turns of one SQLite engine's writers (one per engine, shared by every task of the process), taken with
    `async with`."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._lock = asyncio.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None

    async def __aenter__(self) -> None:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            # An engine used from another event loop (one `asyncio.run` after another): a lock belongs to one loop.
            self._lock, self._loop = asyncio.Lock(), loop
        started = time.perf_counter()
        try:
            async with asyncio.timeout(self.timeout):  # free and nobody queued: taken without suspending
                await self._lock.acquire()
        except TimeoutError:
            raise StoreUnavailable(
                f"database unavailable: this process's other writes held the SQLite writer for over "
                f"{self.timeout:g} s (database.timeout)"
            ) from None
        finally:
            SQLITE_WRITER_WAIT.observe(time.perf_counter() - started)

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._lock.release()

    @property
    def locked(self) -> bool:
        """Whether a writer has its turn now."""
        return self._lock.locked()

    @property
    def waiting(self) -> int:
        """Writers queued behind the current one (for tests and diagnostics)."""
        waiters = self._lock._waiters  # asyncio keeps no public count
        return 0 if waiters is None else sum(1 for waiter in waiters if not waiter.done())


_NO_GATE: contextlib.nullcontext[None] = contextlib.nullcontext()
"""A PostgreSQL engine's writers: no turn to wait for."""


def install_writer_gate(engine: AsyncEngine, *, timeout: float) -> WriterGate:
    """Give the (SQLite) `engine` a gate; `writer_turn(engine)` then queues its writers."""
    gate = WriterGate(timeout)
    _GATES[engine.sync_engine] = gate
    return gate


def writer_turn(engine: AsyncEngine) -> WriterGate | contextlib.nullcontext[None]:
    """`async with writer_turn(engine):` around a write transaction: its turn among the process's write
    transactions on a SQLite engine, nothing on PostgreSQL."""
    return _GATES.get(engine.sync_engine, _NO_GATE)
