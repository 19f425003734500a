"""SIGTERM handoff (§7.11): stop claiming, flag attempts for handoff, keep renewing for up to `worker.drain_seconds`.

A flagged attempt yields at its next model boundary, right after committing it, or at once if it has not started
the harness (S-53, S-54); the run goes back to `accepted`, due now and uncharged. Attempts still running at the
deadline are abandoned: their tasks are cancelled without any further fenced write (their usage is still
recorded), and `expire_leases` recovers them after their leases run out, charged (S-55).
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable

from .loop import WorkerLoop

__all__ = ("drain", "install_sigterm")

log = logging.getLogger("candor.worker")


async def drain(worker: WorkerLoop, *, drain_seconds: float | None = None) -> int:
    """Drain `worker` (§7.11) and stop its loop; returns how many attempts were abandoned at the deadline.

    The supervisor keeps renewing leases while this waits, as long as `run_forever()` is running.
    """
    seconds = worker.service.settings.worker.drain_seconds if drain_seconds is None else drain_seconds
    worker.stop_claiming()  # S-52
    for handle in worker.live_handles():
        handle.request_handoff()
    leftovers = await worker.wait_attempts(timeout=seconds)
    for handle in leftovers:
        log.warning("Attempt abandoned at drain deadline", extra={"run_id": handle.lease.run_id})
        handle.cancel_for_deadline()  # no further fenced write; the lease expires and is recovered, charged
    if leftovers:
        await worker.wait_attempts(timeout=worker.service.settings.database.timeout)
    worker.stop()
    return len(leftovers)


def install_sigterm(worker: WorkerLoop, *, on_drained: Callable[[], None] | None = None) -> None:
    """On SIGTERM (and SIGINT), drain `worker` once; `on_drained` runs afterwards (for example to stop a server)."""
    loop = asyncio.get_running_loop()
    started: list[asyncio.Task[int]] = []

    def _handle() -> None:
        if started:
            return
        task = loop.create_task(drain(worker), name=f"candor-drain-{worker.worker_id}")
        started.append(task)
        if on_drained is not None:
            task.add_done_callback(lambda _: on_drained())

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, _handle)
