"""The MCP server of the demo's act 6: an order desk whose tools carry MCP annotations (`python -m
examples.mcp_orders_server`, stdio). Built on the `mcp` SDK's `MCPServer` (FastMCP).

Every call appends `<tool> <order_id>` to the file `$ORDERS_LEDGER` (fsynced) before it returns; while the file
`$ORDERS_HOLD` exists a call waits there (at most 30 s), so the demo can kill its caller mid-call.
"""

from __future__ import annotations

import asyncio
import os

from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations

server = MCPServer("order-desk")


async def _effect(tool: str, order_id: str) -> str:
    with open(os.environ["ORDERS_LEDGER"], "a", encoding="utf-8") as ledger:
        ledger.write(f"{tool} {order_id}\n")
        ledger.flush()
        os.fsync(ledger.fileno())
    hold = os.environ.get("ORDERS_HOLD")
    for _ in range(600):
        if not hold or not os.path.exists(hold):
            break
        await asyncio.sleep(0.05)
    return f"{tool}: done for order {order_id}"


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
async def lookup_order(order_id: str) -> str:
    """Look an order up."""
    return await _effect("lookup_order", order_id)


@server.tool(annotations=ToolAnnotations(idempotent_hint=True, destructive_hint=False))
async def set_shipping_address(order_id: str) -> str:
    """Set the order's shipping address to the customer's default (the same result however often it runs)."""
    return await _effect("set_shipping_address", order_id)


@server.tool(annotations=ToolAnnotations(idempotent_hint=True, destructive_hint=True))
async def cancel_order(order_id: str) -> str:
    """Cancel the order (idempotent, but destructive)."""
    return await _effect("cancel_order", order_id)


@server.tool()
async def charge_card(order_id: str) -> str:
    """Charge the customer's card for the order (no annotations)."""
    return await _effect("charge_card", order_id)


@server.tool()
async def send_receipt(order_id: str) -> str:
    """E-mail the receipt (no annotations; the mail service deduplicates by order, which the operator knows)."""
    return await _effect("send_receipt", order_id)


if __name__ == "__main__":
    server.run("stdio")
