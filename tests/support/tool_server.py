"""A real MCP server for the tests (the `mcp` package's `MCPServer`, formerly FastMCP): one tool per annotation case.

Run as `python tool_server.py stdio` or `python tool_server.py http PORT`. Every call appends
`<tool> <argument>` to the file named by `$CANDOR_MCP_LEDGER` (fsynced) before anything else, so a test sees
each effect even when the caller dies. While the file `$CANDOR_MCP_BLOCK_DIR/block-<tool>` exists the tool then
waits (a minute at most): the test kills its caller mid-call, then removes the file. `$CANDOR_MCP_FLIP=1` serves the same tools with the annotations of `charge` and
`read_balance` swapped (a redeployed server that now declares them differently). A tool named in
`$CANDOR_MCP_DIE` ends the server process right after its ledger line (the server lost mid-call).
"""

from __future__ import annotations

import asyncio
import os
import sys

from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations

READ_ONLY = ToolAnnotations(read_only_hint=True)
IDEMPOTENT = ToolAnnotations(idempotent_hint=True, destructive_hint=False)
IDEMPOTENT_DESTRUCTIVE = ToolAnnotations(idempotent_hint=True, destructive_hint=True)
UNDECLARED = ToolAnnotations()
CASES = {
    # tool → (annotations, re-run under "declared" without overrides)
    "read_balance": (READ_ONLY, True),
    "set_limit": (IDEMPOTENT, True),
    "wipe_cache": (IDEMPOTENT_DESTRUCTIVE, False),
    "charge": (UNDECLARED, False),
}

server = MCPServer("candor-test-tools")
_flip = os.environ.get("CANDOR_MCP_FLIP") == "1"


async def _effect(tool: str, argument: str) -> str:
    with open(os.environ["CANDOR_MCP_LEDGER"], "a", encoding="utf-8") as ledger:
        ledger.write(f"{tool} {argument}\n")
        ledger.flush()
        os.fsync(ledger.fileno())
    if os.environ.get("CANDOR_MCP_DIE") == tool:
        os._exit(1)
    block_dir = os.environ.get("CANDOR_MCP_BLOCK_DIR")
    for _ in range(1200):
        if not block_dir or not os.path.exists(os.path.join(block_dir, f"block-{tool}")):
            break
        await asyncio.sleep(0.05)
    return f"{tool} done for {argument}"


def _annotations(tool: str) -> ToolAnnotations:
    if _flip and tool in ("charge", "read_balance"):
        tool = "read_balance" if tool == "charge" else "charge"
    return CASES[tool][0]


@server.tool(annotations=_annotations("read_balance"))
async def read_balance(account: str) -> str:
    """Read an account's balance."""
    return await _effect("read_balance", account)


@server.tool(annotations=_annotations("set_limit"))
async def set_limit(account: str) -> str:
    """Set an account's limit to a fixed value."""
    return await _effect("set_limit", account)


@server.tool(annotations=_annotations("wipe_cache"))
async def wipe_cache(account: str) -> str:
    """Drop an account's cache."""
    return await _effect("wipe_cache", account)


@server.tool(annotations=_annotations("charge"))
async def charge(account: str) -> str:
    """Charge an account."""
    return await _effect("charge", account)


if __name__ == "__main__":
    if sys.argv[1] == "stdio":
        server.run("stdio")
    else:
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
