"""The systems of `bench.production_steps` and one measured round of each: start, warm up, measure, stop.

Not a benchmark itself (private module, skipped by `bench.run_all`). A round of a system starts from nothing: a new
scratch database (PostgreSQL on the server of `--postgres-url`, or a SQLite file), new processes, a short warm-up
(imports, first connections, compiled statements), then the measured window, then everything is stopped and the
database dropped. In-process systems run in bench/peers/step_server.py (`service_steps.PeerSystem`); the candor
service is a control process and worker processes (`candor serve`), runs posted over HTTP.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import json
import sqlite3
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import httpx

from candor.service import operator
from candor.service.store.schema.migration import migrate

from . import _service, _store
from ._server_cpu import ServerCpu, ServerCpuSampler, observer_connection
from ._step_clock import added_latency_ms
from .service_steps import Database, PeerSystem, Workload, cpu_ms

__all__ = ("SYSTEMS", "Load", "RoundResult", "measure_round")

SYSTEMS = (
    "pydantic-ai",
    "floor+postgresql",
    "langgraph-sync+postgresql",
    "langgraph-async+postgresql",
    "dbos+postgresql",
    "candor-service+postgresql",
    "candor-service+sqlite",
)
IN_CANDOR_VENV = ("pydantic-ai", "floor")
"""Step-server systems that import candor (or need nothing else): run by this venv's Python, not the peers'."""
POSTS_IN_FLIGHT = 32
"""`POST /v1/threads` requests the benchmark keeps open at once while it starts the runs."""
POLL_SECONDS = 0.05


@dataclass(frozen=True)
class Load:
    """The offered load: `runs` runs of `steps` steps, all in flight at once, on a model that thinks
    `model_seconds`; pools of `connections` per process; candor's `workers` processes of `slots` slots."""

    runs: int
    steps: int
    model_seconds: float
    connections: int
    workers: int
    slots: int

    @property
    def total_steps(self) -> int:
        return self.runs * self.steps

    def workload(self) -> Workload:
        return Workload("production", self.steps, self.runs, self.runs, self.model_seconds)

    def warm_up(self) -> Workload:
        count = min(self.runs, 4)
        return Workload("warm-up", min(self.steps, 2), count, count, self.model_seconds)


@dataclass
class RoundResult:
    """One system's measured window in one round."""

    seconds: float
    process_cpu_ms: dict[str, float]
    server: ServerCpu | None
    added_latency_ms: list[float]
    peak_rss_kib: dict[str, int]
    failed_runs: int = 0
    versions: dict[str, str] = field(default_factory=dict)
    round_seconds: float = 0.0
    """The whole round: database, start, warm-up, window, stop (what the system costs `make bench`)."""

    @property
    def cpu_ms_total(self) -> float:
        """Every process of the system plus the PostgreSQL server's CPU charged to it."""
        return sum(self.process_cpu_ms.values()) + (0.0 if self.server is None else self.server.total_ms)


def peak_rss_kib(pid: int) -> int:
    return _service.read_memory_kib(Path(f"/proc/{pid}/status").read_text())["VmHWM"]


class RunsWatch:
    """The benchmark's own view of candor's `runs` and `outbox` tables: on PostgreSQL an observer connection
    (never charged to the system, bench/_server_cpu.py), on SQLite a reader in this process (WAL: it never blocks
    the writers)."""

    def __init__(self, pg: asyncpg.Connection | None, lite: sqlite3.Connection | None) -> None:
        self._pg, self._lite = pg, lite

    @classmethod
    async def open(cls, database: Database) -> RunsWatch:
        if database.path is not None:
            return cls(None, sqlite3.connect(database.path, timeout=0.5, isolation_level=None))
        return cls(await observer_connection(database.url), None)

    def _lite_count(self, query: str, values: list[Any]) -> int | None:
        assert self._lite is not None
        try:
            return int(self._lite.execute(query, values).fetchone()[0])
        except sqlite3.OperationalError:  # database is locked: ask again
            return None

    async def runs_with(self, run_ids: list[str], statuses: tuple[str, ...]) -> int | None:
        """How many of `run_ids` have one of `statuses`; None while SQLite is busy."""
        if self._lite is not None:
            marks, states = ",".join("?" * len(run_ids)), ",".join("?" * len(statuses))
            query = f"SELECT count(*) FROM runs WHERE id IN ({marks}) AND status IN ({states})"
            return self._lite_count(query, [*run_ids, *statuses])
        assert self._pg is not None
        query = "SELECT count(*) FROM runs WHERE id = ANY($1::varchar[]) AND status = ANY($2::varchar[])"
        return int(await self._pg.fetchval(query, run_ids, list(statuses)))

    async def outbox_pending(self) -> int | None:
        """Outbox rows not yet handled; None while SQLite is busy."""
        query = "SELECT count(*) FROM outbox WHERE status = 'pending'"
        if self._lite is not None:
            return self._lite_count(query, [])
        assert self._pg is not None
        return int(await self._pg.fetchval(query))

    async def close(self) -> None:
        if self._pg is not None:
            await self._pg.close()
        if self._lite is not None:
            self._lite.close()


