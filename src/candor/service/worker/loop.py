"""The worker loop (§7.1): slots, claim scans, wake-ups, and one task per claimed lease.

`run_forever()` claims at most the free slots (S-12), waits for a wake-up or `worker.scan_seconds` when it got fewer
runs than it asked for, and backs off after a claim error (S-18). Each lease runs `run_attempt()` in its own task
whose slot is released in a `finally` (S-19); an escaping exception is logged "Attempt crashed" and left to lease
expiry. `run_until_idle()` returns once nothing is claimable or running. `candor_worker_slots{state}` (§10.4):
`busy` live attempts, `free` the slots the loop could still claim into; each loop adds its share (`slot_counts()`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import AsyncIterator, Awaitable

from ..core import Service
from ..metrics import ATTEMPT_QUEUE_WAIT, WORKER_SLOTS
from ..protocol.db_faults import describe_database_error
from ..store.runs import ClaimedRun, claim_runs
from .attempt import run_attempt
from .handle import AttemptHandle
from .supervisor import Supervisor

__all__ = ("WorkerLoop", "slot_counts")

log = logging.getLogger("candor.worker")


def slot_counts(*, slots: int, busy: int, claiming: bool) -> dict[str, int]:
    """§10.4: one loop's share of `candor_worker_slots` by state."""
    return {"busy": busy, "free": max(slots - busy, 0) if claiming else 0}


