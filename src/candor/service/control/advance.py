"""The `advance_threads` sweep (§10.2, §8.5): start runs for idle threads with pending entries.

Seals already start a thread's next run right away; the sweep is the mechanism that does not depend on that
(a worker that died after sealing, an entry posted while a start failed as unavailable: S-72).
"""

from __future__ import annotations

import logging

from ..core import Service
from ..store.db import read_transaction, write_transaction
from ..store.threads import advance_thread, threads_to_advance

log = logging.getLogger("candor.control")

__all__ = ("advance_threads",)


async def advance_threads(service: Service, *, batch: int | None = None) -> int:
    """One pass over every candidate thread, each in its own short transaction; the number of runs started."""
    limit = batch if batch is not None else service.settings.control.sweep_batch
    agent_names = service.agents.names()
    started = 0
    after: str | None = None
    while True:
        async with read_transaction(service.engine) as conn:
            candidates = await threads_to_advance(conn, after=after, limit=limit)
        for thread_id in candidates:
            async with write_transaction(service.engine) as conn:
                run_id = await advance_thread(
                    conn,
                    thread_id=thread_id,
                    settings=service.settings,
                    agent_names=agent_names,
                    entropy=service.entropy,
                    alone=True,
                )
            if run_id is not None:
                started += 1
                log.info("Run accepted", extra={"run_id": run_id, "thread_id": thread_id, "trigger": "queued"})
        if len(candidates) < limit:
            break
        after = candidates[-1]
    if started:
        service.wake_workers()
    return started
