"""The scripted agent of the run inspector's browser test (`inspector_agent:factory`), in a real `candor serve`.

Its `FunctionModel` answers, from the history:

1. first turn: `refund_order`, which needs approval (its `note` argument is markup, which the page must show as
   text) → the run ends `waiting`;
2. once the refund has its result: `charge_card` (not declared retry-safe) and `lookup_order`
   (`recovery_retryable`) in one response. The *first* execution of each (across processes: its line in
   `<options["workdir"]>/<tool>.txt`) blocks for `options["block_seconds"]`, long enough for the test to SIGKILL the
   process; after the crash, recovery gives `charge_card` the unknown-outcome result and replays `lookup_order`,
   whose second execution returns at once;
3. after both have results: a final text naming them.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from pydantic_ai import Agent, Tool
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from candor import Harness
from candor.tools import recovery_retryable

from serve_agents import latest_returns

__all__ = ("FACTORY", "MARKUP", "factory", "started")

FACTORY = f"{__name__}:factory"
MARKUP = '<img src="x" onerror="document.title=\'owned\'">'


def started(workdir: Path, tool: str) -> int:
    """How many executions of `tool` have started."""
    path = workdir / f"{tool}.txt"
    return len(path.read_text(encoding="utf-8").splitlines()) if path.exists() else 0


def _record(workdir: Path, tool: str) -> int:
    before = started(workdir, tool)
    with open(workdir / f"{tool}.txt", "a", encoding="utf-8") as handle:
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        os.fsync(handle.fileno())
    return before


def _respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    returns = latest_returns(messages)
    if "charge_card" in returns and "lookup_order" in returns:
        return ModelResponse(parts=[TextPart(f"done. charge: {returns['charge_card']}; {returns['lookup_order']}")])
    if "refund_order" in returns:
        return ModelResponse(
            parts=[
                ToolCallPart("charge_card", {"order_id": "A1", "amount": 50}, tool_call_id="call_charge"),
                ToolCallPart("lookup_order", {"order_id": "A1"}, tool_call_id="call_lookup"),
            ]
        )
    return ModelResponse(
        parts=[ToolCallPart("refund_order", {"order_id": "A1", "note": MARKUP}, tool_call_id="call_refund")]
    )


def factory(options: dict[str, Any]) -> Harness[Any]:
    workdir = Path(options["workdir"])
    block_seconds = float(options.get("block_seconds", 60.0))

    async def blocking_once(tool: str) -> None:
        if _record(workdir, tool) == 0:
            await asyncio.sleep(block_seconds)  # the test kills this process meanwhile

    def refund_order(order_id: str, note: str) -> str:
        """Refund an order (needs approval)."""
        return f"refunded {order_id}"

    async def charge_card(order_id: str, amount: int) -> str:
        """Charge the card again (not safe to repeat)."""
        await blocking_once("charge_card")
        return f"charged {amount} for {order_id}"

    async def lookup_order(order_id: str) -> str:
        """Read an order (safe to repeat)."""
        await blocking_once("lookup_order")
        return f"order {order_id} is open"

    agent = Agent(
        FunctionModel(_respond),
        tools=[Tool(refund_order, requires_approval=True), Tool(charge_card), recovery_retryable(Tool(lookup_order))],
    )
    return Harness(agent)
