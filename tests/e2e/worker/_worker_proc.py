"""A worker process for the crash test: `python _worker_proc.py DATABASE_URL WORKER_ID`.

It opens a Service on the database (lease 3 s, heartbeat 0.5 s, the scripted agents of `support.py`) and runs
`WorkerLoop.run_forever()` with one slot until it is killed, or until a failpoint armed through
`CANDOR_FAILPOINTS` ends the process. Tool effects go to the files named by the run's `options["workdir"]`.

For a test that times out waiting for it: SIGUSR1 prints every asyncio task's stack and SIGUSR2 every thread's
(faulthandler, which works even when the event loop is blocked), both to stderr (`dump_and_kill` in test_crash.py).
"""

from __future__ import annotations

import asyncio
import faulthandler
import os
import signal
import sys
from pathlib import Path

sys.path.insert(
    0, str(Path(__file__).resolve().parents[2] / "support")
)  # tests/support: makes `worker.support` importable

from candor.service.core import Service
from candor.service.worker import WorkerLoop
from candor.service.worker.drain import install_sigterm

from worker.support import make_settings


def _print_tasks() -> None:
    for task in asyncio.all_tasks():
        task.print_stack(file=sys.stderr)
    sys.stderr.flush()


async def main(url: str, worker_id: str) -> None:
    faulthandler.register(signal.SIGUSR2, all_threads=True)
    asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, _print_tasks)
    service = await Service.open(make_settings(url, lease_seconds=3))
    try:
        worker = WorkerLoop(service, worker_id=worker_id, slots=1)
        if os.environ.get("WORKER_TEST_DRAIN"):
            install_sigterm(worker, on_drained=worker.stop)  # SIGTERM: hand off at the next model boundary
        await worker.run_forever()
    finally:
        await service.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
