"""The sweep runner (§10.2: jitter, bounded passes, retry next period) and the table of the control role's sweeps.

Each sweep starts after a random delay of at most one period, then runs one pass per period, each bounded by a
timeout. A sweep whose pass says there is more to do (`again`, e.g. `deliver_outbox` after a full batch) runs its
next pass at once instead of a period later. A failed pass logs "Sweep failed" and the sweep runs again at its next
period (S-125). Sleeps use the service clock and the jitter its entropy, so tests can drive sweeps with `FakeClock`
and a seeded source.

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
from ..metrics import SWEEP_PASSES
from ..outbox.delivery import DeliveryLoop
from ..protocol.db_faults import describe_database_error
from ..protocol.outcomes import Requeue
from ..runtime import Clock
from ..settings import OUTBOX_KINDS
from ..store.attempts import list_expired_attempts, recover_attempt
from ..store.threads import TrimResult
from ..store.threads import trim_streams as trim_stream_entries
from .advance import advance_threads
from .backlog import BacklogAlarm, purge_outbox, report_backlog

__all__ = ("Sweep", "ExpiryCursor", "expire_leases", "trim_streams", "sweep_table", "run_sweep", "run_sweeps")

log = logging.getLogger("candor.control")

REPORT_BACKLOG_SECONDS = 15.0
"""§10.2: backlog gauges are refreshed every 15 s."""


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
    again: Callable[[Any], bool] | None = None
    """Given a successful pass's result: whether to run the next pass now instead of one period later."""
    close: Callable[[], Awaitable[None]] | None = None
    """Releases what the sweep holds across passes (a connection pool) when it stops."""


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


async def trim_streams(service: Service) -> TrimResult:
    """§8.7, S-105: remove stream entries covered by a checkpoint for `worker.stream_trim_seconds`, older than
    `worker.stream_ttl`, or beyond `worker.stream_length` per thread."""
    worker = service.settings.worker
    return await trim_stream_entries(
        service.engine,
        trim_seconds=worker.stream_trim_seconds,
        ttl_seconds=worker.stream_ttl,
        length=worker.stream_length,
        batch=service.settings.control.sweep_batch,
    )


def _outbox_sweeps(service: Service, *, floor: float) -> tuple[Sweep, ...]:
    """`deliver_outbox`, `purge_outbox` and `report_backlog` (§10.2)."""
    settings = service.settings
    scan = settings.control.scan_seconds
    # §9.2: a deliver pass ends within two lease periods of its slowest kind.
    deliver_timeout = max(2 * max(settings.outbox.policy(kind).lease_seconds for kind in OUTBOX_KINDS), floor)
    purge_period = settings.outbox.purge_interval_seconds
    alarm = BacklogAlarm()
    delivery = DeliveryLoop(service)
    return (
        Sweep(
            name="deliver_outbox",
            period=scan,
            run=delivery.run_pass,
            timeout=deliver_timeout,
            again=delivery.wants_another_pass,
            close=delivery.aclose,
        ),
        Sweep(
            name="purge_outbox",
            period=purge_period,
            run=lambda: purge_outbox(service),
            timeout=settings.outbox.purge_budget_seconds + floor,
        ),
        Sweep(
            name="report_backlog",
            period=REPORT_BACKLOG_SECONDS,
            run=lambda: report_backlog(service, alarm=alarm),
            timeout=max(REPORT_BACKLOG_SECONDS, floor),
        ),
    )


def sweep_table(service: Service) -> tuple[Sweep, ...]:
    """The sweeps of §10.2 this build runs, with their periods and pass timeouts.

    A pass may take at most its period, but never less than three `database.timeout`s (one page read plus the
    recoveries of a short page must fit even on a slow database).
    """
    settings = service.settings
    cursor = ExpiryCursor()
    floor = 3 * settings.database.timeout
    period = settings.worker.authority_seconds
    trim_period = settings.worker.stream_trim_seconds
    scan = settings.control.scan_seconds
    return (
        Sweep(
            name="expire_leases",
            period=period,
            run=lambda: expire_leases(service, cursor=cursor),
            timeout=max(period, floor),
        ),
        Sweep(name="advance_threads", period=scan, run=lambda: advance_threads(service), timeout=max(scan, floor)),
        *_outbox_sweeps(service, floor=floor),
        Sweep(
            name="trim_streams", period=trim_period, run=lambda: trim_streams(service), timeout=max(trim_period, floor)
        ),
    )


async def run_sweep(sweep: Sweep, *, clock: Clock, rng: random.Random) -> None:
    """Run `sweep` forever: random initial delay ≤ period, one bounded pass per period (at once when the pass asks
    for `again`), failures retried (S-125); `close` runs when it stops."""
    try:
        await clock.sleep(rng.uniform(0, sweep.period))
        while True:
            more = False
            try:
                async with asyncio.timeout(sweep.timeout):  # not wait_for: it can swallow a cancellation on 3.11
                    result = await sweep.run()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - S-125: logged, retried at the next period
                cause = describe_database_error(exc)
                log.warning(
                    "Sweep failed", extra={"sweep": sweep.name, "error_type": type(exc).__name__, "cause": cause}
                )
                SWEEP_PASSES.labels(sweep=sweep.name, result="failed").inc()  # S-125
            else:
                SWEEP_PASSES.labels(sweep=sweep.name, result="ok").inc()
                more = sweep.again is not None and sweep.again(result)
            await clock.sleep(0 if more else sweep.period)
    finally:
        if sweep.close is not None:
            await sweep.close()


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
