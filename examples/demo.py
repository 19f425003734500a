"""The candor demo: `python -m examples.demo` (or `make demo`). No API key, no network.

Six acts; the first three with the scripted support agent of `examples.agents`:

1. Continue and fork — two turns on one thread, the state saved to JSON, loaded back, forked, continued.
2. A crash mid-tool — a child process is SIGKILLed right after `charge_card` charged the card; the parent resumes
   from the last checkpoint under each `tool_recovery` mode and shows what the model was told.
3. Human in the loop — an approval and a user question suspend the run; a bad batch is rejected; the answers
   (an edited approval, a denial, an answer) are applied and the run finishes.
4. The same crash, hosted by the service (`examples.service_demo`).
5. Reconcile before unknown — `charge_card` with a reconciler against an idempotent payment API
   (`examples.reconcile_demo`): a charge made before a SIGKILL is found, a charge never made runs once.
6. MCP annotations decide what runs again — tools from an MCP server over stdio (`examples.mcp_demo`): after a
   SIGKILL mid-call, the read-only and idempotent calls run again, the others get the unknown outcome.

Each act is an importable coroutine (`act1`, `act2`, `act3`) returning the facts it demonstrated; the tests use them.
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
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter
from pydantic_ai import DeferredToolRequests, DeferredToolResults, ToolApproved, ToolDenied
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from rich import box
from rich.console import Console, Group
from rich.panel import Panel
from rich.rule import Rule
from rich.table import Table
from rich.text import Text

from candor import DeferredToolResume, Harness, HarnessState, RunBindings, RunResult
from candor.errors import RunError
from candor.tools import UNKNOWN_OUTCOME_METADATA_KEY

from .agents import SupportDeps, read_ledger, support_agent

REPO_ROOT = Path(__file__).resolve().parents[1]
MODES = ("declared", "never", "always")
CHARGE_PROMPT = "Please charge order A1 $40 for the replacement part."
REFUND_PROMPT = "Refund order A1 ($50) and order B2 ($500), please."
_requests_adapter: TypeAdapter[DeferredToolRequests] = TypeAdapter(DeferredToolRequests)


# ------------------------------------------------------------------------------------------------ rendering


def _short(value: Any, limit: int = 90) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def is_unknown_outcome(part: ToolReturnPart) -> bool:
    return isinstance(part.metadata, dict) and part.metadata.get(UNKNOWN_OUTCOME_METADATA_KEY) is True


def describe_return(part: ToolReturnPart | None, limit: int = 70) -> Text:
    """One line for a tool return, as the model saw it (outcome + content), with candor's marker noted."""
    if part is None:
        return Text("(no return)", style="dim")
    style = {"success": "green", "denied": "yellow", "failed": "red", "interrupted": "magenta"}.get(part.outcome, "")
    text = Text(f"{part.outcome}", style=f"bold {style}")
    if is_unknown_outcome(part):
        text.append(" (unknown outcome)", style="magenta")
    text.append(": " + _short(part.content, limit))
    return text


def history_table(messages: list[ModelMessage], title: str, *, start: int = 0) -> Table:
    """Messages as a table: what was said, which tools were called, what came back."""
    table = Table(title=title, box=box.SIMPLE_HEAD, title_justify="left", expand=False)
    table.add_column("#", justify="right", style="dim")
    table.add_column("message")
    table.add_column("part")
    table.add_column("content", overflow="fold")
    for index, message in enumerate(messages, start=start):
        kind = "request →" if isinstance(message, ModelRequest) else "← response"
        for part in message.parts:
            if isinstance(part, UserPromptPart):
                table.add_row(str(index), kind, "user", Text(_short(part.content)))
            elif isinstance(part, TextPart):
                table.add_row(str(index), kind, "text", Text(_short(part.content, 200), style="cyan"))
            elif isinstance(part, ToolCallPart):
                table.add_row(
                    str(index),
                    kind,
                    Text(f"call {part.tool_call_id}"),
                    Text(f"{part.tool_name}({_short(part.args_as_dict(), 60)})"),
                )
            elif isinstance(part, ToolReturnPart):
                table.add_row(str(index), kind, Text(f"return {part.tool_call_id}"), describe_return(part, 90))
            else:
                continue
            kind = ""
    return table


