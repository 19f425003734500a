"""Shared pieces of the service's MCP tests: an agent whose scripted model calls one MCP tool (named by
`options["tool"]`) and then answers "done", and settings giving it the tests' tool server (`tests/support/tool_server.py`).

The server's tools come from `[agents.mcp.mcp.bank]`: the agent itself has none (docs/mcp.md).
"""

from __future__ import annotations

import asyncio
import secrets
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from candor import Harness
from candor.service.agents import AgentRegistry
from candor.service.core import Service
from candor.service.runtime import SeededEntropy
from candor.service.settings import ServiceSettings

AGENT = "mcp"
FACTORY = f"{__name__}:factory"
CALL_ID = "call_1"


def factory(options: dict[str, Any]) -> Harness[Any]:
    tool = str(options.get("tool", "read_balance"))

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if not any(isinstance(m, ModelResponse) for m in messages):
            return ModelResponse(parts=[ToolCallPart(tool, {"account": "acme"}, tool_call_id=CALL_ID)])
        return ModelResponse(parts=[TextPart("done")])

    return Harness(Agent(FunctionModel(respond)))


def mcp_settings(
    db_url: str, mcp_url: str, *, lease_seconds: float = 10, max_attempts: int = 3, **server: Any
) -> ServiceSettings:
    """`[agents.mcp]` with the tool server at `mcp_url` as `bank`; `server` adds `retry_safe` / `never_retry`."""
    return ServiceSettings(
        database={"url": db_url, "timeout": 5.0},  # roomy: the test machine is shared and often loaded
        worker={
            "lease_seconds": lease_seconds,
            "authority_seconds": lease_seconds / 6,
            "scan_seconds": 0.05,
            "max_attempts": max_attempts,
        },
        agents={AGENT: {"factory": FACTORY, "mcp": {"bank": {"url": mcp_url, "timeout": 20, **server}}}},
    )


def mcp_service(db: Any, mcp_url: str, **settings: Any) -> Service:
    values = mcp_settings(db.url, mcp_url, **settings)
    agents = AgentRegistry.from_settings(values.agents)
    # As `candor serve` does (S-56): the factory and the MCP client libraries are imported here, not by the first
    # attempt on the event loop, where a multi-second import on a loaded machine starves the lease heartbeat.
    agents.check_all()
    return Service(
        settings=values,
        engine=db.engine,
        agents=agents,
        entropy=SeededEntropy(secrets.randbits(32)),
        wakeups=asyncio.Event(),
    )
