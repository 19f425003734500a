"""Runs of an agent whose tools come from an MCP server configured in `[agents.mcp.mcp.bank]` (issue 36,
docs/mcp.md), on SQLite and PostgreSQL: a server that is down is a transient `tool_unavailable` (retried, then
sealed with that code), and after kill -9 of the worker mid-call the recovering attempt re-runs the call exactly
when its tool is declared retry-safe, and the run view says where the declaration came from."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest

from candor.service import commands
from candor.service.protocol.authority import Principal
from candor.service.worker import WorkerLoop
from candor.tools import UNKNOWN_OUTCOME_CONTENT

from mcp_runs.support import AGENT, CALL_ID, mcp_service
from mcp_support import http_server, ledger, server_env
from worker.support import (
    add_thread_run,
    attempt_rows,
    make_due,
    run_one_attempt,
    run_row,
    wait_for,
    wait_for_lease_expiry,
)

PROC = Path(__file__).with_name("_mcp_worker.py")


def _principal(tenant: Any) -> Principal:
    return Principal(id=tenant.principal_id, workspace_id=tenant.workspace_id, permissions=frozenset({"read", "run"}))


@pytest.mark.slow
async def test_a_server_that_is_down_is_retried_then_sealed_tool_unavailable(db, tenant, tmp_path: Path) -> None:
    """S-30, S-31, S-50, issue 36 item 3: each attempt fails `tool_unavailable` (charged, never a crash); after
    `max_attempts` the run is sealed `failed` with that code; no tool ran and no checkpoint was written."""
    service = mcp_service(db, "http://127.0.0.1:9/mcp", max_attempts=2)  # discard port: nothing listens
    async with db.engine.begin() as conn:
        ref = await add_thread_run(conn, tenant, agent=AGENT, text="go", max_attempts=2, options={"tool": "charge"})
    await run_one_attempt(service)
    await _wait_status(db, ref.run_id, "accepted")  # requeued with backoff
    await make_due(db.engine, ref.run_id)
    await run_one_attempt(service)
    await _wait_status(db, ref.run_id, "failed")

    run = await run_row(db.engine, ref.run_id)
    assert (run["status"], run["failure"]["code"], run["attempts"]) == ("failed", "tool_unavailable", 2)
    attempts = await attempt_rows(db.engine, ref.run_id)
    assert [(a["status"], (a["failure"] or {}).get("code")) for a in attempts] == [("failed", "tool_unavailable")] * 2
    assert run["checkpoint_id"] is None


async def _wait_status(db: Any, run_id: str, status: str) -> None:
    """Until the run has `status`: the attempt's task may still be settling when the worker loop returns."""

    async def reached() -> bool:
        return bool((await run_row(db.engine, run_id))["status"] == status)

    await wait_for(reached, timeout=30)


async def _start_worker(db_url: str, mcp_url: str, overrides: dict[str, Any], workdir: Path) -> Any:
    env = dict(os.environ, **server_env(workdir))
    env.pop("PYTHONSTARTUP", None)
    env.pop("CANDOR_FAILPOINTS", None)
    return await asyncio.create_subprocess_exec(
        sys.executable,
        str(PROC),
        db_url,
        "worker-first",
        mcp_url,
        json.dumps(overrides),
        cwd=str(workdir),
        env=env,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )


async def _kill_mid_call(process: Any, workdir: Path, timeout: float = 60) -> None:
    reached = False
    try:
        async with asyncio.timeout(timeout):
            while process.returncode is None and not (reached := ledger(workdir) != []):
                await asyncio.sleep(0.02)
    except TimeoutError:
        pass
    if process.returncode is None:
        process.send_signal(signal.SIGKILL)
    await process.wait()
    stderr = (await process.stderr.read()).decode()[-3000:]
    assert reached and process.returncode == -signal.SIGKILL, stderr


# (tool, overrides) → (re-run?, declared_by)
CRASH_CASES = [
    ("read_balance", {}, True, "annotation"),
    ("charge", {}, False, "none"),
    ("charge", {"retry_safe": ["charge"]}, True, "override"),
    ("read_balance", {"never_retry": ["read_balance"]}, False, "override"),
]