class CandorService:
    """A control process and `load.workers` worker processes on a fresh database; runs posted over HTTP."""

    def __init__(self, database: Database, load: Load, logs: Path) -> None:
        self.database, self.load, self.logs = database, load, logs
        self.step_log = logs / "steps.jsonl"
        self.counter = 0
        self.failed = 0

    async def start(self, stack: AsyncExitStack) -> None:
        env = _service.settings_environment(
            self.database.url,
            worker={"slots": self.load.slots},
            database={"pool_size": self.load.connections, "max_overflow": 0},
        )
        await migrate(self.database.url, lock_timeout=30)
        secret = (await operator.bootstrap(_service.bench_settings(env)))["secret"]
        roles = ["control", *(["worker"] * self.load.workers)]
        self.processes = [_service.ServiceProcess(role, env, self.logs).start() for role in roles]
        stack.push_async_callback(self._stop)
        await asyncio.gather(*(p.wait_ready() for p in self.processes))
        self.watch = await RunsWatch.open(self.database)
        stack.push_async_callback(self.watch.close)
        limits = httpx.Limits(max_connections=POSTS_IN_FLIGHT)
        headers = {"Authorization": f"Bearer {secret}"}
        self.client = httpx.AsyncClient(base_url=self.processes[0].base_url, timeout=60, headers=headers, limits=limits)
        stack.push_async_callback(self.client.aclose)

    async def _stop(self) -> None:
        await asyncio.gather(*(p.stop() for p in self.processes), return_exceptions=True)

    @property
    def pids(self) -> dict[str, int]:
        names = ["control", *(f"worker {n}" for n in range(1, self.load.workers + 1))]
        return {name: process.pid for name, process in zip(names, self.processes, strict=True)}

    @property
    def versions(self) -> dict[str, str]:
        return {"candor": importlib.metadata.version("candor")}

    async def _post(self, options: dict[str, Any]) -> str:
        """`POST /v1/threads`; a 503 (the database was busy) is retried with the same idempotency key."""
        self.counter += 1
        key = f"production-{self.counter}"
        body = {"agent": _service.AGENT, "input": _service.PROMPT, "options": options}
        for attempt in range(40):
            response = await self.client.post("/v1/threads", headers={"Idempotency-Key": key}, json=body)
            if response.status_code != 503:
                break
            await asyncio.sleep(0.05 * (attempt + 1))
        response.raise_for_status()
        return str(response.json()["run"]["id"])

    async def run(self, workload: Workload, *, timed: bool) -> tuple[float, list[float]]:
        """Post `workload.runs` runs at once and wait until all are sealed: (seconds, step intervals)."""
        options: dict[str, Any] = {"script": "loop", "steps": workload.steps, "model_seconds": workload.model_seconds}
        if timed:
            options["step_log"] = str(self.step_log)
        started = time.perf_counter()
        run_ids = list(await asyncio.gather(*(self._post(options) for _ in range(workload.runs))))
        deadline = time.monotonic() + 600
        while (await self.watch.runs_with(run_ids, _service.SEALED) or 0) < len(run_ids):
            if time.monotonic() > deadline:
                raise RuntimeError("runs not sealed after 600 s")
            await asyncio.sleep(POLL_SECONDS)
        seconds = time.perf_counter() - started
        while (failed := await self.watch.runs_with(run_ids, ("failed", "cancelled"))) is None:
            await asyncio.sleep(POLL_SECONDS)
        self.failed += failed if timed else 0
        return seconds, read_step_log(self.step_log) if timed else []

    async def settled(self) -> None:
        """The control process has handled the rows the seals staged (`checkpoint_cleanup`): the runs' work."""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if await self.watch.outbox_pending() == 0:
                return
            await asyncio.sleep(POLL_SECONDS)


