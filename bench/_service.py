"""Shared pieces of the service benchmarks: a scratch service database, real `candor serve` processes, submissions.

Not a benchmark itself (private module, skipped by `bench.run_all`). `service_database()` creates a new
PostgreSQL database (`_store.scratch_postgres`, dropped with `WITH (FORCE)` afterwards), migrates it, bootstraps
the first workspace and opens an in-process `Service` on it for submitting runs and reading rows. `ServiceProcess`
runs `python -m candor.cli serve --role ROLE` with settings passed as `CANDOR_<SECTION>__<FIELD>` variables
(§3.1), waits for `/readyz`, and can pause (SIGSTOP), resume (SIGCONT), drain (SIGTERM) or kill (SIGKILL) it and
read its memory from `/proc/<pid>/status`. Every process is stopped when the context that started it ends.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import func, select

from candor.service import commands, operator
from candor.service.core import Service
from candor.service.settings import ServiceSettings, SettingsError
from candor.service.store.schema.migration import migrate
from candor.service.store.schema.tables import runs

from . import _agents, _store

REPO_ROOT = Path(__file__).resolve().parent.parent
AGENT = "bench"
"""The one agent name the service benchmarks configure (`bench._agents:factory`)."""
PROMPT = {"content": [{"type": "text", "text": "Run the loop."}]}
SEALED = ("completed", "waiting", "failed", "cancelled")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def settings_environment(database_url: str, **sections: Mapping[str, Any]) -> dict[str, str]:
    """`CANDOR_<SECTION>__<FIELD>` variables for `database_url`, the bench agent and `sections` (e.g.
    `worker={"lease_seconds": 3}`, `outbox={"by_kind": {"webhook": {"batch": 64}}}`): nested mappings become
    deeper `__` paths, lists JSON, booleans `true`/`false`, everything else its `str()`."""
    env = {"CANDOR_DATABASE__URL": database_url, "CANDOR_AGENTS__BENCH__FACTORY": _agents.FACTORY}

    def add(path: str, value: Any) -> None:
        if isinstance(value, Mapping):
            for name, inner in value.items():
                add(f"{path}__{name.upper()}", inner)
        elif isinstance(value, (list, tuple)):
            env[path] = json.dumps(list(value))
        elif isinstance(value, bool):
            env[path] = str(value).lower()
        else:
            env[path] = str(value)

    for section, values in sections.items():
        add(f"CANDOR_{section.upper()}", values)
    return env


def process_environment(settings_env: Mapping[str, str], source: Path | None = None) -> dict[str, str]:
    """This process's environment minus every `CANDOR_` variable (a stray one would be refused, S-124), plus
    `settings_env` and the repository root on `PYTHONPATH` (the agent factory lives in `bench/`); with `source`
    (another candor `src` directory, `--baseline-src`) also that directory, ahead of the installed candor."""
    env = {key: value for key, value in os.environ.items() if not key.upper().startswith("CANDOR_")}
    env.update(settings_env)
    paths = [str(REPO_ROOT), None if source is None else str(source), os.environ.get("PYTHONPATH")]
    env["PYTHONPATH"] = os.pathsep.join(filter(None, paths))
    return env


@dataclass
class ServiceProcess:
    """One real `candor serve --role ROLE` process; its stderr goes to a log file shown when it fails."""

    role: str
    settings_env: Mapping[str, str]
    log_dir: Path
    port: int = field(default_factory=free_port)
    popen: subprocess.Popen[bytes] | None = None
    source: Path | None = None
    """Another candor `src` directory the process imports instead of this checkout's (`--baseline-src`)."""
    wrapper: tuple[str, ...] = ()
    """A command the process runs under (e.g. valgrind's, `bench.step_instructions`)."""

    @property
    def pid(self) -> int:
        assert self.popen is not None, "not started"
        return self.popen.pid

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.log_dir / f"{self.role}-{self.port}.log"

    def start(self) -> ServiceProcess:
        env = process_environment({**self.settings_env, "CANDOR_SERVER__LISTEN": f"127.0.0.1:{self.port}"}, self.source)
        with open(self.log_path, "wb") as log:
            self.popen = subprocess.Popen(
                [*self.wrapper, sys.executable, "-m", "candor.cli", "serve", "--role", self.role],
                cwd=REPO_ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        return self

    async def wait_ready(self, timeout: float = 60.0) -> None:
        """Until `/readyz` answers 200; raises with the log's tail if the process exits or `timeout` passes."""
        deadline = time.monotonic() + timeout
        port_retries = 3
        async with httpx.AsyncClient(timeout=2.0) as client:
            while time.monotonic() < deadline:
                if self.popen is None or self.popen.poll() is not None:
                    if port_retries and "address already in use" in self.log_tail().lower():
                        # Another process took the port between `free_port()` and the bind: take another one.
                        port_retries -= 1
                        self.port = free_port()
                        self.start()
                        continue
                    raise RuntimeError(f"{self.role} process exited before it was ready:\n{self.log_tail()}")
                try:
                    if (await client.get(self.base_url + "/readyz")).status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                await asyncio.sleep(0.05)
        raise RuntimeError(f"{self.role} process not ready after {timeout:.0f} s:\n{self.log_tail()}")

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def signal(self, signum: int) -> None:
        if self.alive():
            os.kill(self.pid, signum)

    def pause(self) -> None:
        self.signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.signal(signal.SIGCONT)

    async def wait_exit(self, timeout: float) -> int | None:
        """The exit status, or None if it is still running after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while self.popen is not None and self.popen.poll() is None and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        return None if self.popen is None else self.popen.poll()

    async def stop(self, timeout: float = 20.0) -> None:
        """SIGCONT (in case it is paused) and SIGTERM (a graceful drain), then SIGKILL after `timeout`."""
        if not self.alive():
            return
        self.resume()
        self.signal(signal.SIGTERM)
        if await self.wait_exit(timeout) is None:
            self.signal(signal.SIGKILL)
            await self.wait_exit(5.0)

    def memory_kib(self) -> dict[str, int]:
        """`VmHWM` (peak resident set) and `VmRSS` (resident set now) from `/proc/<pid>/status`, in KiB."""
        return read_memory_kib(Path(f"/proc/{self.pid}/status").read_text())


def read_memory_kib(status: str) -> dict[str, int]:
    """`{"VmHWM": kib, "VmRSS": kib}` parsed from the text of a `/proc/<pid>/status` file."""
    found: dict[str, int] = {}
    for line in status.splitlines():
        name, _, value = line.partition(":")
        if name in ("VmHWM", "VmRSS"):
            number, _, unit = value.strip().partition(" ")
            if unit.strip() != "kB":
                raise ValueError(f"unexpected unit in {line!r}")
            found[name] = int(number)
    missing = {"VmHWM", "VmRSS"} - set(found)
    if missing:
        raise ValueError(f"/proc status without {', '.join(sorted(missing))}")
    return found


def machine_cpu_times() -> tuple[int, int]:
    """`(busy, total)` jiffies of all CPUs since boot, from the first line of `/proc/stat` (idle + iowait are idle)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return sum(fields) - idle, sum(fields)


def busy_fraction(before: tuple[int, int], after: tuple[int, int]) -> float:
    """The share of the machine's CPU time that was busy between two `machine_cpu_times()` readings."""
    total = after[1] - before[1]
    return (after[0] - before[0]) / total if total > 0 else 0.0


@dataclass
class ServiceDatabase:
    """A migrated, bootstrapped scratch database; `service` is an in-process `Service` for submitting and reading."""

    url: str
    settings_env: dict[str, str]
    service: Service
    principal: Any
    secret: str
    log_dir: Path
    processes: list[ServiceProcess] = field(default_factory=list)

    def process(self, role: str, source: Path | None = None, wrapper: tuple[str, ...] = ()) -> ServiceProcess:
        """A started (not yet ready) `candor serve --role ROLE` process on this database, importing candor from
        `source` if given (`--baseline-src`) and run under `wrapper` if given; stopped at the end."""
        started = ServiceProcess(role, self.settings_env, self.log_dir, source=source, wrapper=wrapper).start()
        self.processes.append(started)
        return started

    async def processes_ready(self, roles: list[str]) -> list[ServiceProcess]:
        """Start one process per role at once and wait until all are ready."""
        started = [self.process(role) for role in roles]
        await asyncio.gather(*(p.wait_ready() for p in started))
        return started

    async def submit(self, options: Mapping[str, Any], key: str) -> str:
        """`POST /v1/threads` through the command layer: a new thread and its first run; the run id."""
        accepted = await commands.create_thread(
            self.service, self.principal, agent=AGENT, input=PROMPT, options=dict(options), key=key
        )
        assert accepted.run is not None
        return accepted.run.id

    async def count_runs(self, *statuses: str) -> int:
        async with self.service.engine.connect() as conn:
            query = select(func.count()).select_from(runs).where(runs.c.status.in_(statuses))
            return int((await conn.execute(query)).scalar_one())


async def closed_loop(
    db: ServiceDatabase,
    options: Mapping[str, Any],
    count: int,
    in_flight: int,
    *,
    prefix: str,
    on_sealed: Callable[[int], Awaitable[None] | None] | None = None,
    poll_seconds: float = 0.01,
) -> list[str]:
    """Submit `count` runs keeping at most `in_flight` of them unsealed; their ids once all are sealed.

    `on_sealed(n)` is called at every poll (every `poll_seconds`) with how many of them are sealed so far (it may be
    a coroutine)."""
    base = await db.count_runs(*SEALED)
    submitted: list[str] = []
    while True:
        sealed = await db.count_runs(*SEALED) - base
        if on_sealed is not None and (waiting := on_sealed(sealed)) is not None:
            await waiting
        if sealed >= count:
            return submitted
        while len(submitted) < count and len(submitted) - sealed < in_flight:
            submitted.append(await db.submit(options, key=f"{prefix}-{len(submitted)}"))
        await asyncio.sleep(poll_seconds)


def bench_settings(env: Mapping[str, str]) -> ServiceSettings:
    settings = ServiceSettings.load(environ=env)
    settings.check_startup()  # the same refusal `candor serve` would give (S-56), before any process starts
    return settings


def settings_problem(**sections: Mapping[str, Any]) -> str | None:
    """Why `candor serve` would refuse these settings (S-56, S-124), or None: for a script's argument check."""
    try:
        bench_settings(settings_environment("postgresql://127.0.0.1/unused", **sections))
    except SettingsError as exc:
        return str(exc)
    return None


@asynccontextmanager
async def service_database(postgres_url: str, **sections: Mapping[str, Any]) -> AsyncIterator[ServiceDatabase]:
    """A fresh PostgreSQL database with the schema and a bootstrapped workspace; processes started through it are
    stopped and the database dropped at the end."""
    async with (
        _store.scratch_postgres(postgres_url, prefix="candor_bench_svc") as url,
        service_database_at(url, **sections) as database,
    ):
        yield database


@asynccontextmanager
async def service_database_at(url: str, **sections: Mapping[str, Any]) -> AsyncIterator[ServiceDatabase]:
    """`service_database` on an empty database the caller made (a scratch PostgreSQL database or a new SQLite
    file): migrated and bootstrapped; processes started through it are stopped at the end."""
    async with AsyncExitStack() as stack:
        env = settings_environment(url, **sections)
        settings = bench_settings(env)
        await migrate(url, lock_timeout=30)
        secret = (await operator.bootstrap(settings))["secret"]
        service = await Service.open(settings)
        stack.push_async_callback(service.close)
        authenticated = await commands.authenticate(service, secret)
        assert authenticated is not None
        log_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="candor-bench-logs-")))
        database = ServiceDatabase(
            url=url,
            settings_env=env,
            service=service,
            principal=authenticated.principal,
            secret=secret,
            log_dir=log_dir,
        )
        try:
            yield database
        finally:
            await asyncio.gather(*(p.stop() for p in database.processes), return_exceptions=True)


async def postgres_or_skip(postgres_url: str) -> str | None:
    """None when PostgreSQL answers, else the skip reason the summaries carry."""
    reason = await _store.postgres_unreachable(postgres_url)
    return None if reason is None else f"PostgreSQL not reachable at {_store.dsn(postgres_url)}: {reason}"
