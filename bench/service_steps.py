"""Durable step cost end to end: the candor service against the durable options a user would pick instead (issue 12).

Every system runs the same scripted loop (the model asks for one `step` tool call per response, a 200-byte result,
then answers), in one benchmark run, in interleaved rounds (each round runs every system once, in a rotated order,
so machine load hits all of them alike): `candor-service` on PostgreSQL and on SQLite (a real `candor serve --role
control` process and a separate `--role worker` process, `worker.slots` = 16; runs posted over HTTP to `POST
/v1/threads` on the control process, completion read from the database; `candor-service-normal+sqlite` is the same
on SQLite with `database.sqlite_synchronous = "normal"`, an operator's trade of durability on power failure for
speed, docs/operations.md; the targets are judged on the default, `full`), bare Pydantic AI `Agent.run` and candor
`Harness.run` without persistence, the floor of a durable step (`floor+postgresql`: the Harness with a bare INSERT
of the new messages at every boundary, waiting for each, bench/_floor_commit.py), LangGraph with `PostgresSaver` /
`SqliteSaver` (`durability="sync"`) and Pydantic AI's `DBOSAgent` (the run a DBOS workflow, each model request and
each tool call a DBOS step) on PostgreSQL / SQLite; each in-process system in its own process
(`bench/peers/step_server.py`; LangGraph and DBOS from the peers venv, `make bench-peers`). Workloads per round: one
run at a time of 5 and 80 steps (`--sequential-runs` runs each), and 16 concurrent runs of 20 steps whose model
sleeps 20 ms per response. Figures: steps/s (steps / wall time, median over rounds), CPU ms per step of every
process of the system (read from /proc: the worker and control processes for candor, the one process of a peer),
committed transactions per step (PostgreSQL: `pg_stat_database.xact_commit` of the system's own scratch database
over all rounds, read after its processes exited; read-only transactions that commit count too, rollbacks do not),
bytes stored per run (database size growth / runs), and for candor the time from a run's acceptance
(`runs.created_at`) to its first claim (`run_attempts.created_at`) over the sequential runs, where the worker is
idle and must be woken. Where the PostgreSQL server's CPU goes comes from one extra, untimed round of each
PostgreSQL system under `perf`, before the measured rounds (bench/_server_profile.py; skipped, and said so, where
perf cannot record). Ratios are taken per round and their median reported: the machine may be shared, absolute
figures move, same-round ratios are what count.

    python -m bench.service_steps [--rounds 3] [--sequential-steps 5,80] [--concurrent 16x20]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import sqlite3
import statistics
import subprocess
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
from sqlalchemy import func, select

from candor.service import operator
from candor.service.core import Service
from candor.service.errors import StoreUnavailable
from candor.service.store.db.engine import read_transaction
from candor.service.store.schema.migration import migrate
from candor.service.store.schema.tables import outbox, run_attempts, runs

from . import _cli, _service, _store
from . import _server_profile as server_profile

QUICK_ARGS = [
    "--rounds",
    "2",
    "--sequential-steps",
    "1,2",
    "--concurrent",
    "2x2",
    "--systems",
    "pydantic-ai,harness,floor+postgresql,candor-service+sqlite,candor-service-normal+sqlite,candor-service+postgresql",
    "--no-server-profile",
]
"""Arguments for a smoke run (`python -m bench.run_all --quick`, tests); the server profile's parsing has tests of
its own (tests/unit/bench/test_bench_server_profile.py)."""
STEP_SERVER = Path(__file__).resolve().parent / "peers" / "step_server.py"
SYSTEMS = (
    "pydantic-ai",
    "harness",
    "floor+postgresql",
    "candor-service+postgresql",
    "candor-service+sqlite",
    "candor-service-normal+sqlite",
    "langgraph+postgresql",
    "langgraph+sqlite",
    "dbos+postgresql",
    "dbos+sqlite",
)
BASELINE_SYSTEMS = ("candor-baseline+postgresql", "candor-baseline+sqlite")
NORMAL_SYNC = "candor-service-normal"
"""The prefix of the service system whose processes run SQLite at `database.sqlite_synchronous = "normal"`."""
MODEL_SECONDS_CONCURRENT = 0.02
WRITE_SLOPE_TOLERANCE = 0.05
"""Lease renewals (one write per `worker.authority_seconds`, 1 s, of a live attempt) land in the longer run of the
slope: an 80-step run lasts a second or two."""


def cpu_ms(pid: int, tid: int | None = None) -> float:
    """User + system CPU time of process `pid` (or of its thread `tid`) so far, in ms (from /proc)."""
    path = Path(f"/proc/{pid}/stat") if tid is None else Path(f"/proc/{pid}/task/{tid}/stat")
    fields = path.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1000 / os.sysconf("SC_CLK_TCK")


def postgres_server_cpu_ms() -> float:
    """User + system CPU time of the local PostgreSQL server so far, in ms: every live `postgres` process plus what
    the postmaster has reaped from exited ones (a backend's CPU moves there when its connection closes), so the
    difference over a window counts the server's work in it, whichever backend did it. 0 when no server process is
    visible (a remote server)."""
    total = 0.0
    ticks = os.sysconf("SC_CLK_TCK")
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:  # exited meanwhile
            continue
        if text[text.index("(") + 1 : text.rindex(")")] != "postgres":
            continue
        fields = text.rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
        if fields[1] == "1" or Path(f"/proc/{fields[1]}/comm").read_text().strip() != "postgres":
            total += int(fields[13]) + int(fields[14])  # the postmaster: its reaped children
    return total * 1000 / ticks


def off_loop_cpu_ms(pid: int) -> float:
    """CPU time of process `pid` outside its main thread (the event loop's), in ms: on SQLite the connection
    threads, where the database itself does its work (PostgreSQL does it in its own server process)."""
    return cpu_ms(pid) - cpu_ms(pid, pid)


@dataclass(frozen=True)
class Workload:
    name: str
    steps: int
    runs: int
    concurrency: int
    model_seconds: float

    @property
    def total_steps(self) -> int:
        return self.steps * self.runs


class StatusPoll:
    """How the benchmark learns that candor's runs are sealed: a query every 5 ms from outside the service (a peer
    reports completion in-process, at no cost). The poll is the benchmark's, not candor's, so it is as cheap as a
    query can be: one autocommit statement on asyncpg (PostgreSQL; no BEGIN and ROLLBACK round trips, and no
    transaction id: it writes nothing), a plain read on the stdlib driver (SQLite; WAL: a reader never blocks the
    worker's writes). `statements` counts the PostgreSQL ones: each is a commit in `xact_commit`, which the
    committed-transactions figure leaves out."""

    _QUERY = "SELECT count(*) FROM runs WHERE id = ANY($1::varchar[]) AND status = ANY($2::varchar[])"

    def __init__(self, pg: asyncpg.Connection | None, lite: sqlite3.Connection | None) -> None:
        self._pg, self._lite = pg, lite
        self.statements = 0

    @classmethod
    async def open(cls, database: Database) -> StatusPoll:
        if database.path is not None:
            # a short busy timeout: the read runs on the benchmark's event loop, and a busy file is polled again
            return cls(None, sqlite3.connect(database.path, timeout=0.5, isolation_level=None))
        return cls(await asyncpg.connect(_store.dsn(database.url)), None)

    async def sealed(self, run_ids: list[str]) -> int:
        """How many of `run_ids` are sealed (0 while SQLite is busy: poll again)."""
        if self._lite is not None:
            marks, states = ",".join("?" * len(run_ids)), ",".join("?" * len(_service.SEALED))
            query = f"SELECT count(*) FROM runs WHERE id IN ({marks}) AND status IN ({states})"
            try:
                return int(self._lite.execute(query, [*run_ids, *_service.SEALED]).fetchone()[0])
            except sqlite3.OperationalError:  # database is locked
                return 0
        assert self._pg is not None
        self.statements += 1
        return int(await self._pg.fetchval(self._QUERY, run_ids, list(_service.SEALED)))

    async def close(self) -> None:
        if self._pg is not None:
            await self._pg.close()
        if self._lite is not None:
            self._lite.close()


@dataclass
class Database:
    kind: str  # postgresql | sqlite
    url: str  # the URL the system is given
    name: str | None = None  # PostgreSQL database name
    path: Path | None = None  # SQLite file

    async def size(self, server_url: str) -> int:
        if self.path is not None:
            with contextlib.closing(sqlite3.connect(self.path, timeout=30)) as conn:
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # count pages in the file, not in the WAL
            return self.path.stat().st_size
        conn = await asyncpg.connect(_store.dsn(server_url))
        try:
            return int(await conn.fetchval("SELECT pg_database_size($1)", self.name))
        finally:
            await conn.close()

    async def next_xid(self, server_url: str) -> int | None:
        """The next transaction id PostgreSQL will assign (cluster-wide; reading it assigns none). Only a transaction
        that writes gets an id, so the difference over a window counts write transactions, whichever database."""
        if self.name is None:
            return None
        conn = await asyncpg.connect(_store.dsn(server_url))
        try:
            return int(await conn.fetchval("SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint"))
        finally:
            await conn.close()

    async def quiet_housekeeping(self) -> list[str]:
        """Autovacuum off on every table of this scratch database, then one `ANALYZE`: an autoanalyze takes a
        transaction id, and one landing in a workload's window would count as that system's write transactions.
        The same for every system, once its tables exist (after its warm-up). Returns the tables it could not
        alter (a lock it waited for more than 5 s)."""
        if self.name is None:
            return []
        conn = await asyncpg.connect(_store.dsn(self.url))
        skipped: list[str] = []
        try:
            await conn.execute("SET lock_timeout = '5s'")
            tables = await conn.fetch(
                "SELECT quote_ident(schemaname) || '.' || quote_ident(tablename) AS name FROM pg_tables "
                "WHERE schemaname NOT IN ('pg_catalog', 'information_schema')"
            )
            for table in tables:
                try:
                    options = "autovacuum_enabled = false, toast.autovacuum_enabled = false"
                    await conn.execute(f"ALTER TABLE {table['name']} SET ({options})")
                except asyncpg.LockNotAvailableError:
                    skipped.append(table["name"])
            await conn.execute("ANALYZE")
        finally:
            await conn.close()
        return skipped

    async def commits(self, server_url: str) -> int | None:
        if self.name is None:
            return None
        conn = await asyncpg.connect(_store.dsn(server_url))
        try:
            await conn.execute("SELECT pg_stat_clear_snapshot()")
            return int(await conn.fetchval("SELECT xact_commit FROM pg_stat_database WHERE datname = $1", self.name))
        finally:
            await conn.close()


@asynccontextmanager
async def scratch_database(kind: str, server_url: str, tmp: Path, label: str) -> AsyncIterator[Database]:
    if kind == "sqlite":
        path = tmp / f"{label}.db"
        yield Database(kind, f"sqlite:///{path}", path=path)
        return
    async with _store.scratch_postgres(server_url, prefix="candor_bench_steps") as url:
        yield Database(kind, url, name=url.rsplit("/", 1)[1])


@dataclass
class Measured:
    """One workload of one system in one round."""

    seconds: float
    cpu_ms: dict[str, float]
    write_xacts: int | None = None
    """Write transactions (transaction ids assigned) from the workload's start until the system had settled it."""
    off_loop_ms: dict[str, float] = field(default_factory=dict)
    """Of `cpu_ms`, what ran outside each process's main thread."""
    machine_busy: float = 0.0
    """The share of all CPUs of the machine that was busy during the workload (every process, the database too)."""
    server_ms: float | None = None
    """CPU of the PostgreSQL server during the workload (None on SQLite, whose work is in the system's process)."""


@dataclass
class System:
    name: str
    database: Database | None
    pids: dict[str, int] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)
    results: dict[str, list[Measured]] = field(default_factory=dict)
    commits_before: int | None = None
    polls_before: int = 0
    size_before: int = 0
    claim_ms: list[float] = field(default_factory=list)
    retried: int = 0
    runs_done: int = 0
    steps_done: int = 0

    async def run(self, workload: Workload) -> float:
        raise NotImplementedError

    async def settled(self) -> None:
        """Wait until the work a workload left behind (candor: the sealed runs' outbox rows) is done, untimed."""

    def poll_commits(self) -> int:
        """Commits the benchmark's own status poll made on this system's database so far (candor only)."""
        return 0

    async def measure(self, workload: Workload, server_url: str) -> None:
        xid_before = await self.database.next_xid(server_url) if self.database is not None else None
        before = {role: cpu_ms(pid) for role, pid in self.pids.items()}
        off_before = {role: off_loop_cpu_ms(pid) for role, pid in self.pids.items()}
        machine_before = _service.machine_cpu_times()
        server_before = postgres_server_cpu_ms() if xid_before is not None else None
        seconds = await self.run(workload)
        busy = _service.busy_fraction(machine_before, _service.machine_cpu_times())
        server = None if server_before is None else postgres_server_cpu_ms() - server_before
        used = {role: cpu_ms(pid) - before[role] for role, pid in self.pids.items()}
        off_loop = {role: off_loop_cpu_ms(pid) - off_before[role] for role, pid in self.pids.items()}
        written = None
        if xid_before is not None and self.database is not None:
            await self.settled()
            xid_after = await self.database.next_xid(server_url)
            written = None if xid_after is None else xid_after - xid_before
        self.results.setdefault(workload.name, []).append(Measured(seconds, used, written, off_loop, busy, server))
        self.runs_done += workload.runs
        self.steps_done += workload.total_steps


def shapes_argument(workloads: list[Workload]) -> str:
    """The step server's `--shapes`: DBOS registers its workflows before launch, so the server makes one agent per
    shape (steps, model seconds) it will be asked for."""
    return ",".join(sorted({f"{w.steps}:{w.model_seconds}" for w in workloads}))


def last_error_line(stderr: str) -> str:
    """The line of a traceback that names the exception (the last `SomeError: ...`), else the last line."""
    lines = [line.strip() for line in stderr.strip().splitlines() if line.strip()]
    named = [line for line in lines if re.match(r"^[\w.]*(Error|Exception)\b", line)]
    return (named or lines or ["(nothing on stderr)"])[-1][:300]


class PeerSystem(System):
    """A system inside one `step_server.py` process."""

    def __init__(
        self,
        name: str,
        database: Database | None,
        python: Path,
        system: str,
        workloads: list[Workload],
        logs: Path,
        options: tuple[str, ...] = (),
    ) -> None:
        """`options`: more of the step server's options (`--threads`, `--connections`, `--durability`)."""
        super().__init__(name, database)
        command = [str(python), str(STEP_SERVER), "--system", system, "--shapes", shapes_argument(workloads), *options]
        self.answer: dict[str, Any] = {}
        """The step server's answer to the last workload (its `intervals` too)."""
        if database is not None:
            command += ["--database-url", database.url]
        env = _service.process_environment({})
        self.log = logs / f"{name.replace('+', '_')}.stderr"
        with self.log.open("w") as stderr:
            self.process = subprocess.Popen(
                command,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
                env=env,
                cwd=STEP_SERVER.parent,
            )
        ready = self._read()
        self.versions = ready.get("versions", {})
        self.pids = {"process": self.process.pid}

    def _read(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        while True:
            line = self.process.stdout.readline()
            if not line:
                self.process.wait(10)
                raise RuntimeError(
                    f"{self.name}: step server exited (status {self.process.returncode}): "
                    f"{last_error_line(self.log.read_text(errors='replace'))}"
                )
            if line.startswith("{"):
                return dict(json.loads(line))

    async def run(self, workload: Workload) -> float:
        assert self.process.stdin is not None
        command = {
            "steps": workload.steps,
            "runs": workload.runs,
            "concurrency": workload.concurrency,
            "model_seconds": workload.model_seconds,
        }
        self.process.stdin.write(json.dumps(command) + "\n")
        self.process.stdin.flush()
        self.answer = await asyncio.to_thread(self._read)
        return float(self.answer["seconds"])

    async def close(self) -> None:
        if self.process.poll() is None:
            assert self.process.stdin is not None
            self.process.stdin.write('{"quit": true}\n')
            self.process.stdin.flush()
            try:
                await asyncio.to_thread(self.process.wait, 60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                await asyncio.to_thread(self.process.wait)


class ServiceSystem(System):
    """Real `candor serve` control and worker processes on one database; runs posted over HTTP."""

    def __init__(self, name: str, database: Database, stack: AsyncExitStack, log_dir: Path) -> None:
        super().__init__(name, database)
        self.stack, self.log_dir = stack, log_dir
        self.counter = 0
        self.source: Path | None = None
        """Another candor source tree the processes import instead of this one (`--baseline-src`)."""

    async def start(self) -> None:
        assert self.database is not None
        database: dict[str, Any] = {"sqlite_synchronous": "normal"} if self.name.startswith(NORMAL_SYNC) else {}
        env = _service.settings_environment(self.database.url, worker={"slots": 16}, database=database)
        settings = _service.bench_settings(env)
        await migrate(self.database.url, lock_timeout=30)
        self.secret = (await operator.bootstrap(settings))["secret"]
        self.service = await Service.open(settings)
        self.stack.push_async_callback(self.service.close)
        self.processes = [
            _service.ServiceProcess(role, env, self.log_dir, source=self.source).start()
            for role in ("control", "worker")
        ]
        self.stack.push_async_callback(self.stop)
        await asyncio.gather(*(p.wait_ready() for p in self.processes))
        self.pids = {p.role: p.pid for p in self.processes}
        self.poll = await StatusPoll.open(self.database)
        self.stack.push_async_callback(self.poll.close)
        self.client = httpx.AsyncClient(
            base_url=self.processes[0].base_url, timeout=60, headers={"Authorization": f"Bearer {self.secret}"}
        )
        self.stack.push_async_callback(self.client.aclose)

    async def stop(self) -> None:
        await asyncio.gather(*(p.stop() for p in self.processes), return_exceptions=True)

    async def _post(self, options: dict[str, Any]) -> str:
        """`POST /v1/threads`; a 503 (the database was busy, e.g. SQLite's writer lock under 16 posts at once) is
        retried with the same idempotency key, as a client would, and counted."""
        self.counter += 1
        key = f"steps-{self.counter}"
        for attempt in range(20):
            body = {"agent": _service.AGENT, "input": _service.PROMPT, "options": options}
            response = await self.client.post("/v1/threads", headers={"Idempotency-Key": key}, json=body)
            if response.status_code != 503:
                break
            self.retried += 1
            await asyncio.sleep(0.05 * (attempt + 1))
        response.raise_for_status()
        return str(response.json()["run"]["id"])

    def poll_commits(self) -> int:
        return self.poll.statements

    async def _wait(self, run_ids: list[str]) -> None:
        deadline = time.monotonic() + 600
        while await self.poll.sealed(run_ids) < len(run_ids):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name}: runs not sealed after 600 s")
            await asyncio.sleep(0.005)

    async def run(self, workload: Workload) -> float:
        options = {"script": "loop", "steps": workload.steps, "model_seconds": workload.model_seconds}
        started = time.perf_counter()
        if workload.concurrency == 1:
            run_ids = []
            for _ in range(workload.runs):
                run_ids.append(await self._post(options))
                await self._wait(run_ids[-1:])
            seconds = time.perf_counter() - started
            self.claim_ms += await self._claim_waits(run_ids)
            return seconds
        run_ids = list(await asyncio.gather(*(self._post(options) for _ in range(workload.runs))))
        await self._wait(run_ids)
        return time.perf_counter() - started

    async def settled(self) -> None:
        """The control process has handled the outbox rows the seals staged (`checkpoint_cleanup`): their write
        transactions belong to this workload (no webhook subscriptions here, so no other rows)."""
        deadline = time.monotonic() + 30
        query = select(func.count()).select_from(outbox).where(outbox.c.status == "pending")
        while time.monotonic() < deadline:
            with contextlib.suppress(StoreUnavailable):
                async with read_transaction(self.service.engine) as conn:
                    if not (await conn.execute(query)).scalar_one():
                        return
            await asyncio.sleep(0.01)
        raise RuntimeError(f"{self.name}: outbox rows still pending after 30 s")

    async def _claim_waits(self, run_ids: list[str]) -> list[float]:
        query = (
            select(runs.c.created_at, run_attempts.c.created_at.label("claimed_at"))
            .join(run_attempts, (run_attempts.c.run_id == runs.c.id) & (run_attempts.c.number == 1))
            .where(runs.c.id.in_(run_ids))
        )
        async with read_transaction(self.service.engine) as conn:
            rows = (await conn.execute(query)).all()
        return [(float(r.claimed_at) - float(r.created_at)) * 1000 for r in rows]

    async def close(self) -> None:
        await self.stop()


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def summarize(systems: list[System], workloads: list[Workload], rounds: int) -> dict[str, Any]:
    results = []
    for system in systems:
        for workload in workloads:
            measured = system.results.get(workload.name, [])
            if not measured:
                continue
            per_step = {
                role: _median([m.cpu_ms[role] / workload.total_steps for m in measured]) for role in system.pids
            }
            written = [m.write_xacts for m in measured if m.write_xacts is not None]
            served = [m.server_ms for m in measured if m.server_ms is not None]
            off_loop = {
                role: _median([m.off_loop_ms.get(role, 0.0) / workload.total_steps for m in measured])
                for role in system.pids
            }
            results.append(
                {
                    "system": system.name,
                    "workload": workload.name,
                    "steps_per_s": _median([workload.total_steps / m.seconds for m in measured]),
                    "steps_per_s_by_round": [workload.total_steps / m.seconds for m in measured],
                    "cpu_ms_per_step": per_step,
                    "cpu_ms_per_step_total": sum(per_step.values()),
                    "cpu_ms_per_step_off_loop": off_loop,
                    "machine_busy": _median([m.machine_busy for m in measured]),
                    "server_cpu_ms_per_step": _median([s / workload.total_steps for s in served]) if served else None,
                    "write_xacts_per_step": _median([w / workload.total_steps for w in written]) if written else None,
                    "write_xacts_per_run": _median([w / workload.runs for w in written]) if written else None,
                }
            )
    storage = [
        {
            "system": s.name,
            "commits_per_step": s.__dict__.get("commits_per_step"),
            **write_cost(results, s.name, workloads),
            "bytes_per_run": s.__dict__.get("bytes_per_run"),
            "claim_ms_p50": _store.percentile(s.claim_ms, 0.5) if s.claim_ms else None,
            "claim_ms_p99": _store.percentile(s.claim_ms, 0.99) if s.claim_ms else None,
            "claims": len(s.claim_ms),
            "posts_retried_after_503": s.retried,
            "versions": s.versions,
        }
        for s in systems
    ]
    return {
        "bench": "service_steps",
        "rounds": rounds,
        "workloads": [w.__dict__ for w in workloads],
        "results": results,
        "systems": storage,
    }


def write_cost(results: list[dict[str, Any]], system: str, workloads: list[Workload]) -> dict[str, float | None]:
    """Write transactions per run of the shortest and the longest sequential workload give the cost of one more
    step (the slope) and what a run costs whatever its length (the intercept: acceptance, claim, attempt start,
    seal, cleanup)."""
    sequential = sorted((w for w in workloads if w.concurrency == 1), key=lambda w: w.steps)
    found = {r["workload"]: r for r in results if r["system"] == system}
    if len(sequential) < 2:
        return {"write_xacts_per_added_step": None, "write_xacts_per_run_fixed": None}
    short, long = (found.get(w.name) for w in (sequential[0], sequential[-1]))
    if not short or not long or short["write_xacts_per_run"] is None or long["write_xacts_per_run"] is None:
        return {"write_xacts_per_added_step": None, "write_xacts_per_run_fixed": None}
    slope = (long["write_xacts_per_run"] - short["write_xacts_per_run"]) / (sequential[-1].steps - sequential[0].steps)
    return {
        "write_xacts_per_added_step": slope,
        "write_xacts_per_run_fixed": short["write_xacts_per_run"] - slope * sequential[0].steps,
    }


def _find(summary: dict[str, Any], system: str, workload: str) -> dict[str, Any] | None:
    return next((r for r in summary["results"] if r["system"] == system and r["workload"] == workload), None)


def _round_ratio(a: dict[str, Any], b: dict[str, Any]) -> float:
    ratios = zip(a["steps_per_s_by_round"], b["steps_per_s_by_round"], strict=False)
    return float(statistics.median(x / y for x, y in ratios))


def verdicts(summary: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    longest, concurrent = judged([Workload(**w) for w in summary["workloads"]])
    for db in ("postgresql", "sqlite"):
        candor = f"candor-service+{db}"
        if longest is not None:
            mine, bare = _find(summary, candor, longest.name), _find(summary, "pydantic-ai", longest.name)
            base = bare["cpu_ms_per_step"]["process"] if bare else 0.0
            if mine and base > 0:  # a tiny run (--quick) can fit inside one 10 ms tick of the CPU clock
                worker = mine["cpu_ms_per_step"]["worker"]
                out.append(
                    {
                        "target": f"{candor}: worker CPU per step <= 2x bare Pydantic AI ({longest.name})",
                        "value": f"{worker / base:.2f}x ({worker:.2f} vs {base:.2f} ms)",
                        "met": worker <= 2 * base,
                    }
                )
            for peer, factor in ((f"langgraph+{db}", 1.0), (f"dbos+{db}", 2.0)):
                theirs = _find(summary, peer, longest.name)
                if mine and theirs:
                    ratio = _round_ratio(mine, theirs)
                    out.append(
                        {
                            "target": f"{candor}: sequential steps/s >= {factor:g}x {peer} ({longest.name})",
                            "value": f"{ratio:.2f}x (median of per-round ratios)",
                            "met": ratio >= factor,
                        }
                    )
        if concurrent is not None:
            mine, bare = _find(summary, candor, concurrent.name), _find(summary, "pydantic-ai", concurrent.name)
            if mine and bare:
                ratio = _round_ratio(mine, bare)
                out.append(
                    {
                        "target": f"{candor}: concurrent steps/s >= 0.8x bare Pydantic AI ({concurrent.name})",
                        "value": f"{ratio:.2f}x (median of per-round ratios)",
                        "met": ratio >= 0.8,
                    }
                )
        info = next((s for s in summary["systems"] if s["system"] == candor), None)
        if info and info["claim_ms_p99"] is not None:
            out.append(
                {
                    "target": f"{candor}: created -> first claim p99 <= 50 ms (separate worker process)",
                    "value": f"{info['claim_ms_p99']:.1f} ms over {info['claims']} runs",
                    "met": info["claim_ms_p99"] <= 50,
                }
            )
        if info and info["write_xacts_per_added_step"] is not None:
            added = info["write_xacts_per_added_step"]
            out.append(
                {
                    "target": f"{candor}: write transactions per step (one more step of a sequential run) <= 2",
                    "value": f"{added:.2f} (plus {info['write_xacts_per_run_fixed']:.1f} per run)",
                    "met": added <= 2.0 + WRITE_SLOPE_TOLERANCE,
                }
            )
    return out


def warm_up_workload(args: argparse.Namespace) -> Workload:
    """Imports, compiled statements and first connections, before anything is measured."""
    return Workload("warm-up", min(5, args.sequential_steps[0]), 2, 1, 0.0)


async def measure(args: argparse.Namespace, console_lines: list[str]) -> dict[str, Any]:
    workloads = [Workload(f"sequential {n} steps", n, args.sequential_runs, 1, 0.0) for n in args.sequential_steps]
    count, steps = args.concurrent
    workloads.append(
        Workload(f"{count} concurrent x {steps} steps, 20 ms model", steps, count, count, MODEL_SECONDS_CONCURRENT)
    )
    skipped: dict[str, str] = {}
    peers = _store.peers_python()
    pg_problem = await _service.postgres_or_skip(args.postgres_url)
    systems: list[System] = []
    profiles: list[dict[str, Any]] = []
    async with AsyncExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="candor-bench-steps-")))
        profile_dir, why_not = server_profile.recordings_dir(args.server_profile, args.no_server_profile, tmp)
        if why_not is not None:
            skipped["server profile"] = why_not
        for name in args.systems:
            kind = name.rpartition("+")[2] if "+" in name else None
            if kind == "postgresql" and pg_problem:
                skipped[name] = pg_problem
                continue
            if name.startswith(("langgraph", "dbos")) and not peers.exists():
                skipped[name] = f"peers venv missing ({peers}): run `make bench-peers`"
                continue
            database = None
            if kind is not None:
                database = await stack.enter_async_context(
                    scratch_database(kind, args.postgres_url, tmp, name.replace("+", "_"))
                )
            try:
                if name.startswith(("candor-service", "candor-baseline")):
                    assert database is not None
                    service_system = ServiceSystem(name, database, stack, tmp)
                    if name.startswith("candor-baseline"):
                        service_system.source = args.baseline_src
                    await service_system.start()
                    system: System = service_system
                else:
                    in_candor_venv = name in ("pydantic-ai", "harness", "floor+postgresql")
                    python = Path(sys.executable) if in_candor_venv else peers
                    shapes = [warm_up_workload(args), *workloads]
                    system = PeerSystem(name, database, python, name.partition("+")[0], shapes, tmp)
                    stack.push_async_callback(system.close)
            except Exception as exc:  # noqa: BLE001 - a system that cannot start is reported, the rest still run
                skipped[name] = f"could not start: {type(exc).__name__}: {str(exc)[:300]}"
                continue
            # Warm-up (imports, compiled statements, first connections), not measured.
            await system.run(warm_up_workload(args))
            await system.settled()
            if database is not None and (busy := await database.quiet_housekeeping()):
                console_lines.append(f"  {name}: autovacuum left on for {', '.join(busy)} (a lock was held)")
            if profile_dir is not None and database is not None and database.name is not None:
                profiles += await server_profile.profile_workloads(
                    system, judged_workloads(workloads), profile_dir, postgres_server_cpu_ms
                )
            system.claim_ms.clear()
            if database is not None:
                system.commits_before = await database.commits(args.postgres_url)
                system.polls_before = system.poll_commits()
                system.size_before = await database.size(args.postgres_url)
            systems.append(system)
        for round_number in range(args.rounds):
            order = systems[round_number % len(systems) :] + systems[: round_number % len(systems)] if systems else []
            for system in order:
                for workload in workloads:
                    await system.measure(workload, args.postgres_url)
            console_lines.append(f"  round {round_number + 1}/{args.rounds} done")
        for system in systems:
            await system.close()  # type: ignore[attr-defined]
        await asyncio.sleep(1.5)  # exited backends have flushed their statistics
        for system in systems:
            if system.database is not None:
                grown = await system.database.size(args.postgres_url) - system.size_before
                system.bytes_per_run = grown / max(1, system.runs_done)  # type: ignore[attr-defined]
                after = await system.database.commits(args.postgres_url)
                if after is not None and system.commits_before is not None:
                    own = after - system.commits_before - (system.poll_commits() - system.polls_before)
                    system.commits_per_step = own / max(1, system.steps_done)  # type: ignore[attr-defined]
    summary = summarize(systems, workloads, args.rounds)
    summary["skipped"] = skipped
    summary["server_profiles"] = profiles
    summary["verdicts"] = verdicts(summary)
    return summary


