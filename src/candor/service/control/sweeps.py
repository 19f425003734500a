"""The sweep runner (§10.2: jitter, bounded passes, retry next period) and the table of the control role's sweeps.

Each sweep starts after a random delay of at most one period, then runs one pass per period, each bounded by a
timeout. A failed pass logs "Sweep failed" and the sweep runs again at its next period (S-125). Sleeps use the
service clock and the jitter its entropy, so tests can drive sweeps with `FakeClock` and a seeded source.

`expire_leases` (§7.5) lives here; the other sweeps of §10.2 join the table as their owners add them.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..core import Service
from ..protocol.outcomes import Requeue
from ..runtime import Clock
from ..store.recovery import list_expired_attempts, recover_attempt

__all__ = ("Sweep", "ExpiryCursor", "expire_leases", "sweep_table", "run_sweep", "run_sweeps")

log = logging.getLogger("candor.control")


@dataclass(frozen=True, kw_only=True, slots=True)
class Sweep:
    """One periodic control task."""

    name: str
    period: float
    """Seconds between passes (and the largest initial delay)."""
    run: Callable[[], Awaitable[Any]]
    """One pass."""
    timeout: float
    """Longest a pass may take before it counts as failed."""


@dataclass(kw_only=True)
class ExpiryCursor:
    """The rotating `(lease_expires_at, attempt_id)` cursor of `expire_leases` (§7.5), kept between passes."""

    after: tuple[float, str] | None = None


async def expire_leases(service: Service, *, cursor: ExpiryCursor | None = None, batch: int | None = None) -> int:
    """§7.5 (S-27, S-28): recover every live, current attempt whose lease ran out as failed `lease_expired`.

    Pages through the candidates by `(lease_expires_at, id)` from `cursor`, wrapping around once; each candidate
    is recovered in its own transaction that skips locked rows and re-checks expiry under lock. Returns how many
    attempts were recovered in this pass.
    """
    cursor = cursor if cursor is not None else ExpiryCursor()
    limit = batch or service.settings.control.sweep_batch
    recovered = 0
    wrapped = cursor.after is None
    while True:
        page = await list_expired_attempts(service.engine, after=cursor.after, limit=limit)
        for candidate in page:
            cursor.after = (candidate.lease_expires_at, candidate.attempt_id)
            decision = await recover_attempt(
                service.engine,
                run_id=candidate.run_id,
                attempt_id=candidate.attempt_id,
                outcome="failed",
                failure_code="lease_expired",
            )
            if decision is None:
                continue  # locked by someone else, or renewed meanwhile: looked at again next pass
            recovered += 1
            log.info("Lease expired", extra={"run_id": candidate.run_id, "attempt_id": candidate.attempt_id})
            if isinstance(decision, Requeue) and decision.wake_workers:
                service.wake_workers()
        if len(page) < limit:
            cursor.after = None
            if wrapped:
                return recovered
            wrapped = True


def sweep_table(service: Service) -> tuple[Sweep, ...]:
    """The sweeps of §10.2 this build runs, with their periods and pass timeouts.

    A pass may take at most its period, but never less than three `database.timeout`s (one page read plus the
    recoveries of a short page must fit even on a slow database).
    """
    settings = service.settings
    cursor = ExpiryCursor()
    floor = 3 * settings.database.timeout
    period = settings.worker.authority_seconds
    # TODO(control): advance_threads, deliver_outbox, purge_outbox, trim_streams and report_backlog (§10.2).
    return (
        Sweep(
            name="expire_leases",
            period=period,
            run=lambda: expire_leases(service, cursor=cursor),
            timeout=max(period, floor),
        ),
    )


async def run_sweep(sweep: Sweep, *, clock: Clock, rng: random.Random) -> None:
    """Run `sweep` forever: random initial delay ≤ period, one bounded pass per period, failures retried (S-125)."""
    await clock.sleep(rng.uniform(0, sweep.period))
    while True:
        try:
            await asyncio.wait_for(sweep.run(), timeout=sweep.timeout)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - S-125: logged, retried at the next period
            log.warning("Sweep failed", extra={"sweep": sweep.name, "error_type": type(exc).__name__})
            # TODO(metrics): candor_sweep_passes_total{sweep, result="failed"} once metrics.py exists (S-125).
        await clock.sleep(sweep.period)


async def run_sweeps(service: Service, sweeps: Sequence[Sweep] | None = None) -> None:
    """Run every sweep of `sweeps` (default: `sweep_table(service)`) until cancelled; names must be unique (§3.3)."""
    table = tuple(sweeps) if sweeps is not None else sweep_table(service)
    names = [sweep.name for sweep in table]
    if len(set(names)) != len(names):
        raise ValueError(f"sweep names must be unique: {sorted(names)}")
    rng = service.entropy.random()
    tasks = [
        asyncio.create_task(run_sweep(sweep, clock=service.clock, rng=rng), name=f"candor-sweep-{sweep.name}")
        for sweep in table
    ]
    try:
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
