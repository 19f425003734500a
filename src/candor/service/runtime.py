"""Clock and Entropy: the process-side time and randomness every service component takes as an argument.

Leases and due times use the database clock (§2.2); these sources are for the process side only: scan periods,
sleeps, jitter, backoff and tokens (STYLE §2 habit 7). Each protocol has a real implementation and a
deterministic one; `FakeClock` is the test double and lives here so every test imports the same one.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import random
import secrets
import time
from datetime import UTC, datetime, timedelta
from typing import Protocol, runtime_checkable

__all__ = (
    "Clock",
    "SystemClock",
    "FakeClock",
    "Entropy",
    "SystemEntropy",
    "SeededEntropy",
)


@runtime_checkable
class Clock(Protocol):
    """Wall time, a monotonic counter, and sleeping."""

    def now(self) -> datetime:
        """The current time, timezone-aware in UTC."""
        ...

    def monotonic(self) -> float:
        """Seconds on a counter that never goes backwards; only differences mean anything."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Suspend the calling task for `seconds` (≤ 0 only yields to the loop)."""
        ...


class SystemClock:
    """The host's clock and the event loop's sleep."""

    def now(self) -> datetime:
        return datetime.now(UTC)

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


_FAKE_EPOCH = datetime(2025, 1, 1, tzinfo=UTC)


class FakeClock:
    """A clock that moves only when a test calls `advance()`; sleeps resolve when their deadline is reached.

    `advance()` wakes due sleepers in deadline order but does not run them: the woken tasks continue the next
    time the test yields to the loop (`await asyncio.sleep(0)`, or `await clock.settle()`).
    """

    def __init__(self, start: datetime = _FAKE_EPOCH, *, monotonic: float = 0.0) -> None:
        if start.tzinfo is None or start.utcoffset() is None:
            raise ValueError("FakeClock start must be timezone-aware")
        self._now = start.astimezone(UTC)
        self._monotonic = float(monotonic)
        self._order = itertools.count()
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []

    def now(self) -> datetime:
        return self._now

    def monotonic(self) -> float:
        return self._monotonic

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (self._monotonic + seconds, next(self._order), waiter)
        heapq.heappush(self._sleepers, entry)
        try:
            await waiter
        except asyncio.CancelledError:
            if entry in self._sleepers:
                self._sleepers.remove(entry)
                heapq.heapify(self._sleepers)
            raise

    @property
    def sleepers(self) -> int:
        """How many sleeps are waiting for the clock to advance."""
        return sum(1 for _, _, waiter in self._sleepers if not waiter.done())

    def advance(self, seconds: float) -> None:
        """Move both clocks forward by `seconds` and wake every sleep whose deadline is now reached."""
        if seconds < 0:
            raise ValueError(f"a clock cannot go backwards, got {seconds}")
        self._monotonic += seconds
        self._now += timedelta(seconds=seconds)
        while self._sleepers and self._sleepers[0][0] <= self._monotonic:
            _, _, waiter = heapq.heappop(self._sleepers)
            if not waiter.done():
                waiter.set_result(None)

    async def settle(self, *, rounds: int = 10) -> None:
        """Yield to the loop a few times so tasks woken by `advance()` run up to their next await."""
        for _ in range(rounds):
            await asyncio.sleep(0)


@runtime_checkable
class Entropy(Protocol):
    """Random bytes for tokens and a `random.Random` for jitter."""

    def token_bytes(self, n: int) -> bytes:
        """`n` random bytes."""
        ...

    def random(self) -> random.Random:
        """The random source for jitter and backoff; the same object on every call."""
        ...


class SystemEntropy:
    """The operating system's randomness: `secrets` for tokens, `random.SystemRandom` for jitter."""

    def __init__(self) -> None:
        self._rng = random.SystemRandom()

    def token_bytes(self, n: int) -> bytes:
        return secrets.token_bytes(n)

    def random(self) -> random.Random:
        return self._rng


class SeededEntropy:
    """Reproducible randomness: the same seed gives the same tokens and the same jitter.

    Tokens and jitter come from two streams derived from the seed, so drawing one never shifts the other.
    Never use it outside tests: its tokens are predictable.
    """

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self._rng = random.Random(seed)
        self._tokens = random.Random(f"candor.token_bytes:{seed}")

    def token_bytes(self, n: int) -> bytes:
        if n < 0:
            raise ValueError(f"n must be ≥ 0, got {n}")
        return self._tokens.randbytes(n)

    def random(self) -> random.Random:
        return self._rng
