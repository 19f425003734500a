"""`wait_until`: synchronise a test on a condition instead of a sleep.

A sleep either wastes time or, on a loaded machine, is too short; polling a predicate with a deadline does neither.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable

Predicate = Callable[[], bool | Awaitable[bool]]


async def wait_until(predicate: Predicate, timeout: float = 15.0, *, interval: float = 0.01) -> None:
    """Return as soon as `predicate()` (plain or async) is true; raise `TimeoutError` after `timeout` seconds."""
    async with asyncio.timeout(timeout):
        while True:
            result = predicate()
            if inspect.isawaitable(result):
                result = await result
            if result:
                return
            await asyncio.sleep(interval)
