"""Scripted demo agents: real `pydantic_ai.Agent`s whose model is a local function (no API key, no network).

The factories here are reusable: the demo, the tests and the service build agents from them. `support_agent()`
has a retry-safe read, a card charge that must not happen twice, a refund that needs approval and a question for
the user. Every tool execution appends one JSON line to a *ledger* file (`ledger_path`), so a reader can count
what really happened; a failpoint (`SupportDeps.crash_after`) lets the process die right after a tool's effect was
recorded and before its result was saved, which is the crash candor is built for.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import tempfile
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic_ai import Agent, CallDeferred, RunContext, Tool
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from candor import Harness
from candor.tools import UNKNOWN_OUTCOME_CONTENT, recovery_retryable

__all__ = (
    "AGENT_FACTORIES",
    "LEDGER_ENV",
    "CRASH_AFTER_ENV",
    "SupportDeps",
    "support_agent",
    "support_harness",
    "support_model",
    "ledger_path",
    "read_ledger",
    "count_ledger",
)

LEDGER_ENV = "CANDOR_DEMO_LEDGER"
CRASH_AFTER_ENV = "CANDOR_DEMO_CRASH_AFTER"
SUPPORT_INSTRUCTIONS = "You are Candor Support, a scripted demo agent. Be brief; never charge a card twice."


@dataclass(frozen=True)
class SupportDeps:
    """Run-local dependencies of the support agent (pass them as `RunBindings(deps=...)`).

    `SupportDeps(crash_after="charge_card")` (or `CANDOR_DEMO_CRASH_AFTER=charge_card`) makes that tool write its
    ledger line and then `SIGKILL` its own process: the effect happened but no result was ever saved."""

    ledger_path: Path | str | None = None
    """Where tool effects are recorded (JSON lines). `None`: `$CANDOR_DEMO_LEDGER`, else a temp-dir default."""
    crash_after: str | None = None
    """Failpoint: the name of a tool after whose ledger write the process kills itself with SIGKILL."""


# ------------------------------------------------------------------------------------------------ the ledger


def ledger_path(deps: Any = None) -> Path:
    """The ledger file for these deps: `deps.ledger_path`, else `$CANDOR_DEMO_LEDGER`, else a temp-dir default."""
    configured = getattr(deps, "ledger_path", None)
    if configured:
        return Path(configured)
    if os.environ.get(LEDGER_ENV):
        return Path(os.environ[LEDGER_ENV])
    return Path(tempfile.gettempdir()) / "candor-demo-ledger.jsonl"


def read_ledger(path: Path | str) -> list[dict[str, Any]]:
    """Every entry of a ledger file, oldest first (an absent file is an empty ledger)."""
    path = Path(path)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def count_ledger(path: Path | str, tool: str) -> int:
    """How many times `tool` really ran, according to the ledger."""
    return sum(1 for entry in read_ledger(path) if entry.get("tool") == tool)


def _record(ctx: RunContext[Any], entry: dict[str, Any]) -> None:
    """Append one line to the ledger and make sure it reached the OS before anything else happens."""
    path = ledger_path(ctx.deps)
    path.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps({**entry, "pid": os.getpid()}, sort_keys=True)
    with path.open("a", encoding="utf-8") as handle:
        handle.write(line + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    crash_after = getattr(ctx.deps, "crash_after", None) or os.environ.get(CRASH_AFTER_ENV)
    if crash_after == entry["tool"]:
        # The effect is on record, the tool's result is not: die the hard way, no cleanup, no final save.
        print(f"[failpoint] {entry['tool']} recorded its effect; killing pid {os.getpid()} with SIGKILL", flush=True)
        sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGKILL)


# ------------------------------------------------------------------------------------------------ the tools


async def lookup_order(ctx: RunContext[Any], order_id: str) -> dict[str, Any]:
    """Read the order record: its status and the charges and refunds on file. Has no effect."""
    entries = [e for e in read_ledger(ledger_path(ctx.deps)) if e.get("order_id") == order_id]
    charges = [{"charge_id": e["charge_id"], "amount": e["amount"]} for e in entries if e["tool"] == "charge_card"]
    refunds = [{"refund_id": e["refund_id"], "amount": e["amount"]} for e in entries if e["tool"] == "refund_order"]
    _record(ctx, {"tool": "lookup_order", "order_id": order_id})
    return {
        "order_id": order_id,
        "status": "paid" if charges else "awaiting payment",
        "charges": charges,
        "refunds": refunds,
    }


async def charge_card(ctx: RunContext[Any], order_id: str, amount: int) -> dict[str, Any]:
    """Charge the customer's card for an order. Not safe to repeat: every call moves money."""
    charge_id = "ch_" + uuid.uuid4().hex[:8]
    _record(ctx, {"tool": "charge_card", "order_id": order_id, "amount": amount, "charge_id": charge_id})
    return {"charge_id": charge_id, "order_id": order_id, "amount": amount, "status": "captured"}