@pytest.mark.slow
@pytest.mark.crash
@pytest.mark.parametrize(("tool", "overrides", "rerun", "declared_by"), CRASH_CASES)
async def test_kill_the_worker_mid_call_then_recover_by_the_declaration(
    db, tenant, tmp_path: Path, tool: str, overrides: dict[str, Any], rerun: bool, declared_by: str
) -> None:
    """S-28, S-29, S-36, issue 36 items 1 and 4: the worker is SIGKILLed while the MCP tool runs (its effect is in
    the ledger, its result never committed); after the lease expires a worker in this process continues from the
    tool-boundary checkpoint: the call runs again exactly when declared retry-safe (annotation or override), else
    the model gets the unknown-outcome result; `GET /v1/runs/{id}`'s recovery entry says why."""
    (tmp_path / f"block-{tool}").write_text("")
    with http_server(tmp_path) as url:
        async with db.engine.begin() as conn:
            ref = await add_thread_run(conn, tenant, agent=AGENT, text="go", options={"tool": tool})
        process = await _start_worker(db.url, url, overrides, tmp_path)
        await _kill_mid_call(process, tmp_path)
        (tmp_path / f"block-{tool}").unlink()
        sweeper = mcp_service(db, url, **overrides)
        await wait_for_lease_expiry(sweeper, timeout=30)
        await make_due(db.engine, ref.run_id)
        await WorkerLoop(mcp_service(db, url, **overrides), worker_id="worker-second").run_until_idle(timeout=60)

    run = await run_row(db.engine, ref.run_id)
    assert (run["status"], run["output"]) == ("completed", "done")
    assert ledger(tmp_path) == [f"{tool} acme"] * (2 if rerun else 1)
    _, recovery = await commands.get_run_with_recovery(sweeper, _principal(tenant), ref.run_id)
    assert [(c.tool_call_id, c.tool_name, c.outcome, c.declared_by, c.declaration_changed) for c in recovery] == [
        (CALL_ID, tool, "replayed" if rerun else "unknown", declared_by, False)
    ]
    assert recovery[0].reason == ("retry_safe" if rerun else "not_retry_safe")
    if not rerun:
        page = await commands.list_run_messages_page(sweeper, _principal(tenant), ref.run_id)
        assert UNKNOWN_OUTCOME_CONTENT in json.dumps(page, default=str)


@pytest.mark.slow
@pytest.mark.crash
async def test_a_server_down_at_recovery_leaves_the_checkpoint_as_it_was(db, tenant, tmp_path: Path) -> None:
    """S-29, S-31, S-50, issue 36 item 3: the worker is SIGKILLed mid-call; the recovering attempt finds the server
    down and fails `tool_unavailable` (requeued, not sealed) without writing a checkpoint, so the call is still
    open; once the server is back the next attempt re-runs the read-only call and the run completes."""
    (tmp_path / "block-read_balance").write_text("")
    with http_server(tmp_path) as url:
        async with db.engine.begin() as conn:
            ref = await add_thread_run(conn, tenant, agent=AGENT, text="go", options={"tool": "read_balance"})
        process = await _start_worker(db.url, url, {}, tmp_path)
        await _kill_mid_call(process, tmp_path)
        (tmp_path / "block-read_balance").unlink()
    checkpoint = (await run_row(db.engine, ref.run_id))["checkpoint_id"]
    assert checkpoint is not None  # the tool-boundary checkpoint, with the call open

    down = mcp_service(db, url)  # the same URL: nothing listens there any more
    await wait_for_lease_expiry(down, timeout=30)
    await make_due(db.engine, ref.run_id)
    await run_one_attempt(down)
    await _wait_status(db, ref.run_id, "accepted")
    run = await run_row(db.engine, ref.run_id)
    assert run["checkpoint_id"] == checkpoint
    attempts = await attempt_rows(db.engine, ref.run_id)
    assert [(a["failure"] or {}).get("code") for a in attempts] == ["lease_expired", "tool_unavailable"]

    with http_server(tmp_path) as back:
        await make_due(db.engine, ref.run_id)
        await WorkerLoop(mcp_service(db, back), worker_id="worker-third").run_until_idle(timeout=60)
        await _wait_status(db, ref.run_id, "completed")
    assert ledger(tmp_path) == ["read_balance acme"] * 2
    _, recovery = await commands.get_run_with_recovery(down, _principal(tenant), ref.run_id)
    assert [(c.outcome, c.declared_by) for c in recovery] == [("replayed", "annotation")]


@pytest.mark.slow
@pytest.mark.crash
async def test_another_worker_judges_by_the_declaration_recorded_with_the_call(db, tenant, tmp_path: Path) -> None:
    """S-29, issue 36 item 2: killed mid-call on `charge` (unannotated); the server is redeployed declaring `charge`
    read-only; the worker that recovers judges the call by the checkpoint's record (unknown outcome, the charge is
    not repeated) and the run view says the declaration changed."""
    (tmp_path / "block-charge").write_text("")
    with http_server(tmp_path) as url:
        async with db.engine.begin() as conn:
            ref = await add_thread_run(conn, tenant, agent=AGENT, text="go", options={"tool": "charge"})
        process = await _start_worker(db.url, url, {}, tmp_path)
        await _kill_mid_call(process, tmp_path)
        (tmp_path / "block-charge").unlink()
    with http_server(tmp_path, CANDOR_MCP_FLIP="1") as redeployed:
        recovering = mcp_service(db, redeployed)
        await wait_for_lease_expiry(recovering, timeout=30)
        await make_due(db.engine, ref.run_id)
        await WorkerLoop(recovering, worker_id="worker-second").run_until_idle(timeout=60)
        await _wait_status(db, ref.run_id, "completed")

    assert ledger(tmp_path) == ["charge acme"]
    _, recovery = await commands.get_run_with_recovery(recovering, _principal(tenant), ref.run_id)
    assert [(c.outcome, c.reason, c.declared_by, c.declaration_changed) for c in recovery] == [
        ("unknown", "not_retry_safe", "none", True)
    ]
