"""Child process of `test_crash_process.py`: a host that checkpoints at every boundary and dies inside a tool.

Run as `python _crash_child.py WORKDIR`. The host streams one run, writes the exported state to
`WORKDIR/state.json` at every `BoundaryEvent` (atomically: temporary file, fsync, `os.replace`) and logs the
boundary kinds to `WORKDIR/boundaries.log`. The model asks for two calls in one response: `charge` (not
retry-safe) appends a line to `WORKDIR/ledger.txt` and then SIGKILLs its own process before it can return;
`lookup` (retry-safe) appends a line to `WORKDIR/lookups-<role>.txt`.

The parent imports `build_agent` from this file to rebuild the same tools in its own process.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path
from typing import Any

from pydantic_ai import Agent, RunContext, Tool
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from candor import BoundaryEvent, Harness
from candor.tools import recovery_retryable

LEDGER = "ledger.txt"
STATE = "state.json"
BOUNDARIES = "boundaries.log"


def _append(path: Path, line: str) -> None:
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(line + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def build_agent(workdir: Path, *, role: str, die_in_charge: bool) -> tuple[Agent[Any, Any], list[list[ModelMessage]]]:
    """The agent both processes use; returns it with the list of message lists its model was sent."""
    seen: list[list[ModelMessage]] = []

    async def charge(ctx: RunContext[Any], amount: int) -> str:
        """Charge the customer's card (an external effect; not safe to repeat)."""
        _append(workdir / LEDGER, f"{role} {ctx.tool_call_id} charge {amount}")
        if die_in_charge:
            os.kill(os.getpid(), signal.SIGKILL)  # the effect happened; its result is never recorded
        return f"charged {amount}"

    async def lookup(ctx: RunContext[Any], account: str) -> str:
        """Read an account balance (safe to repeat)."""
        _append(workdir / f"lookups-{role}.txt", f"{ctx.tool_call_id} {account} approved={ctx.tool_call_approved}")
        return f"balance of {account}: 10"

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        seen.append(list(messages))
        if not any(isinstance(m, ModelResponse) for m in messages):
            return ModelResponse(
                parts=[
                    ToolCallPart("charge", {"amount": 42}, tool_call_id="call_charge"),
                    ToolCallPart("lookup", {"account": "acme"}, tool_call_id="call_lookup"),
                ]
            )
        return ModelResponse(parts=[TextPart("done")])

    agent = Agent(FunctionModel(respond), tools=[Tool(charge), recovery_retryable(Tool(lookup))])
    return agent, seen


def save_atomically(path: Path, payload: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(payload)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


async def host(workdir: Path) -> None:
    agent, _ = build_agent(workdir, role="child", die_in_charge=True)
    harness = Harness(agent)
    stream = harness.stream("charge the customer and check the balance")
    async with stream:
        async for event in stream:
            if isinstance(event, BoundaryEvent):
                state = await stream.export_state()
                save_atomically(workdir / STATE, state.model_dump_json())
                _append(workdir / BOUNDARIES, f"{event.index} {event.kind} {event.message_count}")


if __name__ == "__main__":
    asyncio.run(host(Path(sys.argv[1])))
    sys.exit(3)  # reaching this line means the crash did not happen
