"""The attempt's buffer of live `delta` stream entries (§8.7) and when they are written.

A boundary commit takes whatever is buffered and writes it in its own transaction (so a step costs two write
transactions, the model boundary and the tool boundary, not three or four). A model that streams slowly must still
show its deltas live, so once the oldest buffered entry has waited `flush_seconds` (`worker.stream_coalesce_seconds`)
a timer writes the buffer in a transaction of its own through `write`. The timer fires only while nothing else
takes the buffer: the lock keeps a timer write and a boundary commit from interleaving, so stream entries are
always inserted in the order of their sequence numbers.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

from ..store.threads import NewStreamEntry

__all__ = ("DeltaBuffer",)


class DeltaBuffer:
    def __init__(self, write: Callable[[list[NewStreamEntry]], Awaitable[None]], *, flush_seconds: float) -> None:
        self._write = write
        self._flush_seconds = flush_seconds
        self._entries: list[NewStreamEntry] = []
        self._lock = asyncio.Lock()
        self._timer: asyncio.TimerHandle | None = None
        self._flushing: asyncio.Task[None] | None = None
        self._stopped = False

    def __len__(self) -> int:
        return len(self._entries)

    def add(self, entry: NewStreamEntry) -> None:
        """Buffer `entry`; the first entry of an empty buffer arms the flush timer."""
        self._entries.append(entry)
        self._arm()

    @contextlib.asynccontextmanager
    async def taken(self) -> AsyncIterator[list[NewStreamEntry]]:
        """The buffered entries, removed from the buffer, for a write that carries them (a boundary commit).

        Holds the lock for the block, so no timer write runs meanwhile. If the block raises, the entries are lost
        with it: they are provisional live output, and the commit that failed carried them all-or-nothing."""
        async with self._lock:
            self._cancel_timer()
            entries, self._entries = self._entries, []
            yield entries

    async def stop_timer(self) -> None:
        """No more timer writes: cancel an armed timer and wait for a write in flight. Buffered entries stay."""
        self._stopped = True
        self._cancel_timer()
        if self._flushing is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(self._flushing)

    def _arm(self) -> None:
        if self._timer is None and self._flushing is None and not self._stopped:
            self._timer = asyncio.get_running_loop().call_later(self._flush_seconds, self._start_flush)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _start_flush(self) -> None:
        self._timer = None
        self._flushing = asyncio.get_running_loop().create_task(self._flush(), name="candor-stream-flush")

    async def _flush(self) -> None:
        try:
            async with self._lock:
                entries, self._entries = self._entries, []
                if entries:
                    await self._write(entries)
        finally:
            self._flushing = None
            if self._entries:
                self._arm()