class WorkerLoop:
    """Claims and executes runs for one worker process (or one simulated worker in tests)."""

    def __init__(self, service: Service, *, worker_id: str | None = None, slots: int | None = None) -> None:
        self.service = service
        self.worker_id = worker_id or "wrk_" + secrets.token_hex(8)
        self.slots = slots if slots is not None else service.settings.worker.slots
        if self.slots < 1:
            raise ValueError("a worker needs at least one slot")
        self.handles: dict[str, AttemptHandle] = {}
        """Live attempts by attempt id; an entry leaves when its task ends."""
        self.supervisor = Supervisor(service, handles=self.live_handles)
        self.claiming = True
        """False once draining or stopping: no further claims (S-52)."""
        self._changed = asyncio.Event()
        """Set when a slot is released or the loop is told to stop."""
        self._stopped = asyncio.Event()
        self._running = False
        """True while `run_forever()` / `run_until_idle()` runs: only then are free slots claimable."""
        self._published = {"busy": 0, "free": 0}
        """This loop's share of the `candor_worker_slots` gauges, as last added."""

    # -- state -----------------------------------------------------------------------------------------------------

    @property
    def busy(self) -> int:
        return len(self.handles)

    def live_handles(self) -> list[AttemptHandle]:
        return list(self.handles.values())

    def stop_claiming(self) -> None:
        self.claiming = False
        self._changed.set()
        self._publish_slots()

    def stop(self) -> None:
        """End `run_forever()` at its next wait; running attempts are not touched (see `drain.py`)."""
        self.stop_claiming()
        self._stopped.set()

    # -- loops -----------------------------------------------------------------------------------------------------

    async def run_forever(self) -> None:
        """§7.1 until `stop()`; the supervisor runs for as long as this does."""
        async with self._supervised():
            scan = self.service.settings.worker.scan_seconds
            while not self._stopped.is_set():
                if not self.claiming:
                    await self._wait(None)
                    continue
                free = self.slots - self.busy
                if free <= 0:
                    await self._wait(None)  # until a slot is released
                    continue
                claimed = await self.claim_once()
                if claimed is None:
                    await self._wait(scan, wakeups=False)  # S-18: back off after a claim error
                elif claimed < free:
                    await self._wait(scan)

    async def run_until_idle(self, *, timeout: float = 60.0) -> None:
        """Claim and execute until nothing is claimable and no attempt runs; raises `TimeoutError` after `timeout`."""
        async with asyncio.timeout(timeout), self._supervised():
            scan = self.service.settings.worker.scan_seconds
            while True:
                free = self.slots - self.busy
                busy_before = self.busy
                claimed = await self.claim_once() if free > 0 and self.claiming else 0
                # Idle only if no attempt ran while the claim looked: one that ended meanwhile may have made a run
                # due (a seal starts the thread's next run) after the claim's query had already run.
                if claimed == 0 and busy_before == 0 and self.busy == 0:
                    return
                if claimed is None or claimed < free or free <= 0:
                    await self._wait(scan)

    async def claim_once(self) -> int | None:
        """Claim up to the free slots and start their tasks; the number claimed, or None after a claim error."""
        free = self.slots - self.busy
        if free <= 0 or not self.claiming:
            return 0
        settings = self.service.settings.worker
        sent_at = self.service.clock.monotonic()  # §7.4 step 3: the local deadline counts from the send time
        try:
            claimed = await claim_runs(
                self.service.engine,
                worker_id=self.worker_id,
                agents=self.service.agents.names(),
                limit=free,
                lease_seconds=settings.lease_seconds,
                randbytes=self.service.entropy.token_bytes,
            )
        except Exception as exc:  # noqa: BLE001 - S-18: log, sleep scan_seconds, repeat
            extra = {
                "worker_id": self.worker_id,
                "error_type": type(exc).__name__,
                "cause": describe_database_error(exc),
            }
            log.warning("Claim failed", extra=extra)
            return None
        for run in claimed:
            self._start(run, sent_at)
        return len(claimed)

    def _start(self, claimed: ClaimedRun, sent_at: float) -> None:
        lease = claimed.lease
        log.info(
            "Attempt claimed",
            extra={
                "run_id": lease.run_id,
                "attempt": lease.attempt_number,
                "worker_id": self.worker_id,
                "start_reason": claimed.start_reason,
                "queue_wait_ms": claimed.queue_wait_ms,
            },
        )
        ATTEMPT_QUEUE_WAIT.observe(claimed.queue_wait_ms / 1000)
        handle = AttemptHandle(
            claimed=claimed,
            lease_seconds=self.service.settings.worker.lease_seconds,
            sent_at=sent_at,
            started_at=self.service.clock.monotonic(),
            monotonic=self.service.clock.monotonic,
        )
        self.handles[lease.attempt_id] = handle
        self._publish_slots()
        handle.task = asyncio.create_task(self._run(handle), name=f"candor-attempt-{lease.attempt_id}")

    async def _run(self, handle: AttemptHandle) -> None:
        try:
            await run_attempt(self.service, handle)
        except asyncio.CancelledError:
            raise
        except Exception:  # §7.1 step 4: logged, the attempt is left to lease expiry
            lease = handle.lease
            log.exception("Attempt crashed", extra={"run_id": lease.run_id, "attempt": lease.attempt_number})
        finally:  # S-19: the slot comes back whatever happened
            self.handles.pop(handle.lease.attempt_id, None)
            self._publish_slots()
            self._changed.set()

    async def wait_attempts(self, timeout: float | None = None) -> set[AttemptHandle]:
        """Wait (real time) until every live attempt task ended, at most `timeout`; returns the ones still running."""
        pending = {h for h in self.handles.values() if h.task is not None}
        if not pending:
            return set()
        tasks = {h.task: h for h in pending if h.task is not None}
        _, still = await asyncio.wait(tasks, timeout=timeout)
        return {tasks[t] for t in still}

    # -- helpers ---------------------------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _supervised(self) -> AsyncIterator[None]:
        supervisor = asyncio.create_task(self.supervisor.run_forever(), name=f"candor-supervisor-{self.worker_id}")
        self._running = True
        self._publish_slots()
        try:
            yield
        finally:
            self._running = False
            self._publish_slots()
            supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await supervisor

    def _publish_slots(self) -> None:
        """Move this loop's share of `candor_worker_slots` to the current counts (by difference, so the shares of
        several loops in one process add up)."""
        counts = slot_counts(slots=self.slots, busy=self.busy, claiming=self._running and self.claiming)
        for state, value in counts.items():
            WORKER_SLOTS.labels(state=state).inc(value - self._published[state])
        self._published = counts

    async def _wait(self, seconds: float | None, *, wakeups: bool = True) -> None:
        """Until a slot is released, the loop stops, a wake-up arrives (if `wakeups`), or `seconds` pass."""
        waits: list[Awaitable[object]] = [self._changed.wait(), self._stopped.wait()]
        wakeup = self.service.wakeups
        if wakeups and wakeup is not None:
            waits.append(wakeup.wait())
        if seconds is not None:
            waits.append(self.service.clock.sleep(seconds))
        tasks = [asyncio.ensure_future(w) for w in waits]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        self._changed.clear()
        if wakeups and wakeup is not None and wakeup.is_set():
            wakeup.clear()
