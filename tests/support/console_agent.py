"""The scripted agent the console tests configure in a real `candor serve` (`console_agent:factory`).

Its `FunctionModel` answers, from the history:

1. first turn: three calls in one response — `refund_order` and `delete_file`, both needing approval, and
   `ask_currency`, a question (`CallDeferred(kind="question")`) → the run ends `waiting` with three pending items;
2. once all three have results: a final text naming each result, so a test sees what the answers did (the
   refund's amount shows whether the arguments were edited, the deletion whether it was denied).
"""

from __future__ import annotations

from typing import Any

from pydantic_ai import Agent, CallDeferred, Tool
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from candor import Harness

from serve_agents import latest_returns

__all__ = ("FACTORY", "factory")

FACTORY = f"{__name__}:factory"
TOOLS = ("refund_order", "delete_file", "ask_currency")


def _respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    returns = latest_returns(messages)
    if all(tool in returns for tool in TOOLS):
        summary = "; ".join(f"{tool}: {returns[tool]}" for tool in TOOLS)
        return ModelResponse(parts=[TextPart(f"done. {summary}")])
    return ModelResponse(
        parts=[
            ToolCallPart("refund_order", {"order_id": "A1", "amount": 50}, tool_call_id="call_refund_a1"),
            ToolCallPart("delete_file", {"path": "old.log"}, tool_call_id="call_delete_log"),
            ToolCallPart("ask_currency", {"question": "Which currency?"}, tool_call_id="call_currency"),
        ]
    )


def refund_order(order_id: str, amount: int) -> str:
    """Refund an order (needs approval)."""
    return f"refunded {amount} on {order_id}"


def delete_file(path: str) -> str:
    """Delete a file (needs approval)."""
    return f"deleted {path}"


def ask_currency(question: str) -> str:
    """Ask the person a question."""
    raise CallDeferred({"question": question}, kind="question")


def factory(options: dict[str, Any]) -> Harness[Any]:
    agent = Agent(
        FunctionModel(_respond),
        tools=[
            Tool(refund_order, requires_approval=True),
            Tool(delete_file, requires_approval=True),
            Tool(ask_currency),
        ],
    )
    return Harness(agent)
