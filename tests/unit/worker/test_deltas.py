"""The worker's delta buffer (§8.7): deltas ride in the boundary commit; a timer writes them alone when they wait."""

from __future__ import annotations

import asyncio

from candor.service.store.threads.streams import NewStreamEntry
from candor.service.worker.deltas import DeltaBuffer


def _delta(sequence: int) -> NewStreamEntry:
    return NewStreamEntry(type="delta", sequence=sequence, event={"n": sequence})


async def test_a_boundary_takes_the_buffer_before_the_timer_fires() -> None:
    """Fast steps: every delta rides in the boundary's transaction, none is written on its own."""
    written: list[list[int]] = []

    async def write(entries: list[NewStreamEntry]) -> None:
        written.append([e.sequence for e in entries])

    buffer = DeltaBuffer(write, flush_seconds=0.2)
    buffer.add(_delta(1))
    buffer.add(_delta(2))
    async with buffer.taken() as entries:
        assert [e.sequence for e in entries] == [1, 2]
    await asyncio.sleep(0.3)
    assert written == []
    assert len(buffer) == 0


async def test_deltas_that_wait_are_written_alone_after_the_interval() -> None:
    """A slowly streaming model: the buffered deltas are written once the oldest waited `flush_seconds`, in
    sequence order, and later deltas arm the timer again."""
    written: list[list[int]] = []

    async def write(entries: list[NewStreamEntry]) -> None:
        written.append([e.sequence for e in entries])

    buffer = DeltaBuffer(write, flush_seconds=0.05)
    buffer.add(_delta(1))
    buffer.add(_delta(2))
    await asyncio.sleep(0.01)
    assert written == []  # not yet: the oldest has waited less than the interval
    await asyncio.sleep(0.15)
    assert written == [[1, 2]]
    buffer.add(_delta(3))
    await asyncio.sleep(0.15)
    assert written == [[1, 2], [3]]
    await buffer.stop_timer()


async def test_a_timer_write_in_flight_finishes_before_the_boundary_takes_the_rest() -> None:
    """The lock orders a slow timer write before the boundary commit, so entries are stored in sequence order."""
    order: list[str] = []
    release = asyncio.Event()

    async def write(entries: list[NewStreamEntry]) -> None:
        order.append(f"timer {[e.sequence for e in entries]}")
        await release.wait()

    buffer = DeltaBuffer(write, flush_seconds=0.01)
    buffer.add(_delta(1))
    await asyncio.sleep(0.05)  # the timer write has started and hangs
    buffer.add(_delta(2))

    async def boundary() -> None:
        async with buffer.taken() as entries:
            order.append(f"boundary {[e.sequence for e in entries]}")

    task = asyncio.create_task(boundary())
    await asyncio.sleep(0.02)
    assert order == ["timer [1]"]
    release.set()
    await task
    assert order == ["timer [1]", "boundary [2]"]
    await buffer.stop_timer()


async def test_after_stop_no_timer_write_happens_and_the_buffer_is_kept() -> None:
    written: list[list[int]] = []

    async def write(entries: list[NewStreamEntry]) -> None:
        written.append([e.sequence for e in entries])

    buffer = DeltaBuffer(write, flush_seconds=0.02)
    buffer.add(_delta(1))
    await buffer.stop_timer()
    buffer.add(_delta(2))
    await asyncio.sleep(0.08)
    assert written == []
    async with buffer.taken() as entries:  # the settling write still gets them
        assert [e.sequence for e in entries] == [1, 2]
