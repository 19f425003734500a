"""Metrics of §10.4 wired in this build: runs accepted/sealed, sweep passes (S-125), and the outbox sweeps (§10.2)."""

from __future__ import annotations

import asyncio
import random
from typing import Any

from prometheus_client import REGISTRY

from candor.service import commands
from candor.service.control.sweeps import Sweep, run_sweep, sweep_table
from candor.service.outbox.delivery import deliver_outbox
from candor.service.runtime import FakeClock
from candor.service.store.engine import write_transaction
from candor.service.worker import WorkerLoop

from commands.helpers import TEXT, make_service as command_service, new_key
from worker.support import add_thread_run

from . import support


def _value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def test_run_creation_and_cancel_stage_webhooks_and_count(db: Any, receiver: Any) -> None:
    """S-106: `run.accepted` at creation and `run.cancelled` at the cancel of an accepted run, in their
    transactions; `candor_runs_accepted_total` and `candor_runs_sealed_total` count after commit."""
    service = command_service(db)
    key = await new_key(service)
    tenant = type("T", (), {"workspace_id": key.workspace_id, "principal_id": key.id})()
    async with write_transaction(service.engine) as conn:
        await support.add_subscription(conn, tenant, url=receiver.url, events=["run.accepted", "run.cancelled"])
    accepted_before = _value("candor_runs_accepted_total", trigger="input")
    sealed_before = _value("candor_runs_sealed_total", status="cancelled", reason="cancelled")
    accepted = await commands.create_thread(service, key, agent="demo", input=TEXT, key="k1")
    assert accepted.run is not None
    await commands.interrupt_run(service, key, accepted.run.id)
    rows = await support.outbox_rows(db.engine, kind="webhook")
    assert sorted(row["payload"]["type"] for row in rows) == ["run.accepted", "run.cancelled"]
    assert len(await support.outbox_rows(db.engine, kind="checkpoint_cleanup")) == 1
    assert _value("candor_runs_accepted_total", trigger="input") == accepted_before + 1
    assert _value("candor_runs_sealed_total", status="cancelled", reason="cancelled") == sealed_before + 1


async def test_worker_seal_counts_and_deliveries_count(db: Any, tenant: Any, receiver: Any) -> None:
    """§10.4: `candor_runs_sealed_total{status, reason}` and `candor_outbox_deliveries_total{kind, result}`."""
    service = support.make_service(db.url, db.engine, clock=FakeClock())
    async with db.engine.begin() as conn:
        await support.add_subscription(conn, tenant, url=receiver.url, events=["run.completed"])
        await add_thread_run(conn, tenant)
    sealed = _value("candor_runs_sealed_total", status="completed", reason="completed")
    delivered = _value("candor_outbox_deliveries_total", kind="webhook", result="delivered")
    await WorkerLoop(service, worker_id="w1").run_until_idle(timeout=30)
    await deliver_outbox(service)
    assert _value("candor_runs_sealed_total", status="completed", reason="completed") == sealed + 1
    assert _value("candor_outbox_deliveries_total", kind="webhook", result="delivered") == delivered + 1


async def test_sweep_passes_are_counted_ok_and_failed() -> None:
    """S-125: a failed pass increments `candor_sweep_passes_total{result="failed"}` and runs again next period."""
    clock = FakeClock()
    calls = 0

    async def flaky() -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("boom")

    name = f"test_sweep_{random.randrange(10**9)}"
    task = asyncio.create_task(
        run_sweep(Sweep(name=name, period=1.0, run=flaky, timeout=1.0), clock=clock, rng=random.Random(1))
    )
    try:
        for _ in range(3):
            await clock.settle()
            clock.advance(1.0)
            await clock.settle()
        assert _value("candor_sweep_passes_total", sweep=name, result="failed") == 1
        assert _value("candor_sweep_passes_total", sweep=name, result="ok") >= 1
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def test_sweep_table_has_the_outbox_sweeps(db: Any) -> None:
    """§10.2: `deliver_outbox` every `control.scan_seconds`, `purge_outbox` every `outbox.purge_interval_seconds`,
    `report_backlog` every 15 s."""
    service = support.make_service(db.url, db.engine)
    table = {sweep.name: sweep for sweep in sweep_table(service)}
    assert table["deliver_outbox"].period == service.settings.control.scan_seconds
    assert table["purge_outbox"].period == service.settings.outbox.purge_interval_seconds
    assert table["report_backlog"].period == 15.0
    assert table["deliver_outbox"].timeout >= 2 * service.settings.outbox.policy("webhook").lease_seconds
