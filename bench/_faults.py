"""Fault injection against real `candor serve` processes (issue 34 item 6): the faults, the agent and the checks.

Not a benchmark itself (private module, skipped by `bench.run_all`): tests/e2e/service/test_faults.py runs each
scenario of `bench/_fault_scenarios.py` with a few runs and asserts on its `FaultReport`; `bench.soak` runs the same
scenarios as extra phases and reports their counts.

The faults:

* `private_postgres()`: a throwaway PostgreSQL server (initdb in a temporary directory, a free port, optionally a low
  `max_connections`) that can be restarted, so restarting or filling it disturbs no one else;
* `FreezableProxy`: a TCP proxy between a worker and the database whose `freeze()` black-holes both directions
  (connections stay open, bytes stop) until `thaw()`;
* `small_tmpfs()` and `fill_disk()`: a SQLite database on a small tmpfs (root only) that is filled to the last byte
  and freed again;
* `hog_connections()`: every connection the server still admits, held, then released.

The agent (`factory`, hosted as `FAULT_AGENT` with `tool_recovery = "declared"`): the model first calls `charge`
(not retry-safe: every execution appends one line to a ledger file, fsynced, naming the run's tag, the call, the
process and the time), then `steps` retry-safe `step` calls, the model sleeping `model_seconds` before each answer.
Before its first answer it appends a marker line (tag, process id) so a test knows which worker holds the run; with
`tool_seconds`, `charge` marks its start too, sleeps, and asks `lease_held()` before its effect. Its
last answer records what it was told about `charge`: its result, or the unknown-outcome result of recovery (§3.10).
Comparing that with the ledger finds false unknown outcomes (the tool ran, yet the model was told its outcome is
unknown), duplicate effects, and effects after a lost lease (a ledger line from a process after it lost its lease).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic_ai import Agent, RunContext, Tool
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.usage import UsageLimits

from candor import Harness
from candor.harness.recovery_tools import is_unknown_outcome
from candor.tools import recovery_retryable

__all__ = (
    "FACTORY",
    "FAULT_AGENT",
    "FaultUnsupported",
    "LedgerLine",
    "PrivatePostgres",
    "FreezableProxy",
    "private_postgres",
    "small_tmpfs",
    "fill_disk",
    "hog_connections",
    "factory",
    "read_ledger",
    "read_told",
    "read_markers",
    "duplicate_effects",
    "false_unknowns",
    "effects_after",
)

FACTORY = "bench._faults:factory"
FAULT_AGENT = "faults"
CHARGE_CALL = "call_charge"


class FaultUnsupported(RuntimeError):
    """This machine cannot inject the fault (no PostgreSQL binaries, not root for a tmpfs mount): skip, saying why."""


# ------------------------------------------------------------------------------------------------ the agent


def _append_line(path: Path, record: dict[str, Any]) -> None:
    """One small O_APPEND write, fsynced: whole, and on disk before the caller goes on."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, (json.dumps(record) + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def _charge_result(messages: list[ModelMessage]) -> ToolReturnPart | None:
    for message in messages:
        if isinstance(message, ModelRequest):
            for part in message.parts:
                if isinstance(part, ToolReturnPart) and part.tool_call_id == CHARGE_CALL:
                    return part
    return None


def _lease_held() -> bool:
    """`candor.service.lease_held()` where this build has it (issue 34 item 3); True where it does not."""
    import candor.service

    ask = getattr(candor.service, "lease_held", None)
    return True if ask is None else bool(ask())