async def refund_order(ctx: RunContext[Any], order_id: str, amount: int) -> dict[str, Any]:
    """Refund part of an order. Needs a person's approval before it runs."""
    refund_id = "rf_" + uuid.uuid4().hex[:8]
    _record(ctx, {"tool": "refund_order", "order_id": order_id, "amount": amount, "refund_id": refund_id})
    return {"refund_id": refund_id, "order_id": order_id, "amount": amount}


async def ask_user(question: str) -> str:
    """Ask the user a question; the run suspends until the host supplies the answer."""
    raise CallDeferred(metadata={"question": question}, kind="question")


def support_tools() -> list[Tool[Any]]:
    """The support agent's tools, with their candor declarations."""
    return [
        recovery_retryable(lookup_order),  # a read: safe to run again after a crash
        Tool(charge_card, sequential=True),  # an effect: never replayed under "declared"
        Tool(refund_order, requires_approval=True),  # an effect that a person must approve
        Tool(ask_user),  # a question for the user (CallDeferred(kind="question"))
    ]


# ----------------------------------------------------------------------------------------- the scripted model

_NAME = re.compile(r"\b(?:my name is|call me)\s+([A-Z][a-zA-Z]+)", re.IGNORECASE)
_CHARGE = re.compile(r"\bcharge\b.*?\border\s+([A-Za-z0-9]+).*?\$?(\d+)", re.IGNORECASE)
_REFUND = re.compile(r"order\s+([A-Za-z0-9]+)\s*\(\$?(\d+)\)", re.IGNORECASE)
REFUND_QUESTION = "Should the refund go back to the card, or become store credit?"


def support_model() -> FunctionModel:
    """The scripted model behind `support_agent()`: it reads the conversation like an LLM would and answers.

    It decides from what a provider would send a real model (prompts, tool-return content and outcomes),
    never from metadata, which candor never sends to the model.
    """
    return FunctionModel(_support_reply, model_name="scripted-support")


