"""The `advance_threads` sweep (§10.2, §8.5): idle threads with pending entries get their next run."""

from __future__ import annotations

from typing import Any

from candor.service import commands
from candor.service.control.advance import advance_threads

from commands.helpers import TEXT, make_service, new_key, run_row, seal_run, text, thread_row


async def test_sweep_starts_the_queued_entry_of_an_idle_thread(db: Any) -> None:
    """S-72, S-65 (trigger queued): an entry left pending behind a sealed run starts at the next sweep pass;
    a second pass starts nothing more."""
    service = make_service(db)
    principal = await new_key(service)
    first = await commands.create_thread(service, principal, agent="demo", input=TEXT, key="t1")
    assert first.run is not None
    queued = await commands.post_input(service, principal, first.thread.id, input=text("next"), key="m1")
    assert queued.run is None
    await seal_run(service, first.run.id, "completed")  # sealed without the worker's own hand-over
    assert (await thread_row(service, first.thread.id)).current_run_id is None
    assert await advance_threads(service) == 1
    thread = await thread_row(service, first.thread.id)
    assert thread.current_run_id is not None
    started = await run_row(service, thread.current_run_id)
    assert (started.trigger, started.status) == ("queued", "accepted")
    assert service.wakeups.is_set()
    assert await advance_threads(service) == 0


async def test_sweep_leaves_waiting_and_paused_threads_alone(db: Any) -> None:
    """S-69, S-70: a waiting thread and a paused thread keep their queued entries for the sweep."""
    service = make_service(db)
    principal = await new_key(service)
    for status, key in (("waiting", "w"), ("cancelled", "c")):
        accepted = await commands.create_thread(service, principal, agent="demo", input=TEXT, key=key)
        assert accepted.run is not None
        await commands.post_input(service, principal, accepted.thread.id, input=text("later"), key=key + "-m")
        await seal_run(service, accepted.run.id, status)
    assert await advance_threads(service) == 0
