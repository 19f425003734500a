"""Act 5 of the demo: reconcile before unknown, against an idempotent payment API.

`charge_card` sends every charge with an idempotency key, `call_key(ctx)`, to a fake payment API (a JSON file keyed
by that key, so a second process sees it). Its reconciler asks the API what became of the key. Three crashes:

* **charged, then killed** – a child process charges the card and is SIGKILLed before any result was saved; the
  parent resumes from the tool-boundary checkpoint: the reconciler finds the charge, the model gets its id.
* **killed before charging** – the worker dies right after saving the checkpoint; the reconciler finds nothing, so
  the call runs once more, with the same key.
* **killed before charging, the API down while reconciling** – the reconciler raises; the call gets the
  unknown-outcome result, exactly as without a reconciler (candor cannot know that nothing was charged).

Run it with the rest of the demo (`make demo`), or alone: `python -m examples.reconcile_demo`.
The child process: `python -m examples.reconcile_demo --child --api FILE --state FILE`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from pydantic_ai import Agent, RunContext
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from candor import BoundaryEvent, Harness, HarnessState, RunBindings, RunResult
from candor.tools import (
    RECOVERY_METADATA_KEY,
    UNKNOWN_OUTCOME_METADATA_KEY,
    NotDone,
    Reconciled,
    ReconcileRequest,
    call_key,
    reconciler_for,
)

REPO_ROOT = Path(__file__).resolve().parents[1]
PROMPT = "Please charge order A1 $40 for the replacement part."


class PaymentAPI:
    """A fake payment API that honours idempotency keys: one charge per key, however often it is asked.

    State lives in a JSON file so that a charge made by a process that then died is still there. `requests` counts
    every charge request, deduplicated or not.
    """

    def __init__(self, path: Path, *, down: bool = False) -> None:
        self.path = path
        self.down = down

    def _load(self) -> dict[str, Any]:
        if not self.path.exists():
            return {"charges": {}, "requests": 0}
        data: dict[str, Any] = json.loads(self.path.read_text(encoding="utf-8"))
        return data

    def _save(self, data: dict[str, Any]) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        with tmp.open("w", encoding="utf-8") as handle:
            json.dump(data, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, self.path)

    def charge(self, order_id: str, amount: int, *, idempotency_key: str) -> dict[str, Any]:
        data = self._load()
        data["requests"] += 1
        charges = data["charges"]
        if idempotency_key not in charges:
            charge_id = f"ch_{len(charges) + 1:04d}"
            charges[idempotency_key] = {"charge_id": charge_id, "order_id": order_id, "amount": amount}
        self._save(data)
        charge: dict[str, Any] = charges[idempotency_key]
        return charge

    def find(self, idempotency_key: str) -> dict[str, Any] | None:
        if self.down:
            raise ConnectionError("payment API unavailable")
        found: dict[str, Any] | None = self._load()["charges"].get(idempotency_key)
        return found

    @property
    def charges(self) -> list[dict[str, Any]]:
        return list(self._load()["charges"].values())

    @property
    def requests(self) -> int:
        return int(self._load()["requests"])


@dataclass
class Deps:
    api: PaymentAPI
    crash_after_charge: bool = False
    keys_sent: list[str] = field(default_factory=list)


async def charge_card(ctx: RunContext[Deps], order_id: str, amount: int) -> dict[str, Any]:
    """Charge the customer's card for an order (not retry-safe: it has a reconciler instead)."""
    key = call_key(ctx)  # the same on the first execution and on any rerun after a crash
    ctx.deps.keys_sent.append(key)
    charge = ctx.deps.api.charge(order_id, amount, idempotency_key=key)
    if ctx.deps.crash_after_charge:
        print(f"charged {charge['charge_id']} with key {key[:14]}…; now SIGKILL", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    return charge


@reconciler_for(charge_card)
def find_charge(request: ReconcileRequest) -> Reconciled | NotDone:
    """Ask the payment API what became of the call's key. An exception (API down) means "don't know"."""
    charge = request.deps.api.find(request.key)
    return NotDone() if charge is None else Reconciled(charge)


def _reply(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    returns = [p for p in messages[-1].parts if isinstance(p, ToolReturnPart)]
    if not returns:
        return ModelResponse(parts=[ToolCallPart("charge_card", {"order_id": "A1", "amount": 40}, tool_call_id="pay")])
    ret = returns[0]
    if ret.outcome == "interrupted":
        text = "I could not confirm the charge of $40 on order A1; I will check with billing before retrying."
    else:
        charge = cast("dict[str, Any]", ret.content)  # the tool returned the payment API's charge record
        text = f"Charged $40 on order A1 ({charge['charge_id']})."
    return ModelResponse(parts=[TextPart(text)])


def payment_agent() -> Agent[Deps, str]:
    return Agent(FunctionModel(_reply), deps_type=Deps, tools=[charge_card])


@dataclass(frozen=True, kw_only=True)
class Scenario:
    name: str
    saved: HarnessState
    result: RunResult[str]
    charges: list[dict[str, Any]]
    requests: int
    keys_sent: list[str]
    """Keys the tool sent in the resuming process (empty when it did not run there)."""
    crash_key: str | None
    """The key the dying child sent, read from its output (the first scenario only)."""

    @property
    def recovery_return(self) -> ToolReturnPart:
        part = self.result.new_messages()[0].parts[0]
        assert isinstance(part, ToolReturnPart)
        return part

    @property
    def recovery(self) -> str:
        metadata = self.recovery_return.metadata or {}
        if metadata.get(UNKNOWN_OUTCOME_METADATA_KEY) is True:
            return "unknown"
        return str(metadata.get(RECOVERY_METADATA_KEY))


async def _save_at_tool_boundary(harness: Harness[str], deps: Deps) -> HarnessState:
    """A worker that dies right after the tool-boundary checkpoint: nothing of the response ran."""
    async with harness.stream(PROMPT, bindings=RunBindings(deps=deps)) as stream:
        async for event in stream:
            if isinstance(event, BoundaryEvent) and event.kind == "tool":
                return HarnessState.model_validate_json((await stream.export_state()).model_dump_json())
    raise RuntimeError("the run never reached a tool boundary")


def _crash_child(api_file: Path, state_file: Path, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "examples.reconcile_demo",
            "--child",
            "--api",
            str(api_file),
            "--state",
            str(state_file),
        ],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


async def _child(api_file: Path, state_file: Path) -> None:
    """Save the checkpoint at the tool boundary (atomically), then let the tool charge and die."""
    harness = Harness(payment_agent())
    deps = Deps(api=PaymentAPI(api_file), crash_after_charge=True)
    async with harness.stream(PROMPT, bindings=RunBindings(deps=deps)) as stream:
        async for event in stream:
            if isinstance(event, BoundaryEvent) and event.kind == "tool":
                tmp = state_file.with_name(state_file.name + ".tmp")
                tmp.write_text((await stream.export_state()).model_dump_json(), encoding="utf-8")
                os.replace(tmp, state_file)


async def run_scenario(name: str, workdir: Path) -> Scenario:
    workdir.mkdir(parents=True, exist_ok=True)
    api_file, state_file = workdir / "payment-api.json", workdir / "checkpoint.json"
    for stale in (api_file, state_file):
        stale.unlink(missing_ok=True)
    harness = Harness(payment_agent())
    crash_key = None
    if name == "charged, then killed":
        child = _crash_child(api_file, state_file)
        if child.returncode != -signal.SIGKILL or not state_file.exists():
            raise RuntimeError(
                f"the child did not die as planned (rc={child.returncode}):\n{child.stdout}{child.stderr}"
            )
        saved = HarnessState.model_validate_json(state_file.read_text(encoding="utf-8"))
        crash_key = child.stdout.split("with key ")[1].split("…")[0]
    else:
        saved = await _save_at_tool_boundary(harness, Deps(api=PaymentAPI(api_file)))
    deps = Deps(api=PaymentAPI(api_file, down=name.endswith("API down")))
    result = await harness.run(previous_state=saved, bindings=RunBindings(deps=deps))
    api = PaymentAPI(api_file)
    return Scenario(
        name=name,
        saved=saved,
        result=result,
        charges=api.charges,
        requests=api.requests,
        keys_sent=deps.keys_sent,
        crash_key=crash_key,
    )


SCENARIOS = ("charged, then killed", "killed before charging", "killed before charging, API down")


async def act5(out_dir: Path, console: Console) -> dict[str, Scenario]:
    console.print(
        Text(
            "charge_card sends call_key(ctx) as its idempotency key; its reconciler, "
            "@reconciler_for(charge_card), asks the payment API about that key on recovery.",
            style="italic",
        )
    )
    scenarios = {name: await run_scenario(name, out_dir / f"act5-{index}") for index, name in enumerate(SCENARIOS, 1)}
    table = Table(title='recovery with a reconciler (tool_recovery="declared")', box=box.HEAVY_HEAD, show_lines=True)
    for column in ("crash", "reconciler said", "recovery", "model got", "charges at the API", "model's answer"):
        table.add_column(column, overflow="fold", max_width=34)
    said = {"reconciled": "found the charge", "rerun": "not done", "unknown": "(raised: API down)"}
    for scenario in scenarios.values():
        ret = scenario.recovery_return
        got = Text(f"{ret.outcome}: ", style="bold")
        got.append(str(ret.content["charge_id"]) if isinstance(ret.content, dict) else str(ret.content)[:48] + "…")
        table.add_row(
            scenario.name,
            said.get(scenario.recovery, scenario.recovery),
            Text(scenario.recovery, style="bold"),
            got,
            Text(f"{len(scenario.charges)} (requests: {scenario.requests})", style="bold green"),
            Text(str(scenario.result.output), style="cyan"),
        )
    console.print(table)
    first = scenarios[SCENARIOS[0]]
    key = first.recovery_return.metadata.get("candor.call_key") if first.recovery_return.metadata else None
    rerun = scenarios[SCENARIOS[1]]
    console.print(
        Text(
            f"The dying child sent key {first.crash_key}…; the parent's reconciler looked it up as "
            f"{str(key)[:14]}…: the same key, derived from thread id, issuing run id and tool_call_id "
            f'(docs/state-and-resume.md). After "not done" the rerun sent {rerun.keys_sent[0][:14]}…, '
            "the key it would have sent the first time: a charge that did go through cannot be repeated."
        )
    )
    return scenarios


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m examples.reconcile_demo", description=__doc__.splitlines()[0])
    parser.add_argument("--child", action="store_true", help="run as the worker that dies after charging")
    parser.add_argument("--api", type=Path, help="payment API file (child)")
    parser.add_argument("--state", type=Path, help="checkpoint file (child)")
    args = parser.parse_args(argv)
    if args.child:
        asyncio.run(_child(args.api, args.state))
        return 1  # only reached if the tool did not kill the process
    asyncio.run(act5(Path(tempfile.mkdtemp(prefix="candor-reconcile-")), Console(width=120)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