def table(summary: dict[str, Any]) -> list[str]:
    lines = [
        "| System | Workload | Steps/s (median) | CPU ms per step | Processes | PostgreSQL server CPU ms per step "
        "| Machine busy | Write transactions per step |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in summary["results"]:
        off_loop = r.get("cpu_ms_per_step_off_loop", {})
        roles = ", ".join(
            f"{role} {ms:.2f}" + (f" ({off_loop[role]:.2f} off-loop)" if off_loop.get(role, 0.0) >= 0.05 else "")
            for role, ms in r["cpu_ms_per_step"].items()
        )
        written = "-" if r.get("write_xacts_per_step") is None else f"{r['write_xacts_per_step']:.2f}"
        server = "-" if r.get("server_cpu_ms_per_step") is None else f"{r['server_cpu_ms_per_step']:.2f}"
        lines.append(
            f"| {r['system']} | {r['workload']} | {r['steps_per_s']:.1f} | {r['cpu_ms_per_step_total']:.2f} | {roles} "
            f"| {server} | {100 * r.get('machine_busy', 0.0):.0f}% | {written} |"
        )
    lines += [
        "",
        "| System | Write transactions per added step | per run | Committed transactions per step "
        "| Bytes stored per run "
        "| Created -> claim p50 ms | p99 ms |",
        "|---|---|---|---|---|---|---|",
    ]

    def cell(value: float | None, digits: int) -> str:
        return "-" if value is None else f"{value:.{digits}f}"

    for s in summary["systems"]:
        lines.append(
            f"| {s['system']} | {cell(s.get('write_xacts_per_added_step'), 2)} "
            f"| {cell(s.get('write_xacts_per_run_fixed'), 1)} | {cell(s['commits_per_step'], 2)} "
            f"| {cell(s['bytes_per_run'], 0)} | {cell(s['claim_ms_p50'], 1)} | {cell(s['claim_ms_p99'], 1)} |"
        )
    return lines + server_profile.profile_table(summary.get("server_profiles", []))


def _normal_sync_lines(summary: dict[str, Any]) -> list[str]:
    """What `database.sqlite_synchronous = "normal"` changed against the default, per workload, from this run."""
    out = []
    for workload in summary["workloads"]:
        full = _find(summary, "candor-service+sqlite", workload["name"])
        normal = _find(summary, f"{NORMAL_SYNC}+sqlite", workload["name"])
        if full and normal:
            out.append(
                f"{NORMAL_SYNC}+sqlite ({workload['name']}): {normal['steps_per_s']:.1f} against "
                f"{full['steps_per_s']:.1f} steps/s at the default `full` ({_round_ratio(normal, full):.2f}x, median "
                f"of per-round ratios), worker CPU {normal['cpu_ms_per_step']['worker']:.2f} against "
                f"{full['cpu_ms_per_step']['worker']:.2f} ms per step."
            )
    if out:
        out.append(
            "`normal` waits for no disk flush at a commit, and the last commits before a power failure may be lost "
            "(docs/operations.md): the targets are judged on the default, `full`."
        )
    return out


def _floor_lines(summary: dict[str, Any]) -> list[str]:
    """The floor (bench/_floor_commit.py) against LangGraph and candor on PostgreSQL, per judged workload."""
    out = []
    for workload in judged_workloads([Workload(**w) for w in summary["workloads"]]):
        floor = _find(summary, "floor+postgresql", workload.name)
        if floor is None:
            continue
        compared = []
        for system, label in (("langgraph+postgresql", "LangGraph + PostgresSaver"), ("dbos+postgresql", "DBOS")):
            if (peer := _find(summary, system, workload.name)) is not None:
                compared.append(f"{_round_ratio(floor, peer):.2f}x {label}")
        candor = _find(summary, "candor-service+postgresql", workload.name)
        mine = f"; candor made {_round_ratio(candor, floor):.2f}x the floor's steps/s" if candor else ""
        out.append(
            f"floor+postgresql ({workload.name}): the Harness with a bare INSERT of the new messages at every "
            f"boundary, waiting for each (bench/_floor_commit.py), made {floor['steps_per_s']:.1f} steps/s"
            f"{': ' + ' and '.join(compared) if compared else ''} (medians of per-round ratios){mine}. No durable "
            "design on Pydantic AI that writes at each boundary and waits for the write goes much faster here; what "
            "separates candor from it is what its commit does beyond a write (fence, compare-and-swap, checkpoint, "
            "message, usage and stream rows, the schema's checks) and the service around the run (claim, attempt, "
            "seal, the separate worker process)."
        )
    return out


def reading(summary: dict[str, Any]) -> list[str]:
    out = [
        f"{summary['rounds']} interleaved rounds; steps/s and CPU are medians over rounds, ratios are medians of "
        "per-round ratios (the machine is shared with other work: compare systems within this run, not across runs).",
        "CPU ms per step counts every process of a system: for the candor service the worker and the control "
        "process (which also answers the HTTP posts and runs its sweeps); for a peer, its one process. The "
        "benchmark's own process (posting runs, polling the database) is not counted; the PostgreSQL server's CPU "
        "has its own column: every `postgres` process plus the exited backends the postmaster has reaped, from /proc "
        "(for candor it includes the benchmark's status poll: one autocommit statement every 5 ms, `StatusPoll`). "
        "In brackets, the part of a process's CPU outside its main (event loop) thread: for the candor SQLite "
        "worker, the connection threads where SQLite itself executes the statements; PostgreSQL does that work in "
        "its own server processes (the server column). Machine busy: the share of both CPUs busy during the "
        "workload, whatever ran (the database server and the benchmark's own process included): near 100% the "
        "system is bound by CPU, well below it by waits (commits, the model's sleep).",
        "Write transactions (PostgreSQL): transaction ids the server assigned from a workload's start until the "
        "system had settled it (for candor: the control process has handled the sealed runs' `checkpoint_cleanup` "
        "rows); only a transaction that writes gets one, and the systems run one at a time, so the count is the "
        "system's own on a server nothing else writes to (the counter is cluster-wide) (autovacuum is off on "
        "every system's scratch tables after its warm-up, which ends with one "
        "`ANALYZE`: an autoanalyze takes a transaction id too). Per added step: the slope between the shortest and "
        "the longest sequential run (what one more "
        "step of a run costs); per run: what a run costs whatever its length (for candor the acceptance, claim, "
        "attempt start, seal and cleanup). SQLite has no such counter; the worker tests count the write "
        "transactions per step there (`tests/integration/worker/test_stream_writes.py`).",
        "Committed transactions per step include every commit on the system's scratch database over all rounds, "
        "read-only ones included (an autocommit API-key lookup, LangGraph's autocommit reads): `pg_stat_database."
        "xact_commit`, less the benchmark's own status polls on candor's database.",
        "Bytes stored per run: growth of the database (PostgreSQL `pg_database_size`, the SQLite file after a WAL "
        "checkpoint) over all "
        "measured runs, divided by the runs; it includes indexes and free space in pages, so it is an upper bound.",
    ]
    out.extend(_normal_sync_lines(summary))
    out.extend(_floor_lines(summary))
    out.extend(server_profile.profile_lines(summary.get("server_profiles", []), "candor-service+postgresql"))
    if any("worker CPU per step" in v["target"] and not v["met"] for v in summary["verdicts"]):
        out.append(
            "Worker CPU per step against bare Pydantic AI compares a process that waits for its database at both "
            "commits of every step with one that never waits: `step_instructions` counts the instructions of both "
            "(no machine noise in them) and measures what a wait costs bare Pydantic AI's own CPU per step on this "
            "machine."
        )
    out.extend(_cli.missed_lines(summary, why="; see docs/performance.md for where the time goes and the floor"))
    return out


def judged(workloads: list[Workload]) -> tuple[Workload | None, Workload | None]:
    """The workloads the steps/s targets judge: the longest sequential one and the concurrent one."""
    longest = max((w for w in workloads if w.concurrency == 1), key=lambda w: w.steps, default=None)
    return longest, next((w for w in workloads if w.concurrency > 1), None)


def judged_workloads(workloads: list[Workload]) -> list[Workload]:
    return [w for w in judged(workloads) if w is not None]


def report(summary: dict[str, Any]) -> str:
    lines = ["service_steps: " + ", ".join(w["name"] for w in summary["workloads"]), *table(summary)]
    lines += _cli.target_lines(summary)
    return "\n".join(lines)


def _concurrent(text: str) -> tuple[int, int]:
    try:
        count, steps = (int(part) for part in text.lower().split("x"))
    except ValueError as exc:
        raise argparse.ArgumentTypeError("RUNSxSTEPS, e.g. 16x20") from exc
    if count < 1 or steps < 1:
        raise argparse.ArgumentTypeError("RUNSxSTEPS, both >= 1")
    return count, steps


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.service_steps", description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds (default: 2)")
    parser.add_argument(
        "--sequential-steps",
        type=_cli.positive_ints,
        default=[5, 80],
        # the shortest and the longest give the cost of one more step; the targets judge the longest
        help="steps per run of the sequential workloads (default: 5,80)",
    )
    parser.add_argument("--sequential-runs", type=int, default=1, help="runs per sequential workload (default: 1)")
    parser.add_argument("--concurrent", type=_concurrent, default=(16, 20), help="RUNSxSTEPS (default: 16x20)")
    parser.add_argument(
        "--systems",
        type=lambda t: [s for s in t.split(",") if s],
        default=list(SYSTEMS),
        help=f"comma-separated subset of {','.join(SYSTEMS)}",
    )
    _cli.add_baseline_src(
        parser, "adds the systems candor-baseline+postgresql/sqlite, the service processes importing that code instead"
    )
    parser.add_argument(
        "--server-profile",
        type=Path,
        metavar="DIR",
        help="keep perf's recordings of the server profile in DIR (default: a temporary directory)",
    )
    parser.add_argument(
        "--no-server-profile",
        action="store_true",
        help="skip the untimed extra round under perf that reports where the PostgreSQL server's CPU goes",
    )
    _cli.add_postgres_url(parser)
    _cli.add_json(parser)
    args = parser.parse_args(argv)
    if args.baseline_src is not None:
        args.systems += [name for name in BASELINE_SYSTEMS if name not in args.systems]
    known = SYSTEMS + (BASELINE_SYSTEMS if args.baseline_src is not None else ())
    unknown = sorted(set(args.systems) - set(known))
    if unknown or args.rounds < 1 or args.sequential_runs < 1:
        parser.error(f"unknown systems {unknown}" if unknown else "--rounds and --sequential-runs must be >= 1")
    progress: list[str] = []
    summary = asyncio.run(measure(args, progress))
    for line in progress:
        print(line, file=sys.stderr)
    return _cli.emit(summary, report, args.json)


if __name__ == "__main__":
    sys.exit(main())