def _support_reply(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    last = messages[-1]
    returns = [p for p in last.parts if isinstance(p, ToolReturnPart)] if isinstance(last, ModelRequest) else []
    turn = sum(1 for m in messages if isinstance(m, ModelResponse)) + 1
    if returns:
        return ModelResponse(parts=[TextPart(_summarize(returns, _calls_by_id(messages)))])
    prompt = _latest_prompt(last)
    if match := _CHARGE.search(prompt):
        order_id, amount = match.group(1), int(match.group(2))
        return ModelResponse(
            parts=[
                ToolCallPart("lookup_order", {"order_id": order_id}, tool_call_id=f"lookup_{turn}"),
                ToolCallPart("charge_card", {"order_id": order_id, "amount": amount}, tool_call_id=f"charge_{turn}"),
            ]
        )
    if "refund" in prompt.lower() and (orders := _REFUND.findall(prompt)):
        parts: list[Any] = [
            ToolCallPart(
                "refund_order",
                {"order_id": order_id, "amount": int(amount)},
                tool_call_id=f"refund_{order_id.lower()}_{turn}",
            )
            for order_id, amount in orders
        ]
        parts.append(ToolCallPart("ask_user", {"question": REFUND_QUESTION}, tool_call_id=f"ask_{turn}"))
        return ModelResponse(parts=parts)
    return ModelResponse(parts=[TextPart(_chat(prompt, messages))])


def _latest_prompt(message: ModelMessage) -> str:
    if not isinstance(message, ModelRequest):
        return ""
    texts = [p.content for p in message.parts if isinstance(p, UserPromptPart) and isinstance(p.content, str)]
    return texts[-1] if texts else ""


def _calls_by_id(messages: list[ModelMessage]) -> dict[str, ToolCallPart]:
    calls: dict[str, ToolCallPart] = {}
    for message in messages:
        if isinstance(message, ModelResponse):
            calls.update({c.tool_call_id: c for c in message.parts if isinstance(c, ToolCallPart)})
    return calls


def _chat(prompt: str, messages: list[ModelMessage]) -> str:
    seen = f"(history: {len(messages) - 1} earlier message(s))"
    names = [
        m.group(1)
        for msg in messages
        for p in getattr(msg, "parts", [])
        if isinstance(p, UserPromptPart) and isinstance(p.content, str)
        for m in _NAME.finditer(p.content)
    ]
    if _NAME.search(prompt):
        return f"Nice to meet you, {names[-1]}. {seen}"
    if "my name" in prompt.lower():
        if names:
            return f"Your name is {names[-1]}. {seen}"
        return "I don't know your name yet."
    return f"You said: {prompt!r}. {seen}"


def _was_interrupted(ret: ToolReturnPart) -> bool:
    """What a model can tell from a return: its outcome and its text (candor's metadata is never sent)."""
    return ret.outcome == "interrupted" or ret.content == UNKNOWN_OUTCOME_CONTENT


def _summarize(returns: list[ToolReturnPart], calls: dict[str, ToolCallPart]) -> str:
    by_tool: dict[str, list[ToolReturnPart]] = {}
    for ret in returns:
        by_tool.setdefault(ret.tool_name, []).append(ret)
    sentences: list[str] = []
    lookup = next((r for r in by_tool.get("lookup_order", []) if r.outcome == "success"), None)
    record = lookup.content if lookup is not None and isinstance(lookup.content, dict) else None

    for ret in by_tool.get("charge_card", []):
        args = calls[ret.tool_call_id].args_as_dict() if ret.tool_call_id in calls else {}
        what = f"the charge of ${args.get('amount', '?')} on order {args.get('order_id', '?')}"
        if _was_interrupted(ret):
            sentences.append(f"I could not confirm {what}; let me check before retrying.")
            if record is not None and record["charges"]:
                n = len(record["charges"])
                sentences.append(f"The order record already lists {n} charge(s), so I will not charge the card again.")
            elif record is not None:
                sentences.append("The order record shows no charge yet; say 'retry' and I will charge it.")
            else:
                sentences.append(
                    "I could not read the order record either, so I will not charge again until someone checks it."
                )
        elif ret.outcome == "success" and isinstance(ret.content, dict):
            sentences.append(
                f"Charged ${ret.content['amount']} on order {ret.content['order_id']} ({ret.content['charge_id']})."
            )
            if record is not None and record["charges"]:
                sentences.append(
                    f"Warning: the order record already listed {len(record['charges'])} earlier "
                    "charge(s) - this may be a double charge."
                )
        else:
            sentences.append(f"Charging failed ({ret.outcome}): {ret.model_response_str()}")

    for ret in by_tool.get("refund_order", []):
        args = calls[ret.tool_call_id].args_as_dict() if ret.tool_call_id in calls else {}
        order = args.get("order_id", "?")
        if ret.outcome == "success" and isinstance(ret.content, dict):
            sentences.append(
                f"Refunded ${ret.content['amount']} on order {ret.content['order_id']} ({ret.content['refund_id']})."
            )
        elif ret.outcome == "denied":
            sentences.append(f"I did not refund order {order}: {ret.model_response_str()}")
        elif _was_interrupted(ret):
            sentences.append(f"I could not confirm the refund on order {order}; let me check before retrying.")
        else:
            sentences.append(f"The refund on order {order} failed: {ret.model_response_str()}")

    for ret in by_tool.get("ask_user", []):
        if ret.outcome == "success":
            sentences.append(f"You answered: {ret.model_response_str()}")
        else:
            sentences.append(f"You did not answer my question ({ret.model_response_str()}).")

    if not sentences and record is not None:
        sentences.append(f"Order {record['order_id']} is {record['status']}.")
    for tool_name, rets in by_tool.items():
        if tool_name not in {"charge_card", "refund_order", "ask_user", "lookup_order"}:
            sentences.extend(f"{tool_name}: {r.outcome}" for r in rets)
    return " ".join(sentences) or "Done."


# ------------------------------------------------------------------------------------------------ factories


def support_agent(*, model: Any = None) -> Agent[Any, str]:
    """A customer-support agent driven by the scripted model (or by `model`, e.g. a real one).

    Its four tools:

    * `lookup_order(order_id)` — reads the order record (the ledger). Marked retry-safe with `recovery_retryable`,
      so after a crash candor may run it again.
    * `charge_card(order_id, amount)` — charges the card: an effect that must not happen twice. Not retry-safe.
      Declared `sequential=True` (it runs alone; tools the model asked for before it finish first).
    * `refund_order(order_id, amount)` — `requires_approval=True`: the run suspends until a person approves it.
    * `ask_user(question)` — raises `CallDeferred(kind="question")`: the run suspends until the user answers.
    """
    return Agent(
        model if model is not None else support_model(),
        name="support",
        instructions=SUPPORT_INSTRUCTIONS,
        deps_type=SupportDeps,
        tools=support_tools(),
    )


def support_harness(options: dict[str, Any] | None = None) -> Harness[str]:
    """A fresh `Harness` around a fresh `support_agent()`, in the `(options) -> Harness` factory shape.

    No option is used yet. Tool effects go to the ledger named by `$CANDOR_DEMO_LEDGER` unless the run's
    `RunBindings(deps=SupportDeps(...))` names another one.
    """
    return Harness(support_agent())


AGENT_FACTORIES: dict[str, Callable[[], Agent[Any, str]]] = {"support": support_agent}
"""Name → factory of the agents this module offers (what a host can register as defaults)."""
