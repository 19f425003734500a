"""Clock and Entropy sources of service/runtime.py (STYLE §2 habit 7: inject the clock and the randomness)."""

from __future__ import annotations

import asyncio
import random
from datetime import UTC, datetime, timedelta, timezone

import pytest

from candor.service.runtime import Clock, Entropy, FakeClock, SeededEntropy, SystemClock, SystemEntropy


def test_implementations_satisfy_the_protocols():
    """STYLE habit 7: the real and the test sources are interchangeable behind `Clock` and `Entropy`."""
    assert isinstance(SystemClock(), Clock)
    assert isinstance(FakeClock(), Clock)
    assert isinstance(SystemEntropy(), Entropy)
    assert isinstance(SeededEntropy(1), Entropy)


async def test_system_clock():
    """The real clock: aware UTC wall time, a non-decreasing monotonic counter, a real sleep."""
    clock = SystemClock()
    now = clock.now()
    assert now.tzinfo is not None and now.utcoffset() == timedelta(0)
    before = clock.monotonic()
    await clock.sleep(0.01)
    assert clock.monotonic() >= before + 0.005
    assert clock.now() >= now


def test_fake_clock_start_and_advance():
    """The fake clock moves only when told, wall time and monotonic time together."""
    start = datetime(2030, 6, 1, 12, 0, tzinfo=UTC)
    clock = FakeClock(start, monotonic=100.0)
    assert clock.now() == start and clock.monotonic() == 100.0
    clock.advance(2.5)
    assert clock.now() == start + timedelta(seconds=2.5)
    assert clock.monotonic() == 102.5
    clock.advance(0)
    assert clock.monotonic() == 102.5


def test_fake_clock_normalises_to_utc_and_refuses_naive_or_backwards():
    """`now()` is aware UTC whatever zone the start was given in; naive starts and negative advances are refused."""
    clock = FakeClock(datetime(2030, 1, 1, 2, 0, tzinfo=timezone(timedelta(hours=2))))
    assert clock.now() == datetime(2030, 1, 1, 0, 0, tzinfo=UTC)
    assert clock.now().tzinfo == UTC
    with pytest.raises(ValueError):
        FakeClock(datetime(2030, 1, 1))
    with pytest.raises(ValueError):
        clock.advance(-1)


async def test_fake_sleep_resolves_only_when_advanced():
    """A sleep waits for `advance()` to reach its deadline, never for real time."""
    clock = FakeClock()
    task = asyncio.create_task(clock.sleep(10))
    await clock.settle()
    assert clock.sleepers == 1
    clock.advance(9.999)
    await clock.settle()
    assert not task.done()
    clock.advance(0.001)
    await clock.settle()
    assert task.done() and task.result() is None
    assert clock.sleepers == 0


async def test_fake_sleepers_wake_in_deadline_order_and_one_advance_wakes_many():
    """One large advance wakes every due sleeper, earliest deadline first; later ones keep waiting."""
    clock = FakeClock()
    woke: list[str] = []

    async def sleeper(label: str, seconds: float) -> None:
        await clock.sleep(seconds)
        woke.append(label)

    tasks = [asyncio.create_task(sleeper(label, s)) for label, s in (("c", 3), ("a", 1), ("b", 2), ("z", 50))]
    await clock.settle()
    clock.advance(5)
    await clock.settle()
    assert woke == ["a", "b", "c"]
    assert clock.sleepers == 1
    clock.advance(45)
    await clock.settle()
    assert woke == ["a", "b", "c", "z"]
    await asyncio.gather(*tasks)


async def test_fake_sleep_deadline_is_relative_to_when_it_started():
    """A sleep started after an advance counts from the clock's time at that moment."""
    clock = FakeClock()
    clock.advance(100)
    task = asyncio.create_task(clock.sleep(5))
    await clock.settle()
    clock.advance(4)
    await clock.settle()
    assert not task.done()
    clock.advance(1)
    await clock.settle()
    assert task.done()


async def test_fake_sleep_of_zero_or_less_only_yields():
    """`sleep(0)` and negative sleeps return without an advance, like `asyncio.sleep`."""
    clock = FakeClock()
    await asyncio.wait_for(clock.sleep(0), timeout=1)
    await asyncio.wait_for(clock.sleep(-3), timeout=1)
    assert clock.sleepers == 0


async def test_cancelled_fake_sleep_is_dropped():
    """A cancelled sleep no longer counts and a later advance skips it."""
    clock = FakeClock()
    task = asyncio.create_task(clock.sleep(1))
    await clock.settle()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert clock.sleepers == 0
    clock.advance(2)


def test_seeded_entropy_reproduces():
    """STYLE habit 7: a seeded source makes failures reproduce; the same seed gives the same draws."""
    first, second = SeededEntropy(42), SeededEntropy(42)
    assert first.token_bytes(16) == second.token_bytes(16)
    assert [first.random().random() for _ in range(5)] == [second.random().random() for _ in range(5)]
    assert SeededEntropy(43).token_bytes(16) != SeededEntropy(42).token_bytes(16)


def test_seeded_streams_are_independent():
    """Drawing tokens never shifts the jitter sequence, so adding a token draw keeps a test's delays."""
    plain, with_tokens = SeededEntropy(7), SeededEntropy(7)
    with_tokens.token_bytes(32)
    assert plain.random().uniform(0.8, 1.0) == with_tokens.random().uniform(0.8, 1.0)


def test_random_returns_one_source_per_entropy():
    """`random()` hands out the same `random.Random` every call, so successive draws continue one sequence."""
    for entropy in (SystemEntropy(), SeededEntropy(3)):
        assert entropy.random() is entropy.random()
        assert isinstance(entropy.random(), random.Random)


@pytest.mark.parametrize("entropy", [SystemEntropy(), SeededEntropy(0)], ids=["system", "seeded"])
@pytest.mark.parametrize("n", [0, 1, 32])
def test_token_bytes_length(entropy, n):
    """`token_bytes(n)` returns exactly n bytes; a negative n is refused."""
    token = entropy.token_bytes(n)
    assert isinstance(token, bytes) and len(token) == n
    with pytest.raises(ValueError):
        entropy.token_bytes(-1)


def test_system_tokens_differ():
    """The system source is not predictable: two 32-byte tokens differ."""
    entropy = SystemEntropy()
    assert entropy.token_bytes(32) != entropy.token_bytes(32)
