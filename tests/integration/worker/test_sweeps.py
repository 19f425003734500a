"""The sweep runner (§10.2, S-125) on a FakeClock, and the sweep table."""

from __future__ import annotations

import asyncio
import logging
import random

import pytest

from candor.service.control.sweeps import Sweep, run_sweep, run_sweeps, sweep_table
from candor.service.runtime import FakeClock

from worker import support


async def test_failed_pass_is_logged_and_retried_next_period(caplog) -> None:
    """S-125: a pass that raises or overruns its timeout logs "Sweep failed"; the next period runs it again."""
    clock = FakeClock()
    calls: list[float] = []

    async def one_pass() -> None:
        calls.append(clock.monotonic())
        if len(calls) == 1:
            raise RuntimeError("boom")
        if len(calls) == 2:
            await asyncio.sleep(1)  # overruns the 0.05 s pass timeout

    sweep = Sweep(name="demo", period=2.0, run=one_pass, timeout=0.05)
    with caplog.at_level(logging.WARNING, logger="candor.control"):
        task = asyncio.create_task(run_sweep(sweep, clock=clock, rng=random.Random(7)))
        try:
            await clock.settle()
            assert calls == []  # the random initial delay is at most one period
            clock.advance(2.0)
            await clock.settle()
            assert len(calls) == 1 and 0 <= calls[0] <= 2.0
            clock.advance(2.0)
            await clock.settle()
            await asyncio.sleep(0.1)  # let the second pass time out (real time)
            assert len(calls) == 2
            clock.advance(2.0)
            await clock.settle()
            assert len(calls) == 3
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    failed = [r for r in caplog.records if r.getMessage() == "Sweep failed"]
    assert [r.sweep for r in failed] == ["demo", "demo"]


async def test_sweep_names_must_be_unique(db) -> None:
    """§3.3: sweep names are unique."""
    service = support.make_service(db.url, db.engine)

    async def noop() -> None:
        return None

    sweeps = [Sweep(name="same", period=1, run=noop, timeout=1), Sweep(name="same", period=1, run=noop, timeout=1)]
    with pytest.raises(ValueError):
        await run_sweeps(service, sweeps)


def test_sweep_table_runs_expire_leases_every_authority_period(db) -> None:
    """§10.2: `expire_leases` runs every `worker.authority_seconds`, with a bounded pass."""
    service = support.make_service(db.url, db.engine, authority_seconds=0.5)
    expire, *_ = sweep_table(service)
    assert (expire.name, expire.period) == ("expire_leases", 0.5)
    assert expire.timeout >= expire.period


def test_sweep_table_has_every_control_sweep(db) -> None:
    """§10.2, S-125: the control role runs each sweep of the spec once, each with a bounded pass."""
    service = support.make_service(db.url, db.engine)
    table = sweep_table(service)
    assert sorted(s.name for s in table) == sorted(
        ["advance_threads", "expire_leases", "deliver_outbox", "purge_outbox", "trim_streams", "report_backlog"]
    )
    assert all(s.timeout >= s.period or s.timeout >= 3 * service.settings.database.timeout for s in table)
