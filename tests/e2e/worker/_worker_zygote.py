"""A pre-imported worker spawner for crash tests: `python _worker_zygote.py`, driven through stdin/stdout.

Starting a Python worker process costs seconds of CPU in imports (pydantic-ai, SQLAlchemy, the drivers); a crash
matrix starts dozens. This process imports everything once and then forks one real worker process per request, so
each worker starts in milliseconds and is still a separate process with its own connections, killed for real by
its failpoint (`name:sigkill@count`: SIGKILL, no cleanup at all).

Protocol, one JSON object per line. Request on stdin:
`{"url", "worker_id", "agent", "failpoints", "log", "lease_seconds"}` → answer `{"started": pid}`; whenever a
child ends: `{"ended": pid, "signal": n | null, "code": n | null}`. EOF on stdin ends the spawner (children that
still run are killed). The forked worker runs `WorkerLoop.run_forever()` with one slot, registering only `agent`
(S-17: it claims no other cell's runs), with stdout and stderr sent to `log`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import selectors
import signal
import sys
from pathlib import Path
from typing import Any

sys.path.insert(
    0, str(Path(__file__).resolve().parents[2] / "support")
)  # tests/support: makes `worker.support` importable

# The drivers are imported lazily by SQLAlchemy: import them here so that a forked child does not pay for it.
import aiosqlite  # noqa: F401
import asyncpg  # noqa: F401
import pydantic_ai.models.function  # noqa: F401

from candor.service import failpoints
from candor.service.agents import AgentRegistry
from candor.service.core import Service
from candor.service.worker import WorkerLoop

from worker.support import FACTORY, crash_settings


async def _work(request: dict[str, Any]) -> None:
    settings = crash_settings(request["url"], lease_seconds=request["lease_seconds"])
    service = await Service.open(settings, agents=AgentRegistry({request["agent"]: FACTORY}))
    await WorkerLoop(service, worker_id=request["worker_id"], slots=1).run_forever()


def _child(request: dict[str, Any]) -> None:
    log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(0)
    os.environ["WORKER_TEST_ROLE"] = "dying"
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s %(error_type)s")
    logging.getLogger().handlers[0].addFilter(_with_error_type)
    failpoints.reset({failpoints.ENV_VAR: request["failpoints"]})
    try:
        asyncio.run(_work(request))
    finally:
        os._exit(3)  # the worker is meant to die at its failpoint; reaching here is an error


def _with_error_type(record: logging.LogRecord) -> bool:
    """The worker logs failures with an `error_type` extra; show it (empty for other records)."""
    record.error_type = getattr(record, "error_type", "")
    return True


def _report(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def _reap(children: set[int]) -> None:
    for pid in list(children):
        done, status = os.waitpid(pid, os.WNOHANG)
        if done == 0:
            continue
        children.discard(pid)
        killed = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
        code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else None
        _report({"ended": pid, "signal": killed, "code": code})


def main() -> None:
    children: set[int] = set()
    selector = selectors.DefaultSelector()
    selector.register(sys.stdin, selectors.EVENT_READ)
    _report({"ready": os.getpid()})
    try:
        while True:
            if selector.select(timeout=0.05):
                line = sys.stdin.readline()
                if not line:
                    return
                request = json.loads(line)
                sys.stdout.flush()
                pid = os.fork()
                if pid == 0:
                    _child(request)
                children.add(pid)
                _report({"started": pid})
            _reap(children)
    finally:
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


if __name__ == "__main__":
    main()
