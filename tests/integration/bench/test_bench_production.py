"""bench.production_steps' pure parts (issue 33 item 3): step latency from model request times, the PostgreSQL
server's CPU charged to one system, the summary and the verdicts; and the floor's shared pool under many runs in
flight. The whole benchmark runs with tiny sizes in tests/e2e/bench/test_bench_service_smoke.py."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from bench import _server_cpu, _step_clock
from bench._production_systems import Load, RoundResult
from bench._server_cpu import BACKGROUND, OBSERVER, OTHER, SYSTEM, ServerCpu
from bench.production_steps import reading, summarize_system, table, verdicts

from e2e.bench.test_bench_smoke import postgres_server

__all__ = ["postgres_server"]  # the fixture, imported for the floor's test

LOAD = Load(runs=2, steps=5, model_seconds=0.2, connections=4, workers=1, slots=2)


def test_step_intervals_are_the_gaps_between_consecutive_model_requests() -> None:
    """Issue 33: a step's latency runs from one model request of a run to its next; less the model's think time it
    is what the system added."""
    assert _step_clock.step_intervals([10.0, 10.25, 10.75]) == [0.25, 0.5]
    assert _step_clock.step_intervals([10.0]) == []
    assert _step_clock.added_latency_ms([0.25, 0.5], 0.2) == pytest.approx([50.0, 300.0])


def test_step_clock_keeps_runs_apart_and_reports_only_finished_runs() -> None:
    """Issue 33: runs interleave in one process; each is named by its own prompt, and a run that has not made its
    final request leaves no intervals yet."""
    clock = _step_clock.StepClock()
    clock.model_requested("a", final=False)
    clock.model_requested("b", final=False)
    clock.model_requested("a", final=False)
    clock.model_requested("a", final=True)
    first = clock.take()
    assert len(first) == 2 and all(gap >= 0 for gap in first)
    assert clock.take() == []  # taken once
    clock.model_requested("b", final=True)
    assert len(clock.take()) == 1


def test_step_clock_is_safe_across_threads() -> None:
    """LangGraph runs call the clock from their own threads."""
    clock = _step_clock.StepClock()

    def run(key: str) -> None:
        for n in range(11):
            clock.model_requested(key, final=n == 10)

    threads = [threading.Thread(target=run, args=(f"run-{n}",)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(clock.take()) == 8 * 10


def test_classify_charges_the_systems_database_and_never_the_observer() -> None:
    """Issue 33: the benchmark's own status poll is not the system's cost; other databases are someone else's."""
    assert _server_cpu.classify("db1", "", "db1") == SYSTEM
    assert _server_cpu.classify("db1", "asyncpg", "db1") == SYSTEM
    assert _server_cpu.classify("db2", "", "db1") == OTHER
    assert _server_cpu.classify(None, "", "db1") == BACKGROUND
    assert _server_cpu.classify("db1", OBSERVER, "db1") is None


def test_attribute_charges_backends_and_a_share_of_the_background() -> None:
    """Issue 33: the system's backends over the window, plus the background processes' CPU in proportion to its
    share of all client backends' CPU; a backend that started inside the window counts from zero."""
    classes = {1: SYSTEM, 2: SYSTEM, 3: OTHER, 4: BACKGROUND, 5: BACKGROUND}
    first = {1: 100.0, 3: 50.0, 4: 1000.0, 5: 10.0}
    last = {1: 130.0, 2: 30.0, 3: 70.0, 4: 1016.0, 5: 14.0}  # pid 2 connected inside the window
    charged = _server_cpu.attribute(first, last, classes)
    assert charged.backends_ms == 60.0 and charged.share == pytest.approx(0.75)
    assert charged.background_total_ms == 20.0 and charged.background_ms == pytest.approx(15.0)
    assert charged.total_ms == pytest.approx(75.0)


def test_attribute_on_a_server_nobody_else_uses_charges_all_background_and_nothing_when_idle() -> None:
    classes = {1: SYSTEM, 4: BACKGROUND}
    assert _server_cpu.attribute({1: 0.0, 4: 0.0}, {1: 10.0, 4: 5.0}, classes).total_ms == 15.0
    idle = _server_cpu.attribute({1: 10.0, 4: 0.0}, {1: 10.0, 4: 5.0}, classes)
    assert idle.share == 0.0 and idle.total_ms == 0.0


def test_parse_stat_reads_cpu_ticks_and_parent_even_with_spaces_in_the_name() -> None:
    fields = ["S", "77"] + ["0"] * 9 + ["120", "30"] + ["0"] * 30
    assert _server_cpu.parse_stat("4242 (postgres: a (b) c) " + " ".join(fields)) == (150, 77)


