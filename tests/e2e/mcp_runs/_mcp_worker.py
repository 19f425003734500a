"""A worker process for the MCP crash tests: `python _mcp_worker.py DATABASE_URL WORKER_ID MCP_URL OVERRIDES_JSON`.

It serves the `mcp` agent with the tool server at MCP_URL as `[agents.mcp.mcp.bank]` (plus the JSON object of
`retry_safe` / `never_retry` overrides), lease 7 s, one slot, until it is killed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "support"))  # tests/support: makes `mcp_runs` importable

from candor.service.core import Service
from candor.service.worker import WorkerLoop

from mcp_runs.support import mcp_settings


async def main(url: str, worker_id: str, mcp_url: str, overrides: str) -> None:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)  # the test shows it when the process misbehaves
    service = await Service.open(mcp_settings(url, mcp_url, lease_seconds=7, **json.loads(overrides)))
    service.agents.check_all()  # as `candor serve` does (S-56)
    try:
        await WorkerLoop(service, worker_id=worker_id, slots=1).run_forever()
    finally:
        await service.close()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
