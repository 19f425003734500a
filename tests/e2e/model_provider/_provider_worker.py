"""A worker process for the provider crash tests: `python _provider_worker.py DATABASE_URL WORKER_ID BASE_URL`.

It serves the `assistant` agent bound to the scripted provider at BASE_URL (key from `SCRIPTED_OPENAI_KEY`), lease
7 s (short, yet long enough for heartbeats on a loaded machine), one slot, until it is killed.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from pathlib import Path

sys.path.insert(
    0, str(Path(__file__).resolve().parents[2] / "support")
)  # tests/support: makes `model_provider` importable

from candor.service.core import Service
from candor.service.worker import WorkerLoop

from model_provider.support import provider_settings


class _WithExtras(logging.Formatter):
    """The message and the `extra` fields the service logs with it (status, reason, run id…)."""

    plain = set(vars(logging.makeLogRecord({})))

    def format(self, record: logging.LogRecord) -> str:
        extras = {key: value for key, value in vars(record).items() if key not in self.plain}
        return f"{super().format(record)} {extras}"


async def main(url: str, worker_id: str, base_url: str) -> None:
    handler = logging.StreamHandler(sys.stderr)  # the test shows it when the process misbehaves
    handler.setFormatter(_WithExtras())
    logging.basicConfig(level=logging.INFO, handlers=[handler])
    service = await Service.open(provider_settings(url, base_url, worker={"lease_seconds": 7}))
    service.agents.check_all()  # as `candor serve` does (S-56): no import blocks the loop while a lease runs
    try:
        await WorkerLoop(service, worker_id=worker_id, slots=1).run_forever()
    finally:
        await service.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3]))
