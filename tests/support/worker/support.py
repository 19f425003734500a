"""Shared pieces of the worker tests: scripted agents behind one factory, a Service on the test database, rows.

The factory `worker.support:factory` builds a fresh `candor.Harness` per attempt from `options["script"]`:

* `echo` – one model turn answering `echo: <prompt>`;
* `tools` – the model asks for `charge` (not retry-safe) and `lookup` (retry-safe) in one response, then answers
  `done`; with `options["workdir"]` both tools also append a line to files there (the crash test's ledger);
* `approval` – the model calls `delete_file`, which requires approval; after approval it answers `deleted`;
* `unavailable` – the model fails with HTTP 503 (`model_unavailable`, a transient failure);
* `step` – the model calls the retry-safe `step` tool once, then answers `stepped`;
* `client` – the model calls the client tool `get_weather` (§8.8), then answers with what it received;
* `pay` – one response asks for `charge_card` and `refund` (each with a reconciler against the idempotent fake
  payment API `CONTROL.payments`, keyed by `call_key(ctx)`), `notify` (no reconciler) and `lookup` (retry-safe);
  `charge_card` charges before the tool gate, `refund` after it; then the model answers with what it got back;
* `boom` – the factory raises (`agent_unavailable`).

Tests steer timing through `CONTROL`: `model_gate` / `tool_gate` make the model or the tools wait, `model_entered`
/ `tool_entered` say they were reached, `ledger` records every tool effect, `on_tool` runs inside each tool.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic_ai import Agent, RunContext, Tool
from pydantic_ai.exceptions import ModelHTTPError
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from sqlalchemy import insert, select, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from candor import Harness
from candor.service.agents import AgentRegistry
from candor.service.core import Service
from candor.service.runtime import SeededEntropy
from candor.service.settings import ServiceSettings
from candor.service.store.runs.current_checkpoint import run_columns
from candor.service.store.schema.dialect import db_now
from candor.service.store.schema.tables import inbox_entries, principals, run_attempts, runs, threads, workspaces
from candor.service.worker import WorkerLoop
from candor.tools import NotDone, Reconciled, ReconcileRequest, call_key, recovery_retryable, with_reconciler

from waiting import wait_until

FACTORY = f"{__name__}:factory"


@dataclass
class Control:
    ledger: list[str] = field(default_factory=list)
    model_calls: int = 0
    model_gate: asyncio.Event | None = None
    model_entered: asyncio.Event = field(default_factory=asyncio.Event)
    tool_gate: asyncio.Event | None = None
    tool_entered: asyncio.Event = field(default_factory=asyncio.Event)
    on_tool: Callable[[str], Awaitable[None]] | None = None
    payments: dict[str, str] = field(default_factory=dict)
    """The `pay` script's fake payment API: idempotency key → charge or refund id (one effect per key)."""
    reconciled_keys: list[str] = field(default_factory=list)


CONTROL = Control()


def reset_control() -> Control:
    global CONTROL
    CONTROL = Control()
    return CONTROL


# --- agents ------------------------------------------------------------------------------------------------------