def ledger_table(source: Path | list[dict[str, Any]], title: str = "ledger (what really happened)") -> Table:
    """The ledger file (or a snapshot of its entries) as a table."""
    table = Table(title=title, box=box.SIMPLE_HEAD, title_justify="left")
    for column in ("#", "tool", "order", "amount", "id", "pid"):
        table.add_column(column)
    entries = read_ledger(source) if isinstance(source, Path) else source
    for index, entry in enumerate(entries, start=1):
        table.add_row(
            str(index),
            entry["tool"],
            entry.get("order_id", ""),
            str(entry.get("amount", "")),
            entry.get("charge_id", entry.get("refund_id", "")),
            str(entry.get("pid", "")),
        )
    if not entries:
        table.add_row("-", "(empty)", "", "", "", "")
    return table


def _returns(messages: list[ModelMessage]) -> dict[str, ToolReturnPart]:
    """tool_name → the last return for it among `messages`."""
    found: dict[str, ToolReturnPart] = {}
    for message in messages:
        if isinstance(message, ModelRequest):
            found.update({p.tool_name: p for p in message.parts if isinstance(p, ToolReturnPart)})
    return found


def _canonical(messages: Any) -> bytes:
    return ModelMessagesTypeAdapter.dump_json(list(messages))


def _act_header(console: Console, number: int, title: str, subtitle: str) -> None:
    console.print()
    console.print(Rule(Text(f"Act {number}: {title}", style="bold")))
    console.print(Text(subtitle, style="italic"))


# ------------------------------------------------------------------------------------ act 1: continue and fork


@dataclass
class Act1Facts:
    thread_id: str
    fork_thread_id: str
    run_ids: list[str]
    state_file: Path
    loaded_equals_saved: bool
    shared_prefix: int
    original_answer: str
    fork_answer: str
    statuses: list[str]


async def act1(out_dir: Path, console: Console) -> Act1Facts:
    """Continue a thread, save it as JSON, load it back, fork it and continue both (H-5, H-7, H-8, H-9, H-10)."""
    _act_header(
        console,
        1,
        "Continue and fork",
        "A thread is just a HarnessState value: continue it, store it as JSON, load it elsewhere, fork it.",
    )
    harness = Harness(support_agent())
    rows: list[tuple[str, RunResult[str], str]] = []

    first = await harness.run("Hi, my name is Ada.")
    rows.append(("turn 1", first, "Hi, my name is Ada."))
    second = await harness.run("What is my name?", previous_state=first.state)
    rows.append(("turn 2 (continue)", second, "What is my name?"))

    assert second.state is not None
    state_file = out_dir / "act1-thread.json"
    state_file.write_text(second.state.model_dump_json(), encoding="utf-8")
    loaded = HarnessState.model_validate_json(state_file.read_text(encoding="utf-8"))

    fork = loaded.fork()
    fork_first = await harness.run("Actually, call me Grace.", previous_state=fork)
    rows.append(("fork: turn 3", fork_first, "Actually, call me Grace."))
    assert fork_first.state is not None
    fork_second = await harness.run("What is my name?", previous_state=fork_first.state)
    rows.append(("fork: turn 4", fork_second, "What is my name?"))
    original_third = await harness.run("What is my name?", previous_state=loaded)
    rows.append(("original: turn 3", original_third, "What is my name?"))

    table = Table(title="runs", box=box.SIMPLE_HEAD, title_justify="left")
    for column in ("step", "thread_id", "run_id", "status", "user said", "model answered"):
        table.add_column(column, overflow="fold")
    for step, result, prompt in rows:
        table.add_row(
            step,
            result.thread_id[:12] + "…",
            result.run_id[:12] + "…",
            result.status,
            prompt,
            Text(str(result.output), style="cyan"),
        )
    console.print(table)

    saved = json.loads(state_file.read_text(encoding="utf-8"))
    file_table = Table(
        title=f"{state_file} ({state_file.stat().st_size} bytes)", box=box.SIMPLE_HEAD, title_justify="left"
    )
    file_table.add_column("key")
    file_table.add_column("value")
    file_table.add_row("schema_version", saved["schema_version"])
    file_table.add_row("thread_id", saved["thread_id"])
    file_table.add_row("message_history", f"{len(saved['message_history'])} pydantic-ai messages")
    file_table.add_row("capabilities", ", ".join(saved["capabilities"]) or "{}")
    file_table.add_row("environment", json.dumps(saved["environment"]))
    console.print(file_table)

    fork_history = list(fork_second.all_messages())
    loaded_history = list(loaded.message_history)
    shared = len(loaded_history) if _canonical(fork_history[: len(loaded_history)]) == _canonical(loaded_history) else 0
    console.print(
        Panel(
            Group(
                Text(f"original thread: {loaded.thread_id}"),
                Text(f"forked thread:   {fork.thread_id}   (a new id: H-7)"),
                Text(
                    f"shared history:  the fork starts with the original's {shared} messages, byte for byte "
                    f"(H-8); after that the two threads diverge."
                ),
                Text(f"original thread now says: {original_third.output}", style="cyan"),
                Text(f"forked thread now says:   {fork_second.output}", style="cyan"),
            ),
            title="fork",
        )
    )
    console.print(history_table(fork_history, "what the model saw on its last fork request (whole history)"))
    return Act1Facts(
        thread_id=loaded.thread_id,
        fork_thread_id=fork.thread_id,
        run_ids=[result.run_id for _, result, _ in rows],
        state_file=state_file,
        loaded_equals_saved=loaded == second.state,
        shared_prefix=shared,
        original_answer=str(original_third.output),
        fork_answer=str(fork_second.output),
        statuses=[result.status for _, result, _ in rows],
    )