def read_step_log(path: Path) -> list[float]:
    """The step intervals the workers' runs appended (bench/_agents.py, `step_log`)."""
    if not path.exists():
        return []
    return [interval for line in path.read_text().splitlines() if line for interval in json.loads(line)["intervals"]]


class StepServer:
    """An in-process system in its own step-server process (`service_steps.PeerSystem`), its limits lifted to the
    load: a thread per run in flight, pools of `load.connections`."""

    def __init__(self, name: str, database: Database | None, load: Load, logs: Path) -> None:
        base, _, _ = name.partition("+")
        system, _, durability = base.partition("-") if base.startswith("langgraph") else (base, "", "sync")
        python = Path(sys.executable) if system in IN_CANDOR_VENV else _store.peers_python()
        options: tuple[str, ...] = ("--threads", str(load.runs + 8), "--connections", str(load.connections))
        options = (*options, "--durability", durability or "sync")
        self.peer = PeerSystem(name, database, python, system, [load.warm_up(), load.workload()], logs, options)
        self.failed = 0

    async def start(self, stack: AsyncExitStack) -> None:
        stack.push_async_callback(self.peer.close)

    @property
    def pids(self) -> dict[str, int]:
        return dict(self.peer.pids)

    @property
    def versions(self) -> dict[str, str]:
        return dict(self.peer.versions)

    async def run(self, workload: Workload, *, timed: bool) -> tuple[float, list[float]]:
        seconds = await self.peer.run(workload)
        return seconds, list(self.peer.answer.get("intervals", []))

    async def settled(self) -> None:
        """Nothing is left behind: a step server answers once its runs are done."""


@asynccontextmanager
async def fresh_database(name: str, server_url: str, tmp: Path) -> AsyncIterator[Database | None]:
    kind = name.rpartition("+")[2] if "+" in name else None
    if kind == "sqlite":
        path = tmp / "candor.db"
        yield Database(kind, f"sqlite:///{path}", path=path)
    elif kind == "postgresql":
        async with _store.scratch_postgres(server_url, prefix="candor_bench_prod") as url:
            yield Database(kind, url, name=url.rsplit("/", 1)[1])
    else:
        yield None


async def measure_round(name: str, load: Load, server_url: str) -> RoundResult:
    """One round of system `name`: fresh database and processes, a warm-up, the measured window, all stopped."""
    async with AsyncExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="candor-bench-production-")))
        database = await stack.enter_async_context(fresh_database(name, server_url, tmp))
        if name.startswith("candor-service"):
            assert database is not None
            system: CandorService | StepServer = CandorService(database, load, tmp)
        else:
            system = StepServer(name, database, load, tmp)
        await system.start(stack)
        await system.run(load.warm_up(), timed=False)
        await system.settled()
        before = {role: cpu_ms(pid) for role, pid in system.pids.items()}
        sampler = None if database is None or database.name is None else ServerCpuSampler(server_url, database.name)
        async with sampler if sampler is not None else contextlib.nullcontext():
            seconds, intervals = await system.run(load.workload(), timed=True)
            await system.settled()
            used = {role: cpu_ms(pid) - before[role] for role, pid in system.pids.items()}
        return RoundResult(
            seconds=seconds,
            process_cpu_ms=used,
            server=None if sampler is None else sampler.result(),
            added_latency_ms=added_latency_ms(intervals, load.model_seconds),
            peak_rss_kib={role: peak_rss_kib(pid) for role, pid in system.pids.items()},
            failed_runs=system.failed,
            versions=system.versions,
        )