def fault_agent(
    tag: str, workdir: Path, steps: int, model_seconds: float, tool_seconds: float = 0.0
) -> Agent[None, str]:
    async def script(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        done = sum(isinstance(m, ModelResponse) for m in messages)
        if done == 0:
            _append_line(workdir / "markers.jsonl", {"tag": tag, "pid": os.getpid(), "at": time.time()})
        await asyncio.sleep(model_seconds)
        if done == 0:
            return ModelResponse(parts=[ToolCallPart("charge", {"amount": 1}, tool_call_id=CHARGE_CALL)])
        if done <= steps:
            return ModelResponse(parts=[ToolCallPart("step", {"n": done}, tool_call_id=f"call_{done:04d}")])
        result = _charge_result(messages)
        unknown = result is not None and is_unknown_outcome(result)
        _append_line(workdir / "told.jsonl", {"tag": tag, "unknown": unknown, "pid": os.getpid()})
        return ModelResponse(parts=[TextPart(f"done; charge {'unknown' if unknown else 'known'}")])

    async def charge(ctx: RunContext[None], amount: int) -> str:
        """Charge (an external effect; not safe to repeat)."""
        if tool_seconds > 0:  # a long tool: its effect comes last, once it has checked that its lease is held
            _append_line(workdir / "tool_markers.jsonl", {"tag": tag, "pid": os.getpid(), "at": time.time()})
            await asyncio.sleep(tool_seconds)
            if not _lease_held():
                return "not charged: the lease was lost"
        record = {"tag": tag, "call": ctx.tool_call_id, "pid": os.getpid(), "at": time.time()}
        _append_line(workdir / "ledger.jsonl", record)
        return "charged"

    async def step(n: int) -> str:
        """One unit of work (safe to repeat)."""
        return "ok"

    return Agent(FunctionModel(script, model_name="faults"), tools=[Tool(charge), recovery_retryable(Tool(step))])


def factory(options: dict[str, Any]) -> Harness[Any]:
    """`(options) -> Harness`: options `tag`, `workdir`, `steps` (default 3), `model_seconds` (default 0.2),
    `tool_seconds` (default 0: `charge` sleeps that long, then checks its lease, before its effect)."""
    steps = int(options.get("steps", 3))
    model_seconds, tool_seconds = float(options.get("model_seconds", 0.2)), float(options.get("tool_seconds", 0.0))
    agent = fault_agent(str(options["tag"]), Path(options["workdir"]), steps, model_seconds, tool_seconds)
    return Harness(agent, usage_limits=UsageLimits(request_limit=steps + 10))


# ------------------------------------------------------------------------------------------------ the checks


@dataclass(frozen=True)
class LedgerLine:
    """One execution of `charge`."""

    tag: str
    call: str
    pid: int
    at: float


def _jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def read_ledger(workdir: Path) -> list[LedgerLine]:
    return [LedgerLine(r["tag"], r["call"], int(r["pid"]), float(r["at"])) for r in _jsonl(workdir / "ledger.jsonl")]


def read_told(workdir: Path) -> dict[str, bool]:
    """Run tag → whether its model was told that `charge`'s outcome is unknown (the last answer's record)."""
    return {r["tag"]: bool(r["unknown"]) for r in _jsonl(workdir / "told.jsonl")}


def read_markers(workdir: Path, *, tool: bool = False) -> list[tuple[str, int]]:
    """`(tag, pid)` of every first model call (with `tool`: every start of a long `charge`), in order: which process
    was about to call `charge` for a run (or is running it)."""
    name = "tool_markers.jsonl" if tool else "markers.jsonl"
    return [(r["tag"], int(r["pid"])) for r in _jsonl(workdir / name)]


def duplicate_effects(ledger: list[LedgerLine]) -> dict[str, int]:
    """Run tag → executions of `charge`, for the tags executed more than once (pure)."""
    counts = Counter(line.tag for line in ledger)
    return {tag: n for tag, n in counts.items() if n > 1}


def false_unknowns(told: dict[str, bool], ledger: list[LedgerLine]) -> list[str]:
    """Tags whose model was told `charge`'s outcome is unknown although exactly one execution is in the ledger and
    its attempt went on (pure). A call interrupted by a crash of its process is legitimately unknown; under a
    database fault the tool ran and returned, so its result must have reached the model."""
    executed = Counter(line.tag for line in ledger)
    return sorted(tag for tag, unknown in told.items() if unknown and executed[tag] >= 1)


def effects_after(ledger: list[LedgerLine], *, pid: int, since: float) -> list[LedgerLine]:
    """Executions by process `pid` at or after `since` (pure): effects after that process lost its lease."""
    return [line for line in ledger if line.pid == pid and line.at >= since]


# ------------------------------------------------------------------------------------------------ PostgreSQL


@dataclass
class PrivatePostgres:
    """A throwaway PostgreSQL server; `url` names its `postgres` database."""

    root: Path
    port: int
    ctl: list[str]
    options: str
    as_owner: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    async def restart(self) -> float:
        """`pg_ctl restart -m fast` (every connection dropped); the seconds it took."""
        started = time.monotonic()
        await asyncio.to_thread(
            subprocess.run, [*self.ctl, "-m", "fast", "-o", self.options, "restart"], check=True, capture_output=True
        )
        return time.monotonic() - started

    def log_count(self, needle: str) -> int:
        """Lines of the server's log containing `needle` (e.g. `too many clients`)."""
        try:
            text = (self.root / "server.log").read_text(errors="replace")
        except OSError:
            return 0
        return sum(needle in line for line in text.splitlines())


@contextlib.asynccontextmanager
async def private_postgres(*, max_connections: int = 200) -> AsyncIterator[PrivatePostgres]:
    """A server initdb'd in a temporary directory on a free port (as `postgres` when run as root), stopped and
    removed at the end. Raises `FaultUnsupported` without PostgreSQL binaries."""
    binaries = sorted(Path("/usr/lib/postgresql").glob("*/bin"))
    if not binaries or not (binaries[-1] / "initdb").exists():
        raise FaultUnsupported("no PostgreSQL binaries under /usr/lib/postgresql")
    bin_dir = binaries[-1]
    root = Path(tempfile.mkdtemp(prefix="candor-fault-pg-"))
    from ._service import free_port

    port = free_port()
    as_owner: list[str] = []
    if os.geteuid() == 0:  # initdb and the server refuse to run as root
        shutil.chown(root, "postgres")
        as_owner = ["runuser", "-u", "postgres", "--"]
    data = root / "data"
    ctl = [*as_owner, str(bin_dir / "pg_ctl"), "-D", str(data), "-l", str(root / "server.log"), "-w"]
    options = (
        f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off "
        f"-c max_connections={max_connections} -c superuser_reserved_connections=1"
    )
    server = PrivatePostgres(root=root, port=port, ctl=ctl, options=options, as_owner=as_owner)
    try:
        await asyncio.to_thread(
            subprocess.run,
            [*as_owner, str(bin_dir / "initdb"), "-D", str(data), "-U", "postgres", "-A", "trust"],
            check=True,
            capture_output=True,
        )
        await asyncio.to_thread(subprocess.run, [*ctl, "-o", options, "start"], check=True, capture_output=True)
        yield server
    finally:
        subprocess.run([*ctl, "-m", "immediate", "stop"], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


@contextlib.asynccontextmanager
async def hog_connections(url: str, *, keep_free: int = 0) -> AsyncIterator[int]:
    """Open connections to `url` until the server refuses one (`too many clients`), close `keep_free` of them, hold
    the rest until the block ends; yields how many are held."""
    import asyncpg

    from ._store import dsn

    held: list[Any] = []
    try:
        while True:
            try:
                held.append(await asyncpg.connect(dsn(url), timeout=5))
            except (asyncpg.TooManyConnectionsError, asyncpg.CannotConnectNowError):
                break
            if len(held) > 1000:
                raise RuntimeError("the server admitted over 1000 connections: not a low max_connections")
        for connection in held[len(held) - keep_free :] if keep_free else []:
            await connection.close()
        held = held[: len(held) - keep_free] if keep_free else held
        yield len(held)
    finally:
        await asyncio.gather(*(c.close() for c in held), return_exceptions=True)


# ------------------------------------------------------------------------------------------------ the proxy


class FreezableProxy:
    """A TCP proxy on 127.0.0.1 to `target`; `freeze()` black-holes it (no byte passes either way, connections stay
    open, new ones are accepted and hang) until `thaw()`. Runs on the caller's event loop."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = 0
        self._open = asyncio.Event()
        self._open.set()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.connections = 0

    async def start(self) -> FreezableProxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def freeze(self) -> None:
        self._open.clear()

    def thaw(self) -> None:
        self._open.set()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        await self._open.wait()
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        for source, sink in ((reader, upstream_writer), (upstream_reader, writer)):
            task = asyncio.create_task(self._pipe(source, sink))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pipe(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        try:
            while data := await source.read(65536):
                await self._open.wait()  # frozen: hold the bytes, send nothing
                sink.write(data)
                await sink.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            with contextlib.suppress(OSError):
                sink.close()


# ------------------------------------------------------------------------------------------------ a full disk


@contextlib.contextmanager
def small_tmpfs(size_mb: int) -> Iterator[Path]:
    """A tmpfs of `size_mb` MiB mounted on a temporary directory (root only), unmounted at the end. Raises
    `FaultUnsupported` when it cannot be mounted."""
    if os.geteuid() != 0:
        raise FaultUnsupported("mounting a small tmpfs for a full filesystem needs root")
    where = Path(tempfile.mkdtemp(prefix="candor-fault-fs-"))
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(where)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        where.rmdir()
        raise FaultUnsupported(f"cannot mount a tmpfs: {mounted.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True, check=False)
        with contextlib.suppress(OSError):
            where.rmdir()


def fill_disk(directory: Path) -> Path:
    """Write a filler file in `directory` until its filesystem is full (ENOSPC); the filler's path."""
    filler = directory / "filler.bin"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for size in (1 << 20, 4096, 1):  # big writes first, then the last bytes they left free
            with contextlib.suppress(OSError):
                while True:
                    os.write(fd, b"\0" * size)
    finally:
        os.close(fd)
    return filler
