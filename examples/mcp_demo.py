"""Act 6 of the demo: MCP tool annotations decide what runs again after a crash (docs/mcp.md).

The agent gets its tools from an MCP server (`examples.mcp_orders_server`, over stdio) through
`candor.mcp.mcp_stdio(...)`. Its model calls five tools in one response; a child process is SIGKILLed while all
five are running (each has written its ledger line). The parent continues from the tool-boundary checkpoint under
`tool_recovery="declared"`: the calls of tools annotated `readOnlyHint` or `idempotentHint` (and not
`destructiveHint`) run again, the others get the unknown-outcome result; the operator's `retry_safe=["send_receipt"]`
adds one. Then the same checkpoint with the server down: the run fails `tool_unavailable`, nothing is closed.

Run it with the rest of the demo (`make demo`), or alone: `python -m examples.mcp_demo`.
The child process: `python -m examples.mcp_demo --child --workdir DIR`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from candor import BoundaryEvent, Harness, HarnessState, RunResult

REPO_ROOT = Path(__file__).resolve().parents[1]
TOOLS = ("lookup_order", "set_shipping_address", "cancel_order", "charge_card", "send_receipt")
ANNOTATIONS = {
    "lookup_order": "readOnlyHint",
    "set_shipping_address": "idempotentHint",
    "cancel_order": "idempotentHint, destructiveHint",
    "charge_card": "(none)",
    "send_receipt": "(none)",
}
OPERATOR_RETRY_SAFE = ("send_receipt",)


def mcp_available() -> bool:
    """The act needs the `mcp` extra (installed by `make demo`)."""
    import importlib.util

    return importlib.util.find_spec("fastmcp") is not None and importlib.util.find_spec("mcp") is not None


def orders_agent(workdir: Path, *, server_down: bool = False) -> Agent[Any, str]:
    from candor.mcp import mcp_stdio

    env = {"ORDERS_LEDGER": str(workdir / "ledger.txt"), "ORDERS_HOLD": str(workdir / "hold")}
    if server_down:  # a command that exits at once: the server never answers
        toolset = mcp_stdio(sys.executable, ["-c", "raise SystemExit(1)"], server="orders", timeout=10)
    else:
        toolset = mcp_stdio(
            sys.executable,
            ["-m", "examples.mcp_orders_server"],
            server="orders",
            env=env,
            cwd=str(REPO_ROOT),
            retry_safe=OPERATOR_RETRY_SAFE,
            timeout=30,
        )

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if not any(isinstance(m, ModelResponse) for m in messages):
            return ModelResponse(parts=[ToolCallPart(t, {"order_id": "A1"}, tool_call_id=f"c_{t}") for t in TOOLS])
        return ModelResponse(parts=[TextPart("Order A1 is handled; I checked what may not have gone through.")])

    return Agent(FunctionModel(respond), toolsets=[toolset])


def ledger(workdir: Path) -> list[str]:
    path = workdir / "ledger.txt"
    return path.read_text(encoding="utf-8").splitlines() if path.exists() else []


async def _child(workdir: Path) -> None:
    """Save the checkpoint at every boundary (atomically) while the calls run; the parent kills this process."""
    async with Harness(orders_agent(workdir)).stream("Ship order A1, charge it, send the receipt.") as stream:
        async for event in stream:
            if isinstance(event, BoundaryEvent):
                tmp = workdir / "checkpoint.json.tmp"
                tmp.write_text((await stream.export_state()).model_dump_json(), encoding="utf-8")
                os.replace(tmp, workdir / "checkpoint.json")


def _kill_mid_calls(workdir: Path, timeout: float = 60) -> None:
    """Run the child until all five calls have had their effect, then SIGKILL it with its server."""
    (workdir / "hold").write_text("")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    args = [sys.executable, "-m", "examples.mcp_demo", "--child", "--workdir", str(workdir)]
    child = subprocess.Popen(args, cwd=REPO_ROOT, env=env, stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + timeout
        while len(ledger(workdir)) < len(TOOLS) and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        if len(ledger(workdir)) < len(TOOLS):
            raise RuntimeError(f"the child did not reach the calls: {child.stderr.read().decode()[-2000:]}")  # type: ignore[union-attr]
    finally:
        os.killpg(child.pid, signal.SIGKILL)  # the worker and its stdio server die together, as with the machine
        child.wait()
        (workdir / "hold").unlink(missing_ok=True)


@dataclass
class Act6Facts:
    saved: HarnessState
    recovered: RunResult[str]
    down: RunResult[str]
    ledger_after_crash: list[str]
    ledger_after_recovery: list[str]

    def answer(self, tool: str) -> ToolReturnPart:
        (part,) = [
            p
            for m in self.recovered.new_messages()
            for p in getattr(m, "parts", ())
            if isinstance(p, ToolReturnPart) and p.tool_call_id == f"c_{tool}"
        ]
        return part

    def basis(self, tool: str) -> dict[str, Any]:
        state = self.recovered.state
        assert state is not None  # a finished run carries its state
        data = state.capabilities["candor.recovery"].data
        assert isinstance(data, dict)
        calls = data["calls"]
        assert isinstance(calls, dict)
        basis = calls[f"c_{tool}"]
        assert isinstance(basis, dict)
        return basis


async def act6(out_dir: Path, console: Console) -> Act6Facts | None:
    if not mcp_available():
        console.print(Text('skipped: needs the "mcp" extra (pip install "candor[mcp]")', style="yellow"))
        return None
    workdir = out_dir / "act6"
    workdir.mkdir(parents=True, exist_ok=True)
    _kill_mid_calls(workdir)
    after_crash = ledger(workdir)
    saved = HarnessState.model_validate_json((workdir / "checkpoint.json").read_text(encoding="utf-8"))
    down = await Harness(orders_agent(workdir, server_down=True)).run(previous_state=saved)
    recovered = await Harness(orders_agent(workdir)).run(previous_state=saved)
    facts = Act6Facts(saved, recovered, down, after_crash, ledger(workdir))

    table = Table(title='after kill -9 mid-call (tool_recovery="declared")', box=box.HEAVY_HEAD)
    for column in ("tool", "MCP annotations", "declared by", "after the crash", "ran"):
        table.add_column(column)
    for tool in TOOLS:
        basis = facts.basis(tool)
        rerun = basis["action"] == "replay"
        table.add_row(
            tool,
            ANNOTATIONS[tool] + (" + operator retry_safe" if tool in OPERATOR_RETRY_SAFE else ""),
            basis["declared_by"],
            Text("ran again" if rerun else "unknown outcome", style="green" if rerun else "magenta"),
            f"{facts.ledger_after_recovery.count(f'{tool} A1')}×",
        )
    console.print(table)
    failure = down.failure
    console.print(
        Text(
            f"With the server down the same checkpoint fails {failure.code if failure else '?'} "
            f"(retry_hint {failure.retry_hint if failure else '?'}): the service retries the attempt with backoff "
            "from its checkpoint, where the calls are still open.\n"
            f"model: {recovered.output}",
        )
    )
    return facts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m examples.mcp_demo", description=__doc__.splitlines()[0])
    parser.add_argument("--child", action="store_true", help="run as the worker that is killed mid-call")
    parser.add_argument("--workdir", type=Path, help="ledger and checkpoint directory (child)")
    args = parser.parse_args(argv)
    if args.child:
        asyncio.run(_child(args.workdir))
        return 1  # only reached if the process was not killed
    asyncio.run(act6(Path(tempfile.mkdtemp(prefix="candor-mcp-")), Console(width=120)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
