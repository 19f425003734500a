"""Fault injection through real `candor serve` processes (issue 34 item 6): a PostgreSQL restart, connection
exhaustion, a black-holed network, a full SQLite filesystem, and a worker frozen past its lease.

Each test runs one scenario of `bench/_fault_scenarios.py` (shared with `bench.soak`) with a few runs and asserts on
its report. The faults shorter than the lease cost nothing: no charged attempt, no unknown outcome told to a model
(the tool ledger is compared with what each model was told), no duplicate effect, no lost run. A worker frozen past
its lease performs no effect after it wakes. PostgreSQL restarts and connection limits use a private server started
for the test (never the shared one); the full filesystem is a small tmpfs (root only, else skipped).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable

import pytest
from bench import _fault_scenarios as scenarios
from bench._faults import FaultUnsupported

pytestmark = [pytest.mark.slow]


def assert_harmless(report: scenarios.FaultReport) -> None:
    """§7.8.1, S-24, S-29, issue 34: a fault shorter than the lease costs no charged attempt, no unknown outcome, no
    duplicate effect and no run."""
    assert report.completed == report.runs, report
    assert report.charged_attempts == 0, report
    assert report.unknown_outcomes == 0 and report.false_unknowns == 0, report
    assert report.duplicate_effects == 0 and report.effects_after_lost_lease == 0, report


async def run_or_skip(scenario: Awaitable[scenarios.FaultReport]) -> scenarios.FaultReport:
    try:
        return await scenario
    except FaultUnsupported as why:
        pytest.skip(str(why))


@pytest.fixture
async def empty_postgres(postgres_url: str) -> AsyncIterator[str]:
    """A scratch database of the shared server, dropped afterwards."""
    from bench import _store

    async with _store.scratch_postgres(postgres_url, prefix="candor_fault") as url:
        yield url


@pytest.mark.postgres
async def test_a_postgresql_restart_mid_run_costs_nothing() -> None:
    """§7.8.1, S-25: the private server restarts (about 0.5 s) while 4 runs are in flight; the processes reconnect
    and every run completes on its first attempt."""
    report = await run_or_skip(scenarios.pg_restart(runs=4))
    assert report.evidence["restart_seconds"] > 0
    assert_harmless(report)


@pytest.mark.postgres
async def test_connection_exhaustion_makes_work_wait_not_fail() -> None:
    """§7.8.1: every connection a private server (max_connections 30) still admits is held for 1.5 s while 6 runs
    churn overflow connections; the refused connects are waited out within database.timeout."""
    report = await run_or_skip(scenarios.connection_exhaustion(runs=6))
    assert report.evidence["refusals_logged"] >= 1  # the server did refuse connections
    assert_harmless(report)


@pytest.mark.postgres
async def test_a_black_holed_network_shorter_than_the_lease_costs_nothing(empty_postgres: str) -> None:
    """§7.8.1, S-26: the worker's connections to the database go through a proxy frozen for 3 s (statements and
    heartbeats hang, new connects hang) while 4 runs are in flight."""
    report = await run_or_skip(scenarios.blackhole(empty_postgres, runs=4))
    assert report.evidence["proxied_connections"] >= 1
    assert_harmless(report)


async def test_a_full_sqlite_filesystem_for_a_moment_costs_nothing() -> None:
    """§7.8.1, issue 34: the SQLite database's tmpfs is full for 1.5 s while 4 runs are in flight."""
    report = await run_or_skip(scenarios.sqlite_full(runs=4))
    assert_harmless(report)


@pytest.mark.postgres
async def test_a_worker_frozen_in_a_model_call_past_its_lease_runs_no_tool(empty_postgres: str) -> None:
    """S-24, S-38: the worker waiting on the model for a run is SIGSTOPped until the other worker completed the run;
    woken, its model answer asks for `charge`, which must not run. The run was charged the expired attempt."""
    report = await run_or_skip(scenarios.sigstop(empty_postgres))
    assert report.evidence["frozen_seconds"] > report.evidence["lease_seconds"]
    assert report.completed == report.runs == 1
    assert report.effects_after_lost_lease == 0 and report.duplicate_effects == 0, report
    assert report.false_unknowns == 0, report


@pytest.mark.postgres
async def test_a_worker_frozen_in_a_long_tool_past_its_lease_performs_no_effect(empty_postgres: str) -> None:
    """S-24, issue 34 item 3: the worker running a long `charge` (which asks `lease_held()` before its effect) is
    SIGSTOPped until the other worker completed the run; woken, it must not charge. The other attempt found the call
    interrupted and told its model the outcome is unknown, truly: the ledger holds no charge. Also S-25: the frozen
    worker's open transaction is ended by the server, so its lease expires on time."""
    report = await run_or_skip(scenarios.sigstop_in_tool(empty_postgres))
    assert report.evidence["frozen_seconds"] < 30  # recovered while the frozen process still held a transaction
    assert report.completed == report.runs == 1
    assert report.effects_after_lost_lease == 0 and report.duplicate_effects == 0, report
    assert report.false_unknowns == 0, report
