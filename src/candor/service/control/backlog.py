"""`purge_outbox` and `report_backlog` (§9.8, §10.2, §10.4): retention and the backlog gauges with their alert timer."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from ..core import Service
from ..metrics import BACKLOG_OLDEST_AGE, BACKLOG_SIZE, OUTBOX_BACKLOG_ALERT, OUTBOX_DEAD
from ..settings import OUTBOX_KINDS
from ..store.outbox import has_dead, purge, read_backlog, read_runs_backlog

__all__ = ("purge_outbox", "BacklogAlarm", "report_backlog")

log = logging.getLogger("candor.control")


async def purge_outbox(service: Service) -> int:
    """S-115: delete settled rows past their kind's retention, `purge_batch` per short transaction, within
    `purge_budget_seconds` of the service clock; returns how many rows were removed."""
    settings = service.settings.outbox
    clock = service.clock
    started = clock.monotonic()
    removed = 0
    for kind in OUTBOX_KINDS:
        policy = settings.policy(kind)
        while clock.monotonic() - started < settings.purge_budget_seconds:
            count = await purge(
                service.engine,
                kind=kind,
                delivered_retention_seconds=policy.delivered_retention_seconds,
                dead_retention_seconds=policy.dead_retention_seconds,
                batch=settings.purge_batch,
            )
            removed += count
            if count < settings.purge_batch:
                break
    return removed


@dataclass(kw_only=True)
class BacklogAlarm:
    """S-117: per-process timers (monotonic start of the current breach per kind), reset on restart."""

    breach_since: dict[str, float] = field(default_factory=dict)
    alerting: set[str] = field(default_factory=set)
    dead: set[str] = field(default_factory=set)


async def report_backlog(service: Service, *, alarm: BacklogAlarm) -> None:
    """Refresh `candor_backlog_*`, `candor_outbox_dead` (S-116) and `candor_outbox_backlog_alert` (S-117)."""
    runs = await read_runs_backlog(service.engine)
    BACKLOG_SIZE.labels(queue="runs").set(runs.size)
    BACKLOG_OLDEST_AGE.labels(queue="runs").set(runs.oldest_age_seconds)
    now = service.clock.monotonic()
    for kind in OUTBOX_KINDS:
        policy = service.settings.outbox.policy(kind)
        backlog = await read_backlog(service.engine, kind=kind)
        BACKLOG_SIZE.labels(queue=kind).set(backlog.size)
        BACKLOG_OLDEST_AGE.labels(queue=kind).set(backlog.oldest_age_seconds)
        breached = backlog.size >= policy.backlog_count or backlog.oldest_age_seconds >= policy.backlog_age_seconds
        if breached:
            since = alarm.breach_since.setdefault(kind, now)
            if now - since >= policy.backlog_alert_seconds and kind not in alarm.alerting:
                alarm.alerting.add(kind)
                log.warning(
                    "Outbox backlog sustained",
                    extra={"kind": kind, "size": backlog.size, "oldest_age_seconds": backlog.oldest_age_seconds},
                )
        else:
            alarm.breach_since.pop(kind, None)
            if kind in alarm.alerting:
                alarm.alerting.discard(kind)
                log.info("Outbox backlog recovered", extra={"kind": kind})
        OUTBOX_BACKLOG_ALERT.labels(kind=kind).set(1 if kind in alarm.alerting else 0)
        dead = await has_dead(service.engine, kind=kind)
        if dead and kind not in alarm.dead:
            log.warning("Outbox has dead deliveries", extra={"kind": kind})
        (alarm.dead.add if dead else alarm.dead.discard)(kind)
        OUTBOX_DEAD.labels(kind=kind).set(1 if dead else 0)
