"""Metrics of §10.4 wired in this build: runs accepted/sealed, sweep passes (S-125), the outbox sweeps (§10.2), and the
worker's attempt durations, slot gauges and checkpoint commit bytes."""

from __future__ import annotations

import asyncio
import random
from typing import Any

from prometheus_client import REGISTRY

from candor.service import commands
from candor.service.control.sweeps import Sweep, run_sweep, sweep_table
from candor.service.metrics import attempt_status_label
from candor.service.outbox.delivery import deliver_outbox
from candor.service.runtime import FakeClock
from candor.service.store.db.engine import write_transaction
from candor.service.worker import WorkerLoop
from candor.service.worker.loop import slot_counts

from commands.helpers import TEXT, new_key
from commands.helpers import make_service as command_service
from outbox import support
from worker import support as worker_support
from worker.support import add_thread_run


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


async def test_attempt_duration_and_checkpoint_commit_bytes(db: Any, tenant: Any) -> None:
    """§10.4: `candor_attempt_duration_seconds{status}` once per attempt, labelled with its §5.3 status;
    `candor_checkpoint_commit_bytes{boundary}` once per commit with the bytes it wrote: the `step` script commits a
    model, a tool and a model boundary, then the final (sealing) commit, counted as a model boundary."""
    service = worker_support.make_service(db.url, db.engine)
    async with db.engine.begin() as conn:
        await add_thread_run(conn, tenant, script="step")
        await add_thread_run(conn, tenant, script="boom")
    names = ("candor_checkpoint_commit_bytes_count", "candor_checkpoint_commit_bytes_sum")
    before = {(name, kind): _value(name, boundary=kind) for name in names for kind in ("model", "tool")}
    succeeded = _value("candor_attempt_duration_seconds_count", status="succeeded")
    failed = _value("candor_attempt_duration_seconds_count", status="failed")
    seconds = _value("candor_attempt_duration_seconds_sum", status="succeeded")
    await WorkerLoop(service, worker_id="w1").run_until_idle(timeout=30)
    assert _value("candor_attempt_duration_seconds_count", status="succeeded") == succeeded + 1
    assert _value("candor_attempt_duration_seconds_count", status="failed") == failed + 1  # agent_unavailable
    assert _value("candor_attempt_duration_seconds_sum", status="succeeded") > seconds
    counts = {kind: _value(names[0], boundary=kind) - before[(names[0], kind)] for kind in ("model", "tool")}
    assert counts == {"model": 3, "tool": 1}
    for kind in ("model", "tool"):  # every commit writes at least its envelope and one message
        assert _value(names[1], boundary=kind) - before[(names[1], kind)] >= 100 * counts[kind]


def test_slot_counts_are_busy_attempts_and_claimable_slots() -> None:
    """§10.4: `candor_worker_slots{state}` – busy = live attempts; free = slots still claimable, none while the loop
    does not claim (S-12: never more than the slots)."""
    assert slot_counts(slots=4, busy=1, claiming=True) == {"busy": 1, "free": 3}
    assert slot_counts(slots=2, busy=2, claiming=True) == {"busy": 2, "free": 0}
    assert slot_counts(slots=4, busy=1, claiming=False) == {"busy": 1, "free": 0}


async def test_worker_slot_gauges_follow_the_loop(db: Any, tenant: Any) -> None:
    """§10.4: while a two-slot loop runs one attempt, `candor_worker_slots` shows one busy and one free slot more;
    once the loop has returned its share is gone again."""
    service = worker_support.make_service(db.url, db.engine)
    control = worker_support.CONTROL
    control.model_gate = asyncio.Event()
    async with db.engine.begin() as conn:
        await add_thread_run(conn, tenant, script="echo")
    busy, free = _value("candor_worker_slots", state="busy"), _value("candor_worker_slots", state="free")
    loop = WorkerLoop(service, worker_id="w1", slots=2)
    task = asyncio.create_task(loop.run_until_idle(timeout=30))
    try:
        await asyncio.wait_for(control.model_entered.wait(), timeout=10)
        assert _value("candor_worker_slots", state="busy") == busy + 1
        assert _value("candor_worker_slots", state="free") == free + 1
        loop.stop_claiming()  # draining: the free slot is no longer claimable
        assert _value("candor_worker_slots", state="free") == free
    finally:
        control.model_gate.set()
        await asyncio.wait_for(task, timeout=30)
    assert _value("candor_worker_slots", state="busy") == busy
    assert _value("candor_worker_slots", state="free") == free


def test_attempt_status_label_is_the_attempt_status() -> None:
    """§10.4, §5.3: a sealed run's status maps to its attempt's status; recoveries and abandoned attempts keep theirs."""
    assert [attempt_status_label(s) for s in ("completed", "waiting", "failed", "cancelled")] == [
        "succeeded",
        "succeeded",
        "failed",
        "cancelled",
    ]
    assert [attempt_status_label(s) for s in ("yielded", "abandoned", "crashed")] == ["yielded", "abandoned", "crashed"]