# ------------------------------------------------------------------------------------ act 2: a crash mid-tool


@dataclass
class CrashOutcome:
    mode: str
    child_returncode: int
    child_output: str
    state_file: Path
    ledger_file: Path
    saved_state: HarnessState
    ledger_after_crash: list[dict[str, Any]]
    ledger_after_resume: list[dict[str, Any]]
    result: RunResult[str]
    returns: dict[str, ToolReturnPart] = field(default_factory=dict)

    @property
    def charges(self) -> int:
        return sum(1 for e in self.ledger_after_resume if e["tool"] == "charge_card")

    @property
    def lookups(self) -> int:
        return sum(1 for e in self.ledger_after_resume if e["tool"] == "lookup_order")

    def ran_again(self, tool: str) -> bool:
        before = sum(1 for e in self.ledger_after_crash if e["tool"] == tool)
        after = sum(1 for e in self.ledger_after_resume if e["tool"] == tool)
        return after > before

    @property
    def answer(self) -> str:
        return str(self.result.output)


def crash_child(state_file: Path, ledger_file: Path, *, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    """Run `python -m examples.crash_child` in a child process; it SIGKILLs itself after charging the card."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    env.pop("CANDOR_DEMO_CRASH_AFTER", None)
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "examples.crash_child",
            "--state",
            str(state_file),
            "--ledger",
            str(ledger_file),
            "--prompt",
            CHARGE_PROMPT,
            "--crash-after",
            "charge_card",
        ],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


async def run_crash(mode: str, workdir: Path) -> CrashOutcome:
    """Crash a worker mid-tool, then resume from its last checkpoint with `tool_recovery=mode` (H-40, H-44–H-47)."""
    workdir.mkdir(parents=True, exist_ok=True)
    state_file, ledger_file = workdir / "checkpoint.json", workdir / "ledger.jsonl"
    for stale in (state_file, ledger_file):
        stale.unlink(missing_ok=True)
    child = crash_child(state_file, ledger_file)
    if child.returncode != -signal.SIGKILL or not state_file.exists():
        raise RuntimeError(
            f"the crash child did not die as planned (rc={child.returncode}):\n{child.stdout}\n{child.stderr}"
        )
    saved = HarnessState.model_validate_json(state_file.read_text(encoding="utf-8"))
    ledger_after_crash = read_ledger(ledger_file)
    harness = Harness(support_agent())
    result = await harness.run(
        previous_state=saved, tool_recovery=mode, bindings=RunBindings(deps=SupportDeps(ledger_path=ledger_file))
    )
    return CrashOutcome(
        mode=mode,
        child_returncode=child.returncode,
        child_output=child.stdout,
        state_file=state_file,
        ledger_file=ledger_file,
        saved_state=saved,
        ledger_after_crash=ledger_after_crash,
        ledger_after_resume=read_ledger(ledger_file),
        result=result,
        returns=_returns(result.new_messages()),
    )


async def act2(out_dir: Path, console: Console, modes: tuple[str, ...] = MODES) -> dict[str, CrashOutcome]:
    """The crash story: one charge on the ledger, an unknown outcome for the model, a replayed read."""
    _act_header(
        console,
        2,
        "A crash mid-tool",
        "A worker is killed after charge_card charged the card but before its result was saved. "
        "What happens when another process picks the thread up?",
    )
    outcomes: dict[str, CrashOutcome] = {}
    for mode in modes:
        outcomes[mode] = await run_crash(mode, out_dir / f"act2-{mode}")

    first = outcomes[modes[0]]
    console.print(
        Panel(
            Text(first.child_output.rstrip() + f"\n(exit status {first.child_returncode}: killed by SIGKILL)"),
            title="child process: python -m examples.crash_child",
            subtitle="saves a checkpoint at every boundary",
        )
    )
    saved_history = list(first.saved_state.message_history)
    console.print(
        history_table(
            saved_history, f"last checkpoint on disk ({first.state_file.name}): the response's calls have no returns"
        )
    )
    console.print(ledger_table(first.ledger_after_crash, "ledger right after the crash"))

    if "declared" in outcomes:
        declared = outcomes["declared"]
        console.print(
            Text(
                '\nResume in this process: Harness.run(previous_state=<checkpoint>, tool_recovery="declared")',
                style="bold",
            )
        )
        console.print(
            history_table(
                declared.result.new_messages(),
                f"new messages of the resumed run {declared.result.run_id[:12]}… (status {declared.result.status})",
                start=len(saved_history),
            )
        )
        console.print(ledger_table(declared.ledger_after_resume, "ledger after the resume"))
        console.print(
            Panel(
                Group(
                    Text(f"charges on the ledger: {declared.charges}  (charge_card was not run again)"),
                    Text(f"lookup_order was retry-safe and ran again: {declared.ran_again('lookup_order')}"),
                    Text("the model received for charge_card: ").append(
                        describe_return(declared.returns.get("charge_card"), 200)
                    ),
                    Text(f"\nmodel: {declared.answer}", style="bold cyan"),
                ),
                title="declared (the default)",
            )
        )

    table = Table(title="the same crash under each tool_recovery mode", box=box.HEAVY_HEAD, show_lines=True)
    table.add_column("", style="bold")
    for mode in outcomes:
        table.add_column(mode + (" (default)" if mode == "declared" else ""), overflow="fold", max_width=38)

    def row(label: str, cell: Any) -> None:
        table.add_row(label, *(cell(o) for o in outcomes.values()))

    row(
        "charge_card on resume",
        lambda o: Text("ran AGAIN", style="bold red") if o.ran_again("charge_card") else Text("not run", style="green"),
    )
    row("model got for charge_card", lambda o: describe_return(o.returns.get("charge_card"), 60))
    row(
        "lookup_order on resume", lambda o: Text("ran again (read)") if o.ran_again("lookup_order") else Text("not run")
    )
    row("model got for lookup_order", lambda o: describe_return(o.returns.get("lookup_order"), 60))
    row("charges on the ledger", lambda o: Text(str(o.charges), style="bold red" if o.charges > 1 else "bold green"))
    row("lookups on the ledger", lambda o: Text(str(o.lookups)))
    row("model's answer", lambda o: Text(o.answer, style="cyan"))
    console.print(table)
    console.print(
        Text(
            'No mode promises exactly-once: "declared" replays only what its author marked retry-safe and tells the '
            'model the truth about the rest; "never" replays nothing; "always" replays everything, here charging '
            "the card twice.",
            style="italic",
        )
    )
    return outcomes


# ------------------------------------------------------------------------------------ act 3: human in the loop


@dataclass
class Act3Facts:
    first_status: str
    pending: list[tuple[str, str, str]]  # (tool_call_id, kind, tool_name)
    question: str
    rejected_code: str
    rejected_details: dict[str, Any]
    rejected_left_no_trace: bool
    override_invalid_code: str
    final_status: str
    final_answer: str
    outcomes: dict[str, str]
    ledger: list[dict[str, Any]]
    history_args_for_a1: dict[str, Any]


async def act3(out_dir: Path, console: Console) -> Act3Facts:
    """Approvals and questions suspend the run; answers are checked as a batch, then applied (H-63–H-79)."""
    _act_header(
        console,
        3,
        "Human in the loop",
        "refund_order needs a person's approval and the agent asks the user a question: the run suspends "
        "until the host has every answer.",
    )
    ledger = out_dir / "act3-ledger.jsonl"
    ledger.unlink(missing_ok=True)
    bindings = RunBindings(deps=SupportDeps(ledger_path=ledger))
    harness = Harness(support_agent())

    suspended = await harness.run(REFUND_PROMPT, bindings=bindings)
    assert suspended.state is not None and suspended.deferred is not None
    # A host stores both values, e.g. in another process or a database; here, two JSON files.
    state_file, pending_file = out_dir / "act3-suspended-state.json", out_dir / "act3-pending.json"
    state_file.write_text(suspended.state.model_dump_json(), encoding="utf-8")
    pending_file.write_bytes(_requests_adapter.dump_json(suspended.deferred))
    state = HarnessState.model_validate_json(state_file.read_text(encoding="utf-8"))
    requests = _requests_adapter.validate_json(pending_file.read_bytes())

    items = [*requests.approvals, *requests.calls]
    pending: list[tuple[str, str, str]] = [(c.tool_call_id, requests.kind(c.tool_call_id), c.tool_name) for c in items]
    table = Table(
        title=f"run {suspended.run_id[:12]}… ended {suspended.status!r} "
        f"(suspend_reason={suspended.suspend_reason!r}); pending items:",
        box=box.SIMPLE_HEAD,
        title_justify="left",
    )
    for column in ("tool_call_id", "kind", "tool", "arguments", "shown to the person"):
        table.add_column(column)
    question = ""
    for call in items:
        meta = requests.metadata.get(call.tool_call_id, {})
        shown = meta.get("question", "approve or deny?")
        if requests.kind(call.tool_call_id) == "question":
            question = shown
        table.add_row(
            call.tool_call_id,
            requests.kind(call.tool_call_id),
            call.tool_name,
            Text(_short(call.args_as_dict())),
            Text(shown),
        )
    console.print(table)
    console.print(
        Text(
            f"state and pending requests saved to {state_file.name} and {pending_file.name}; "
            f"ledger so far: {len(read_ledger(ledger))} entries (nothing ran)."
        )
    )

    approval_ids = [c.tool_call_id for c in requests.approvals]
    question_id = requests.calls[0].tool_call_id
    a1 = next(i for i in approval_ids if "a1" in i)
    b2 = next(i for i in approval_ids if "b2" in i)

    # 1. A rejected batch: the B2 approval is missing. Checked before anything runs; nothing is applied.
    before = state.model_dump_json()
    incomplete = DeferredToolResume(requests, DeferredToolResults(approvals={a1: True}, calls={question_id: "card"}))
    try:
        await harness.run(previous_state=state, deferred_resume=incomplete, bindings=bindings)
        raise AssertionError("an incomplete batch must be rejected")
    except RunError as exc:
        rejected = exc
    left_no_trace = state.model_dump_json() == before and read_ledger(ledger) == []

    # 2. An edited approval whose arguments fail the tool's schema: the approver hears about it, not the model.
    bad_override = DeferredToolResume(
        requests,
        DeferredToolResults(
            approvals={a1: ToolApproved(override_args={"order_id": "A1", "amount": "forty"}), b2: False},
            calls={question_id: "card"},
        ),
    )
    try:
        await harness.run(previous_state=state, deferred_resume=bad_override, bindings=bindings)
        raise AssertionError("invalid override_args must be rejected")
    except RunError as exc:
        override_error = exc

    errors = Table(
        title="rejected batches (raised before any model request or tool effect)",
        box=box.SIMPLE_HEAD,
        title_justify="left",
    )
    for column in ("batch", "RunError.code", "details"):
        errors.add_column(column, overflow="fold")
    errors.add_row(
        f"approves {a1}, answers {question_id}, forgets {b2}",
        Text(rejected.code, style="bold red"),
        Text(json.dumps(rejected.details)),
    )
    errors.add_row(
        f"approves {a1} with amount='forty'",
        Text(override_error.code, style="bold red"),
        Text(json.dumps(override_error.details)),
    )
    console.print(errors)
    console.print(Text(f"state unchanged and ledger still empty: {left_no_trace}"))

    # 3. The real answers: approve A1 with an edited amount (a string, coerced to int by the tool's schema),
    #    deny B2, answer the question.
    answers = DeferredToolResults(
        approvals={
            a1: ToolApproved(override_args={"order_id": "A1", "amount": "40"}),
            b2: ToolDenied("Refunds over $100 need a manager's sign-off."),
        },
        calls={question_id: "Back to the card, please."},
    )
    answer_table = Table(title="the host's answers", box=box.SIMPLE_HEAD, title_justify="left")
    answer_table.add_column("tool_call_id")
    answer_table.add_column("answer")
    answer_table.add_row(a1, "ToolApproved(override_args={'order_id': 'A1', 'amount': '40'})  # edited: 50 → '40'")
    answer_table.add_row(b2, 'ToolDenied("Refunds over $100 need a manager\'s sign-off.")')
    answer_table.add_row(question_id, "'Back to the card, please.'")
    console.print(answer_table)

    final = await harness.run(
        previous_state=state, deferred_resume=DeferredToolResume(requests, answers), bindings=bindings
    )
    assert final.state is not None
    console.print(
        history_table(
            final.new_messages(),
            f"new messages of run {final.run_id[:12]}… (status {final.status})",
            start=len(state.message_history),
        )
    )
    console.print(ledger_table(ledger))
    history_args = next(
        p.args_as_dict()
        for m in final.all_messages()
        if isinstance(m, ModelResponse)
        for p in m.parts
        if isinstance(p, ToolCallPart) and p.tool_call_id == a1
    )
    entries = read_ledger(ledger)
    console.print(
        Panel(
            Group(
                Text(
                    f"refund ran once, with amount={entries[0]['amount']!r} "
                    f"({type(entries[0]['amount']).__name__}: '40' was re-validated by the tool's schema, H-75)"
                    if entries
                    else "refund did not run"
                ),
                Text(
                    f"the history still shows the model's original arguments {history_args} "
                    "(overridden arguments are not recorded in history)"
                ),
                Text(f"{b2} was denied: its return has outcome 'denied' and the tool did not run (H-78)"),
                Text(f"\nmodel: {final.output}", style="bold cyan"),
            ),
            title="resumed and finished",
        )
    )
    outcomes: dict[str, str] = {
        p.tool_call_id: p.outcome
        for m in final.new_messages()
        if isinstance(m, ModelRequest)
        for p in m.parts
        if isinstance(p, ToolReturnPart)
    }
    return Act3Facts(
        first_status=suspended.status,
        pending=pending,
        question=question,
        rejected_code=rejected.code,
        rejected_details=dict(rejected.details),
        rejected_left_no_trace=left_no_trace,
        override_invalid_code=override_error.code,
        final_status=final.status,
        final_answer=str(final.output),
        outcomes=outcomes,
        ledger=entries,
        history_args_for_a1=history_args,
    )


# ------------------------------------------------------------------------------------------------------ main


async def run_demo(out_dir: Path, console: Console) -> dict[str, Any]:
    started = time.perf_counter()
    console.print(
        Panel(
            Text(
                "candor: a durable runtime for pydantic-ai agents.\n"
                "Scripted agents (pydantic_ai FunctionModel): no API key, no network.\n"
                f"Files written to: {out_dir}"
            ),
            title="candor demo",
            border_style="bold",
        )
    )
    facts: dict[str, Any] = {}
    facts["act1"] = await act1(out_dir, console)
    facts["act2"] = await act2(out_dir, console)
    facts["act3"] = await act3(out_dir, console)
    _act_header(
        console,
        4,
        "The same crash, hosted by the service",
        "candor serve on the embedded SQLite default: a worker process dies, another finishes the run",
    )
    facts["act4"] = await act4(out_dir, console)
    _act_header(
        console,
        5,
        "Reconcile before unknown",
        "charge_card has a reconciler that asks an idempotent payment API what became of the call's key",
    )
    facts["act5"] = await act5(out_dir, console)
    _act_header(
        console,
        6,
        "MCP annotations decide what runs again",
        "tools from an MCP server: readOnlyHint / idempotentHint calls run again after a crash, the others do not",
    )
    facts["act6"] = await act6(out_dir, console)
    console.print()
    console.print(Rule(Text(f"done in {time.perf_counter() - started:.1f} s", style="bold")))
    console.print(Text("Read more: README.md, docs/state-and-resume.md, docs/human-in-the-loop.md, docs/mcp.md"))
    return facts


from examples.mcp_demo import act6  # noqa: E402 - and the MCP act
from examples.reconcile_demo import act5  # noqa: E402 - so does the reconcile act
from examples.service_demo import act4  # noqa: E402 - the service act lives in its own module


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m examples.demo", description="The candor demo (six acts).")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="directory for the files the demo writes (default: a new temporary directory)",
    )
    args = parser.parse_args(argv)
    out_dir = args.out if args.out is not None else Path(tempfile.mkdtemp(prefix="candor-demo-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    # A pipe gets a fixed width (rich would fall back to 80 columns); a terminal keeps its own.
    console = Console() if sys.stdout.isatty() else Console(width=120)
    asyncio.run(run_demo(out_dir, console))
    return 0


if __name__ == "__main__":
    sys.exit(main())
