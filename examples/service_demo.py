"""Act 4 of the demo: the same crash, hosted by the service on the embedded SQLite default.

A `candor serve --role worker` process takes the run, `charge_card` charges the card and the process is killed
with SIGKILL before any result was saved. The lease runs out, the control sweep recovers the attempt, and a second
worker continues from the last committed checkpoint: `charge_card` gets the unknown outcome, `lookup_order`
(retry-safe) runs again. Nothing to set up: the database is a file in the output folder.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from candor.demo.support import CRASH_AFTER_ENV, LEDGER_ENV, read_ledger
from candor.service import commands, operator
from candor.service.control.sweeps import expire_leases
from candor.service.core import Service
from candor.service.settings import ServiceSettings
from candor.service.store.reads import AttemptRow, RunRow
from candor.service.store.schema import migrate
from candor.service.worker.loop import WorkerLoop

CHARGE_PROMPT = "Please charge order A1 $40 for the replacement part."


@dataclass(frozen=True, kw_only=True)
class ServiceCrashFacts:
    worker_returncode: int
    run: RunRow
    attempts: list[AttemptRow]
    ledger: list[dict[str, Any]]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def service_environment(out_dir: Path) -> dict[str, str]:
    """Short leases so the demo shows a failover in seconds; everything else is the embedded default."""
    return {
        "CANDOR_DATABASE__URL": f"sqlite:///{out_dir / 'candor-service.db'}",
        "CANDOR_DATABASE__TIMEOUT": "0.9",
        "CANDOR_WORKER__LEASE_SECONDS": "3",
        "CANDOR_WORKER__AUTHORITY_SECONDS": "0.5",
        "CANDOR_WORKER__SCAN_SECONDS": "0.2",
        "CANDOR_SERVER__LISTEN": f"127.0.0.1:{_free_port()}",
        LEDGER_ENV: str(out_dir / "service-ledger.jsonl"),
    }


async def run_service_crash(out_dir: Path, *, timeout: float = 60.0) -> ServiceCrashFacts:
    out_dir.mkdir(parents=True, exist_ok=True)
    env = service_environment(out_dir)
    for stale in (out_dir / "candor-service.db", Path(env[LEDGER_ENV])):
        stale.unlink(missing_ok=True)
    settings = ServiceSettings.load(environ=env)
    await migrate(settings.database.url)
    secret = (await operator.bootstrap(settings))["secret"]
    previous_ledger = os.environ.get(LEDGER_ENV)
    os.environ[LEDGER_ENV] = env[LEDGER_ENV]  # the in-process worker's tools write to the same ledger
    service = await Service.open(settings)
    try:
        authenticated = await commands.authenticate(service, secret)
        assert authenticated is not None
        principal = authenticated.principal
        accepted = await commands.create_thread(
            service,
            principal,
            agent="support",
            key="demo-crash",
            input={"content": [{"type": "text", "text": CHARGE_PROMPT}]},
        )
        assert accepted.run is not None
        run_id = accepted.run.id
        # Worker 1: a real process, killed right after charge_card's effect reached the ledger.
        worker = subprocess.run(
            [sys.executable, "-m", "candor.cli", "serve", "--role", "worker"],
            env={**os.environ, **env, CRASH_AFTER_ENV: "charge_card"},
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if worker.returncode != -signal.SIGKILL:
            raise RuntimeError(f"worker 1 did not die as planned (rc={worker.returncode}):\n{worker.stderr[-2000:]}")
        # Control sweep + worker 2 in this process: the lease runs out, the run continues elsewhere.
        second = WorkerLoop(service, worker_id="wrk_demo_second")
        async with asyncio.timeout(timeout):
            while True:
                run = await commands.get_run(service, principal, run_id)
                if run.status in ("completed", "waiting", "failed", "cancelled"):
                    break
                await expire_leases(service)
                await second.run_until_idle(timeout=timeout)
                await asyncio.sleep(0.2)
        attempts = await commands.list_attempts(service, principal, run_id)
    finally:
        await service.close()
        if previous_ledger is None:
            os.environ.pop(LEDGER_ENV, None)
        else:
            os.environ[LEDGER_ENV] = previous_ledger
    return ServiceCrashFacts(
        worker_returncode=worker.returncode, run=run, attempts=attempts, ledger=read_ledger(env[LEDGER_ENV])
    )


async def act4(out_dir: Path, console: Console) -> ServiceCrashFacts:
    facts = await run_service_crash(out_dir)
    attempts = Table(title=f"run {facts.run.id}: attempts", title_justify="left")
    for column in ("#", "start", "status", "failure", "worker"):
        attempts.add_column(column)
    for attempt in facts.attempts:
        failure = (attempt.failure or {}).get("code", "")
        attempts.add_row(str(attempt.number), attempt.start_reason, attempt.status, failure, attempt.worker_id)
    console.print(
        Text(
            f"worker 1 (a real `candor serve --role worker` process) exited with {facts.worker_returncode}"
            " (SIGKILL) right after charging the card."
        )
    )
    console.print(attempts)
    charges = sum(1 for entry in facts.ledger if entry.get("tool") == "charge_card")
    console.print(Text(f"ledger: {charges} charge(s), {len(facts.ledger)} effect(s) in all"))
    console.print(Text(f"run status: {facts.run.status}; final answer: {facts.run.output}"))
    return facts
