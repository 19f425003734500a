"""The PostgreSQL server's CPU that one system caused: its own backends plus a share of the background processes.

Not a benchmark itself (private module, skipped by `bench.run_all`). The server may be shared (other databases,
other clients), so its total CPU over a window is not the system's. `ServerCpuSampler` reads `pg_stat_activity`
every `interval` seconds and, for every server process it lists, the process's user + system CPU from
`/proc/<pid>/stat` (so the server must run on this machine). Each process is classed once, when first seen:

* **system**: a backend connected to the system's database (client backends, and autovacuum or parallel workers
  working on it), except the benchmark's own observer connections (`application_name` `OBSERVER`);
* **other**: a backend of any other database (another system, another user of the server);
* **background**: a process of no database (checkpointer, background writer, walwriter, autovacuum launcher,
  logical replication launcher, archiver) and the postmaster (it forks every new connection).

The system is charged its backends' CPU over the window plus the background processes' CPU in proportion to its
share of all client backends' CPU in the window (`attribute`): on a server nothing else uses, all of it. A backend
that exits inside the window is counted up to its last sample (at most `interval` seconds of its CPU are missed).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg

from . import _store

__all__ = ("OBSERVER", "ServerCpu", "ServerCpuSampler", "attribute", "classify", "observer_connection")

OBSERVER = "candor-bench-observer"
"""`application_name` of the benchmark's own connections (polls, samples): never charged to a system."""
SYSTEM, OTHER, BACKGROUND = "system", "other", "background"
_ACTIVITY = "SELECT pid, datname, backend_type, application_name FROM pg_stat_activity"


@dataclass(frozen=True)
class ServerCpu:
    """CPU ms of the PostgreSQL server charged to one system over one window."""

    backends_ms: float
    """The system's own backends."""
    background_ms: float
    """Its share of the background processes' CPU."""
    background_total_ms: float
    """All background processes' CPU in the window."""
    share: float
    """The system's backends' share of all client backends' CPU in the window (0..1)."""

    @property
    def total_ms(self) -> float:
        return self.backends_ms + self.background_ms


def classify(datname: str | None, application_name: str | None, database: str) -> str | None:
    """The class of a `pg_stat_activity` row for the system on `database` (module docstring); None: the
    benchmark's own connection, charged to nobody."""
    if application_name == OBSERVER:
        return None
    if datname is None:
        return BACKGROUND
    return SYSTEM if datname == database else OTHER


def attribute(first: dict[int, float], last: dict[int, float], classes: dict[int, str]) -> ServerCpu:
    """Charge the window between two readings (pid -> CPU ms) to the system. A process missing from `first`
    started inside the window, so all of its CPU is in it."""
    used = {SYSTEM: 0.0, OTHER: 0.0, BACKGROUND: 0.0}
    for pid, cpu in last.items():
        cls = classes.get(pid)
        if cls is not None:
            used[cls] += max(0.0, cpu - first.get(pid, 0.0))
    clients = used[SYSTEM] + used[OTHER]
    share = used[SYSTEM] / clients if clients > 0 else 0.0
    return ServerCpu(used[SYSTEM], share * used[BACKGROUND], used[BACKGROUND], share)


def parse_stat(text: str) -> tuple[int, int]:
    """(user + system clock ticks, parent pid) from the text of `/proc/<pid>/stat`."""
    fields = text.rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12]), int(fields[1])


def _read_stat(pid: int) -> tuple[int, int] | None:
    try:
        return parse_stat(Path(f"/proc/{pid}/stat").read_text())
    except (OSError, IndexError, ValueError):  # exited meanwhile, or not on this machine
        return None


async def observer_connection(url: str) -> asyncpg.Connection:
    """A connection of the benchmark's own (`application_name` `OBSERVER`), never charged to a system."""
    return await asyncpg.connect(_store.dsn(url), server_settings={"application_name": OBSERVER})


@dataclass
class ServerCpuSampler:
    """Samples the server's processes during a window (module docstring); `async with` it around the window."""

    server_url: str
    database: str
    interval: float = 0.2
    classes: dict[int, str] = field(default_factory=dict)
    first: dict[int, float] = field(default_factory=dict)
    last: dict[int, float] = field(default_factory=dict)
    local: bool = True
    """False when no server process can be read from /proc: the server is not on this machine."""

    async def __aenter__(self) -> ServerCpuSampler:
        self._conn = await observer_connection(self.server_url)
        self._ticks_ms = 1000 / os.sysconf("SC_CLK_TCK")
        self.first = await self._sample()
        self.local = bool(self.first)  # not even the observer's own backend readable: the server is elsewhere
        self.last = dict(self.first)
        self._task = asyncio.create_task(self._loop())
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        try:
            self.last.update(await self._sample())
        finally:
            await self._conn.close()

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            self.last.update(await self._sample())

    async def _sample(self) -> dict[int, float]:
        readings: dict[int, float] = {}
        postmaster: int | None = None
        for row in await self._conn.fetch(_ACTIVITY):
            cls = classify(row["datname"], row["application_name"], self.database)
            stat = _read_stat(row["pid"])
            if stat is None:  # exited since the query, or the server is not on this machine
                continue
            postmaster = stat[1]
            if cls is not None:
                self.classes.setdefault(row["pid"], cls)
                readings[row["pid"]] = stat[0] * self._ticks_ms
        if postmaster is not None and (parent := _read_stat(postmaster)) is not None:
            self.classes.setdefault(postmaster, BACKGROUND)
            readings[postmaster] = parent[0] * self._ticks_ms
        return readings

    def result(self) -> ServerCpu | None:
        """The system's share of the window; None when the server's processes are not readable here."""
        return attribute(self.first, self.last, self.classes) if self.local else None