def _round(cpu: dict[str, float], server_ms: float | None, seconds: float = 2.0) -> RoundResult:
    server = None if server_ms is None else ServerCpu(server_ms, 0.0, 0.0, 1.0)
    return RoundResult(seconds, cpu, server, [10.0, 20.0, 30.0], {role: 102400 for role in cpu}, 0, {"x": "1"})


def _system(name: str, cpu_ms: float, server_ms: float | None) -> dict[str, Any]:
    return summarize_system(name, [_round({"process": cpu_ms}, server_ms)] * 2, LOAD)


def test_summary_adds_the_server_to_the_processes_per_step() -> None:
    """Issue 33: CPU per step is every process of the system plus the PostgreSQL server's share."""
    summary = summarize_system("candor-service+postgresql", [_round({"control": 2.0, "worker 1": 6.0}, 2.0)], LOAD)
    assert summary["cpu_ms_per_step"] == pytest.approx(1.0)  # (2 + 6 + 2) ms over 10 steps
    assert summary["server_cpu_ms_per_step"] == pytest.approx(0.2)
    assert summary["steps_per_cpu_s"] == pytest.approx(1000.0) and summary["steps_per_s"] == pytest.approx(5.0)
    assert summary["added_latency_ms_p50"] == 20.0 and summary["peak_rss_mib"] == {"control": 100, "worker 1": 100}
    bare = summarize_system("pydantic-ai", [_round({"process": 5.0}, None)], LOAD)
    assert bare["server_cpu_ms_per_step"] is None and bare["cpu_ms_per_step"] == pytest.approx(0.5)


def test_verdicts_are_issue_33s_targets_from_the_same_run() -> None:
    """Issue 33 item 4: candor on PostgreSQL >= 1.5x LangGraph sync in steps per CPU-second and <= 1.3x the floor's
    CPU per step, SQLite within 1.2x of PostgreSQL, the server <= 0.6 ms per step."""
    systems = {
        "candor-service+sqlite": _system("candor-service+sqlite", 50.0, None),  # 5.0 ms per step
        "floor+postgresql": _system("floor+postgresql", 30.0, 5.0),  # 3.5
        "langgraph-sync+postgresql": _system("langgraph-sync+postgresql", 60.0, 10.0),  # 7.0
    }
    met = verdicts({**systems, "candor-service+postgresql": _system("candor-service+postgresql", 40.0, 5.0)})  # 4.5
    assert [v["value"].split(" ")[0] for v in met] == ["1.56x", "1.29x", "1.11x", "0.50"]
    assert all(v["met"] for v in met)
    missed = verdicts({**systems, "candor-service+postgresql": _system("candor-service+postgresql", 40.0, 7.0)})
    assert [v["value"].split(" ")[0] for v in missed] == ["1.49x", "1.34x", "1.06x", "0.70"]
    assert [v["met"] for v in missed] == [False, False, True, False]
    assert verdicts({"floor+postgresql": systems["floor+postgresql"]}) == []  # no pair measured, no verdict


def test_table_and_reading_name_every_system_and_the_dbos_caveat() -> None:
    systems = [_system("pydantic-ai", 20.0, None), _system("floor+postgresql", 30.0, 5.0)]
    load = {**LOAD.__dict__, "model_ms": 200.0}
    summary = {"rounds": 2, "load": load, "systems": systems, "verdicts": [], "skipped": {"dbos+postgresql": "x"}}
    lines = table(summary)
    assert any(line.startswith("| floor+postgresql | ") and "PG 0.50" in line for line in lines)
    text = " ".join(reading(summary))
    assert "runs function tools inline" in text and "dbos+postgresql: not measured (x)" in text
    assert "to its processes stopped: pydantic-ai 0 s, floor+postgresql 0 s." in text


@pytest.mark.postgres
def test_floor_shares_one_pool_and_holds_a_connection_only_per_insert(postgres_server: str) -> None:
    """Issue 33: the floor's runs in flight outnumber its connections (a connection per INSERT, not per run), and
    runs that start together open one pool, not one each."""
    from bench import _store
    from bench._floor_commit import FloorSide
    from bench.peers.step_server import _pydantic_agent, _usage_limits

    async def scenario() -> tuple[int, int]:
        async with _store.scratch_postgres(postgres_server, prefix="candor_test_floor") as url:
            clock = _step_clock.StepClock()
            side = FloorSide(url, _pydantic_agent(3, 0.02, clock), _usage_limits(3), "p", connections=2)
            try:
                await asyncio.gather(*(side.run(collect=False, prompt=f"p {n}") for n in range(8)))
                assert side._pool is not None
                opened = side._pool.get_size()
            finally:
                await side.close()
            return opened, len(clock.take())

    opened, intervals = asyncio.run(scenario())
    assert opened <= 2 and intervals == 8 * 3
