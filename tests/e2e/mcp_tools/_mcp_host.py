"""Child process of `test_mcp_crash.py`: a host that checkpoints at every boundary while its agent calls an MCP tool.

Run as `python _mcp_host.py WORKDIR TOOL [URL]`. It streams one run whose model calls TOOL on the tool server (over
streamable HTTP at URL, else over stdio as its own child) and writes the exported state to `WORKDIR/state.json` at
every `BoundaryEvent` (atomically). The test kills it (with its process group) while the tool is running.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "support"))  # tests/support: `mcp_support`

from candor import BoundaryEvent, Harness

from mcp_support import calling_agent, toolset


def save_atomically(path: Path, payload: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(payload)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


async def host(workdir: Path, tool: str, url: str | None) -> None:
    agent, _ = calling_agent(tool, [toolset(workdir, url=url)])
    async with Harness(agent).stream("go") as stream:
        async for event in stream:
            if isinstance(event, BoundaryEvent):
                state = await stream.export_state()
                save_atomically(workdir / "state.json", state.model_dump_json())


if __name__ == "__main__":
    asyncio.run(host(Path(sys.argv[1]), sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None))
