"""The agent of the provider tests (`model_provider.agents:factory`): tools and instructions, no model of its own.

The model is the service's `[agents.assistant.model]` (an OpenAI chat model pointed at `ScriptedOpenAI`), bound to
every run. `charge_card` is not retry-safe; each execution appends `<PROVIDER_WORKER> <tool_call_id> <amount>` to
`<options["workdir"]>/charge.txt` (fsynced), the side-effect ledger of the crash tests. With
`options["charge_seconds"]`, the tool sleeps that long after charging (a window to kill the worker in).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from pydantic_ai import Agent, RunContext, Tool

from candor import Harness

__all__ = ("FACTORY", "AGENT", "WORKER_ENV", "factory", "charges")

FACTORY = f"{__name__}:factory"
AGENT = "assistant"
WORKER_ENV = "PROVIDER_WORKER"


def charges(workdir: Path) -> list[str]:
    path = workdir / "charge.txt"
    return path.read_text(encoding="utf-8").splitlines() if path.exists() else []


def factory(options: dict[str, Any]) -> Harness[Any]:
    workdir = options.get("workdir")
    pause = float(options.get("charge_seconds", 0))

    async def charge_card(ctx: RunContext[Any], amount: int) -> str:
        """Charge the customer's card (not safe to repeat)."""
        if workdir is not None:
            with open(Path(workdir) / "charge.txt", "a", encoding="utf-8") as ledger:
                ledger.write(f"{os.environ.get(WORKER_ENV, 'inproc')} {ctx.tool_call_id} {amount}\n")
                ledger.flush()
                os.fsync(ledger.fileno())
        if pause:
            await asyncio.sleep(pause)
        return f"charged {amount}"

    return Harness(Agent(instructions="You are a billing assistant.", tools=[Tool(charge_card)]))