def _append(workdir: str | None, name: str, line: str) -> None:
    if workdir is None:
        return
    with open(Path(workdir) / name, "a", encoding="utf-8") as handle:
        handle.write(line + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def _last_prompt(messages: list[ModelMessage]) -> str:
    for message in reversed(messages):
        if isinstance(message, ModelRequest):
            for part in message.parts:
                if isinstance(part, UserPromptPart) and isinstance(part.content, str):
                    return part.content
    return ""


def _has_response(messages: list[ModelMessage]) -> bool:
    return any(isinstance(m, ModelResponse) for m in messages)


async def _tool_effect(name: str, workdir: str | None, line: str) -> None:
    control = CONTROL
    control.ledger.append(line)
    _append(workdir, f"{name}.txt", line)
    control.tool_entered.set()
    if control.on_tool is not None:
        await control.on_tool(name)
    if control.tool_gate is not None:
        await control.tool_gate.wait()


def _model(respond: Callable[[list[ModelMessage]], ModelResponse]) -> FunctionModel:
    async def function(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        control = CONTROL
        control.model_calls += 1
        control.model_entered.set()
        if control.model_gate is not None:
            await control.model_gate.wait()
        return respond(messages)

    return FunctionModel(function)


def _echo(options: dict[str, Any]) -> Agent[Any, Any]:
    return Agent(_model(lambda messages: ModelResponse(parts=[TextPart(f"echo: {_last_prompt(messages)}")])))


def _tools(options: dict[str, Any]) -> Agent[Any, Any]:
    workdir = options.get("workdir")
    role = os.environ.get("WORKER_TEST_ROLE", "inproc")

    async def charge(ctx: RunContext[Any], amount: int) -> str:
        """Charge the card (not safe to repeat)."""
        await _tool_effect("charge", workdir, f"{role} {ctx.tool_call_id} charge {amount}")
        return f"charged {amount}"

    async def lookup(ctx: RunContext[Any], account: str) -> str:
        """Read a balance (safe to repeat)."""
        await _tool_effect("lookup", workdir, f"{role} {ctx.tool_call_id} lookup {account}")
        return f"balance of {account}: 10"

    def respond(messages: list[ModelMessage]) -> ModelResponse:
        if not _has_response(messages):
            return ModelResponse(
                parts=[
                    ToolCallPart("charge", {"amount": 42}, tool_call_id="call_charge"),
                    ToolCallPart("lookup", {"account": "acme"}, tool_call_id="call_lookup"),
                ]
            )
        return ModelResponse(parts=[TextPart("done")])

    return Agent(_model(respond), tools=[Tool(charge), recovery_retryable(Tool(lookup))])


def _approval(options: dict[str, Any]) -> Agent[Any, Any]:
    async def delete_file(ctx: RunContext[Any], path: str) -> str:
        """Delete a file."""
        await _tool_effect("delete_file", None, f"delete {path}")
        return f"deleted {path}"

    def respond(messages: list[ModelMessage]) -> ModelResponse:
        if not _has_response(messages):
            return ModelResponse(parts=[ToolCallPart("delete_file", {"path": "a.txt"}, tool_call_id="call_delete")])
        return ModelResponse(parts=[TextPart("deleted")])

    return Agent(_model(respond), tools=[Tool(delete_file, requires_approval=True)])


def _unavailable(options: dict[str, Any]) -> Agent[Any, Any]:
    def respond(messages: list[ModelMessage]) -> ModelResponse:
        raise ModelHTTPError(503, "scripted")

    return Agent(_model(respond))


def _step(options: dict[str, Any]) -> Agent[Any, Any]:
    async def step(ctx: RunContext[Any]) -> str:
        """Take one step (safe to repeat)."""
        await _tool_effect("step", None, f"step {ctx.tool_call_id}")
        return "stepped"

    def respond(messages: list[ModelMessage]) -> ModelResponse:
        if not _has_response(messages):
            return ModelResponse(parts=[ToolCallPart("step", {}, tool_call_id="call_step")])
        return ModelResponse(parts=[TextPart("stepped")])

    return Agent(_model(respond), tools=[recovery_retryable(Tool(step))])


def _client(options: dict[str, Any]) -> Agent[Any, Any]:
    """§8.8: the model calls the client tool `get_weather` (not an agent tool), then reports what it received."""

    def respond(messages: list[ModelMessage]) -> ModelResponse:
        for message in reversed(messages):
            if isinstance(message, ModelRequest):
                for part in message.parts:
                    if getattr(part, "tool_call_id", None) == "call_weather" and hasattr(part, "content"):
                        return ModelResponse(parts=[TextPart(f"{type(part).__name__}: {part.content}")])
        return ModelResponse(parts=[ToolCallPart("get_weather", {"city": "Paris"}, tool_call_id="call_weather")])

    return Agent(_model(respond))


def _slow(options: dict[str, Any]) -> Agent[Any, Any]:
    """One slow retry-safe step: the test knows it started (a file appears) and can stop the worker meanwhile."""
    workdir = options.get("workdir")

    async def slow_step(ctx: RunContext[Any]) -> str:
        """Take one slow step (safe to repeat)."""
        await _tool_effect("slow_started", workdir, f"{os.environ.get('WORKER_TEST_ROLE', 'inproc')} started")
        await asyncio.sleep(float(options.get("sleep", 1.0)))
        return "slow step done"

    def respond(messages: list[ModelMessage]) -> ModelResponse:
        if not _has_response(messages):
            return ModelResponse(parts=[ToolCallPart("slow_step", {}, tool_call_id="call_slow")])
        return ModelResponse(parts=[TextPart("slow done")])

    return Agent(_model(respond), tools=[recovery_retryable(Tool(slow_step))])


def _pay(options: dict[str, Any]) -> Agent[Any, Any]:
    """Reconcile before unknown (docs/state-and-resume.md) against an idempotent fake payment API."""

    def effect(kind: str, key: str) -> str:
        return CONTROL.payments.setdefault(key, f"{kind}_{len(CONTROL.payments) + 1}")

    async def charge_card(ctx: RunContext[Any], amount: int) -> str:
        """Charge the card; the payment API dedups by idempotency key."""
        charge = effect("ch", call_key(ctx))
        await _tool_effect("charge_card", None, f"charge {amount} {charge}")
        return charge

    async def refund(ctx: RunContext[Any], amount: int) -> str:
        """Refund; the effect happens after the tool gate."""
        await _tool_effect("refund", None, f"refund {amount}")
        return effect("re", call_key(ctx))

    async def notify(ctx: RunContext[Any], text: str) -> str:
        """Send a note (no reconciler, not retry-safe)."""
        await _tool_effect("notify", None, f"notify {text}")
        return "sent"

    async def lookup(ctx: RunContext[Any], account: str) -> str:
        """Read a balance (safe to repeat)."""
        await _tool_effect("lookup", None, f"lookup {account}")
        return f"balance of {account}: 10"

    async def find(request: ReconcileRequest) -> Any:
        CONTROL.reconciled_keys.append(request.key)
        found = CONTROL.payments.get(request.key)
        return NotDone() if found is None else Reconciled(found)

    def respond(messages: list[ModelMessage]) -> ModelResponse:
        if not _has_response(messages):
            return ModelResponse(
                parts=[
                    ToolCallPart("charge_card", {"amount": 40}, tool_call_id="call_charge"),
                    ToolCallPart("refund", {"amount": 5}, tool_call_id="call_refund"),
                    ToolCallPart("notify", {"text": "paid"}, tool_call_id="call_notify"),
                    ToolCallPart("lookup", {"account": "acme"}, tool_call_id="call_lookup"),
                ]
            )
        returns = [p for p in messages[-1].parts if isinstance(p, ToolReturnPart)]
        return ModelResponse(parts=[TextPart(", ".join(f"{p.tool_name}={p.outcome}" for p in returns))])

    tools = [
        with_reconciler(Tool(charge_card), find),
        with_reconciler(Tool(refund), find),
        Tool(notify),
        recovery_retryable(Tool(lookup)),
    ]
    return Agent(_model(respond), tools=tools)


SCRIPTS: dict[str, Callable[[dict[str, Any]], Agent[Any, Any]]] = {
    "pay": _pay,
    "slow": _slow,
    "client": _client,
    "echo": _echo,
    "tools": _tools,
    "approval": _approval,
    "unavailable": _unavailable,
    "step": _step,
}


def factory(options: dict[str, Any]) -> Harness[Any]:
    script = options.get("script", "echo")
    if script == "boom":
        raise RuntimeError("the factory failed")
    return Harness(SCRIPTS[script](options))


# --- service and rows --------------------------------------------------------------------------------------------


def make_settings(url: str, **worker: Any) -> ServiceSettings:
    values: dict[str, Any] = {"lease_seconds": 10, "authority_seconds": 0.5, "scan_seconds": 0.05}
    values.update(worker)
    return ServiceSettings(
        database={"url": url, "timeout": 0.9},
        worker=values,
        agents={"scripted": {"factory": FACTORY}},
    )


def crash_settings(url: str, *, lease_seconds: float) -> ServiceSettings:
    """Settings for crash tests that run many workers side by side on a loaded machine: a statement timeout (and
    SQLite busy timeout) of just under a third of the lease, a heartbeat every sixth of it (S-56 bounds)."""
    return ServiceSettings(
        database={"url": url, "timeout": lease_seconds / 3.2},
        worker={"lease_seconds": lease_seconds, "authority_seconds": lease_seconds / 6, "scan_seconds": 0.1},
        agents={"scripted": {"factory": FACTORY}},
    )


def make_service(url: str, engine: AsyncEngine, **worker: Any) -> Service:
    return Service(
        settings=make_settings(url, **worker),
        engine=engine,
        agents=AgentRegistry({"scripted": FACTORY}),
        entropy=SeededEntropy(secrets.randbits(32)),
        wakeups=asyncio.Event(),
    )


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(16)}"


@dataclass(frozen=True)
class Tenant:
    workspace_id: str
    principal_id: str


@dataclass(frozen=True)
class RunRef:
    tenant: Tenant
    thread_id: str
    run_id: str
    entry_id: str | None


async def add_tenant(conn: AsyncConnection) -> Tenant:
    workspace_id, principal_id = new_id("wsp"), new_id("key")
    await conn.execute(insert(workspaces).values(id=workspace_id, name=workspace_id, created_at=db_now()))
    await conn.execute(
        insert(principals).values(
            id=principal_id,
            workspace_id=workspace_id,
            name="test",
            secret_hash=secrets.token_hex(32),
            permissions=["read", "run", "admin"],
            created_at=db_now(),
        )
    )
    return Tenant(workspace_id=workspace_id, principal_id=principal_id)


def content(text: str) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": text}]}


async def add_thread_run(
    conn: AsyncConnection,
    tenant: Tenant,
    *,
    script: str = "echo",
    text: str | None = "hello",
    agent: str = "scripted",
    max_attempts: int = 3,
    options: dict[str, Any] | None = None,
    thread_id: str | None = None,
    **run_values: Any,
) -> RunRef:
    """A thread (unless `thread_id`) and an `accepted` run whose source entry (if `text`) is assigned to it."""
    run_id = new_id("run")
    if thread_id is None:
        thread_id = new_id("thr")
        await conn.execute(
            insert(threads).values(
                id=thread_id,
                workspace_id=tenant.workspace_id,
                origin="new",
                agent=agent,
                created_at=db_now(),
                updated_at=db_now(),
            )
        )
    entry_id = None
    if text is not None:
        entry_id = new_id("ent")
        payload = content(text)
        position = run_values.pop("position", 1)
        await conn.execute(
            insert(inbox_entries).values(
                id=entry_id,
                workspace_id=tenant.workspace_id,
                thread_id=thread_id,
                kind="message",
                delivery="next_run",
                position=position,
                principal_id=tenant.principal_id,
                payload=payload,
                size=len(json.dumps(payload)),
                status="assigned",
                assigned_run_id=run_id,
                created_at=db_now(),
            )
        )
    opts = {"script": script, **(options or {})}
    row: dict[str, Any] = {
        "id": run_id,
        "workspace_id": tenant.workspace_id,
        "thread_id": thread_id,
        "agent": agent,
        "principal_id": tenant.principal_id,
        "authority": {"principal_id": tenant.principal_id, "permissions": ["read", "run", "admin"]},
        "options": opts,
        "options_digest": "0" * 64,
        "source_entry_id": entry_id,
        "trigger": "input",
        "lineage": "root",
        "status": "accepted",
        "available_at": db_now(),
        "max_attempts": max_attempts,
        "created_at": db_now(),
    }
    row.update(run_values)
    await conn.execute(insert(runs).values(**row))
    await conn.execute(update(threads).where(threads.c.id == thread_id).values(current_run_id=run_id))
    return RunRef(tenant=tenant, thread_id=thread_id, run_id=run_id, entry_id=entry_id)


async def run_row(engine: AsyncEngine, run_id: str) -> Any:
    """The run as every reader sees it: a running run's checkpoint is its latest committed one
    (`current_checkpoint.run_columns`; plain steps do not move `runs.checkpoint_seq`)."""
    async with engine.connect() as conn:
        return (await conn.execute(select(*run_columns()).where(runs.c.id == run_id))).mappings().one()


async def attempt_rows(engine: AsyncEngine, run_id: str) -> list[Any]:
    async with engine.connect() as conn:
        query = select(run_attempts).where(run_attempts.c.run_id == run_id).order_by(run_attempts.c.number)
        return list((await conn.execute(query)).mappings().all())


async def make_due(engine: AsyncEngine, run_id: str) -> None:
    """Skip a recovered run's backoff. Only an `accepted` run is touched: on a slow machine the worker may already
    have claimed (or finished) it once the backoff ran out, and a sealed run is immutable (S-6)."""
    async with engine.begin() as conn:
        await conn.execute(
            update(runs).where(runs.c.id == run_id, runs.c.status == "accepted").values(available_at=db_now())
        )


async def run_one_attempt(service: Service, *, timeout: float = 60.0) -> None:
    """Claim exactly one run and wait until that attempt has ended, claiming nothing more. A failed attempt's run is
    due again 1 s after its seal (S-31); a plain `run_until_idle` on a loaded machine can stall that long between
    the seal and its idle check and claim the retry too."""
    worker = WorkerLoop(service)
    assert await worker.claim_once() == 1, "no run was claimable"
    worker.stop_claiming()
    await worker.run_until_idle(timeout=timeout)


async def kill_worker(worker: Any, task: asyncio.Task[None]) -> None:
    """Simulate a dead worker: its tasks vanish without another database write."""
    task.cancel()
    for handle in worker.live_handles():
        assert handle.task is not None
        handle.task.cancel()
    await asyncio.gather(task, *(h.task for h in worker.live_handles() if h.task), return_exceptions=True)


async def wait_for(predicate: Callable[[], Awaitable[bool]], *, timeout: float = 15.0, interval: float = 0.05) -> None:
    await wait_until(predicate, timeout, interval=interval)


async def wait_for_lease_expiry(service: Service, *, timeout: float = 10.0) -> None:
    """Until a lease-expiry pass recovers the one attempt of a killed worker (S-28), polling every 0.2 s.

    A pass the database cannot serve (`StoreUnavailable`) counts as "not yet", as in the control process, whose
    sweeps retry at their next period (S-125). Seen once under CI's load on SQLite: the first pass after a kill met
    `database is locked` after the busy timeout. A lock that is never released still fails the wait."""
    from candor.service.control.sweeps import expire_leases
    from candor.service.errors import StoreUnavailable

    async def expired() -> bool:
        try:
            return await expire_leases(service) == 1
        except StoreUnavailable:
            return False

    await wait_for(expired, timeout=timeout, interval=0.2)


async def add_steer_entry(conn: AsyncConnection, ref: RunRef, *, text: str, position: int) -> str:
    """A `pending` steer entry on the run's thread."""
    entry_id = new_id("ent")
    payload = content(text)
    await conn.execute(
        insert(inbox_entries).values(
            id=entry_id,
            workspace_id=ref.tenant.workspace_id,
            thread_id=ref.thread_id,
            kind="message",
            delivery="steer",
            position=position,
            principal_id=ref.tenant.principal_id,
            payload=payload,
            size=len(json.dumps(payload)),
            status="pending",
            created_at=db_now(),
        )
    )
    return entry_id


async def run_until_failpoint(
    argv: list[str], failpoint: str, *, cwd: str | None = None, timeout: float = 60, **env: str
) -> None:
    """Run `python *argv` with `CANDOR_FAILPOINTS=failpoint` (plus `env`) until the failpoint kills it; asserts it
    died there (exit code `EXIT_CODE`, the failpoint's message on stderr). The child is killed on any way out."""
    import sys

    from candor.service.failpoints import EXIT_CODE

    environment = dict(os.environ, CANDOR_FAILPOINTS=failpoint, **env)
    environment.pop("PYTHONSTARTUP", None)
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        *argv,
        env=environment,
        cwd=cwd,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        _, stderr = await asyncio.wait_for(process.communicate(), timeout)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode == EXIT_CODE, stderr.decode()[-3000:]
    name = failpoint.partition("@")[0]
    assert f"failpoint {name} fired" in stderr.decode()
