"""The supervisor (§7.4): every `worker.authority_seconds`, cancellation and authority checks, renewal, deadlines.

One heartbeat, bounded by `worker.authority_seconds`: one lock-free read of each running attempt's run and its
principal's authority stops it `cancelled` (S-57) or `failed`/`authority_revoked` (S-61, S-62, S-127), and any
*unavailable* check fails the heartbeat, stopping and extending nothing (S-26); then the leases due by the local
clock are renewed in a write transaction of their own (S-23), each confirmed renewal moving its local deadline.
After every tick an attempt whose local deadline is reached is cancelled once and writes nothing more (S-24).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

from ..core import Service
from ..errors import StoreUnavailable
from ..protocol.db_faults import describe_database_error
from ..protocol.fencing import renewal_due_locally
from ..store.runs import HeartbeatFacts, read_heartbeat_facts, renew_leases
from .handle import AttemptHandle, StopReason

__all__ = ("HeartbeatFailed", "Supervisor", "heartbeat_stops")

log = logging.getLogger("candor.worker")


class HeartbeatFailed(Exception):
    """S-26: the authority checks were unavailable; nothing was stopped or extended."""


class Supervisor:
    """Heartbeats for the live attempts of one worker."""

    def __init__(self, service: Service, *, handles: Callable[[], Sequence[AttemptHandle]]) -> None:
        self.service = service
        self._handles = handles

    async def run_forever(self) -> None:
        """A tick every `worker.authority_seconds`, start to start (a slow heartbeat does not stretch the period)."""
        clock, period = self.service.clock, self.service.settings.worker.authority_seconds
        while True:
            started = clock.monotonic()
            await self.tick()
            await clock.sleep(max(0.0, period - (clock.monotonic() - started)))

    async def tick(self) -> None:
        """One heartbeat (bounded by `worker.authority_seconds`), then the deadline check."""
        period = self.service.settings.worker.authority_seconds
        try:
            async with asyncio.timeout(period):  # not wait_for: on 3.11 it can swallow a cancellation (tests)
                await self.heartbeat()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - a failed heartbeat extends nothing; deadlines still apply
            log.warning(
                "Heartbeat failed", extra={"error_type": type(exc).__name__, "cause": describe_database_error(exc)}
            )
        self.enforce_deadlines()

    async def heartbeat(self) -> set[str]:
        """§7.4 steps 1–2; returns the attempt ids whose lease was renewed. Raises on failure (S-26).

        Usually one read transaction: the renewal's write transaction runs only when a lease is due by the local
        clock (`renewal_due_locally`), about every `lease_seconds / 3`.
        """
        handles = [h for h in self._handles() if not h.deadline_cancelled and not _done(h)]
        if not handles:
            return set()
        sent_at = self.service.clock.monotonic()
        try:
            facts = await read_heartbeat_facts(self.service.heartbeat_engine, [h.lease.run_id for h in handles])
        except StoreUnavailable as error:  # the authority checks among them: S-26, stop nothing, extend nothing
            raise HeartbeatFailed("the authority checks were unavailable") from error
        for handle, reason in heartbeat_stops(handles, facts):
            log.info("Attempt stop requested", extra={"run_id": handle.lease.run_id, "reason": reason})
            handle.request_stop(reason)
        due = [h for h in handles if renewal_due_locally(sent_at, h.deadline, h.lease_seconds)]
        if not due:
            return set()
        renewed = await renew_leases(
            self.service.heartbeat_engine,
            [h.lease for h in due],
            lease_seconds=self.service.settings.worker.lease_seconds,
        )
        for handle in due:
            if handle.lease.attempt_id in renewed:
                handle.renewed(sent_at)
        return renewed

    def enforce_deadlines(self) -> None:
        """S-24: cancel, once, each attempt whose local lease deadline is reached."""
        now = self.service.clock.monotonic()
        for handle in self._handles():
            if not _done(handle) and handle.deadline_reached(now) and handle.cancel_for_deadline():
                log.warning("Attempt lease deadline reached", extra={"run_id": handle.lease.run_id})


def heartbeat_stops(handles: Sequence[AttemptHandle], facts: HeartbeatFacts) -> list[tuple[AttemptHandle, StopReason]]:
    """§7.4 step 1's decision: `cancelled` for a run asked to cancel (S-57), otherwise `authority_revoked` for one
    whose principal's check was *refused* (S-61); a run not found is left to the fence."""
    stops: list[tuple[AttemptHandle, StopReason]] = []
    for handle in handles:
        run = facts.runs.get(handle.lease.run_id)
        if run is None:
            continue
        if run.cancel_requested:
            stops.append((handle, "cancelled"))
        elif facts.verdicts.get(run.principal_id) == "refused":
            stops.append((handle, "authority_revoked"))
    return stops


def _done(handle: AttemptHandle) -> bool:
    return handle.task is not None and handle.task.done()
