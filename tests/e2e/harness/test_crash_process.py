"""A real crash: a child process checkpoints at every boundary and is SIGKILLed inside a tool (H-40).

Nothing about the crash is mocked: the child is a separate Python process (`_crash_child.py`) that kills itself with
SIGKILL after a non-retry-safe tool wrote its effect to a ledger file; the parent continues from the last state
the child saved.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest
from pydantic_ai.messages import ModelRequest, ModelResponse, ToolCallPart, ToolReturnPart

from candor import Harness, HarnessState
from candor.tools import unknown_outcome_result

from scripted import returns

pytestmark = pytest.mark.crash

CHILD = Path(__file__).with_name("_crash_child.py")


def _load_child() -> ModuleType:
    spec = importlib.util.spec_from_file_location("candor_tests_crash_child", CHILD)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run_child(workdir: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.pop("PYTHONSTARTUP", None)
    return subprocess.run(
        [sys.executable, str(CHILD), str(workdir)],
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
        cwd=str(workdir),
    )


def _lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines() if path.exists() else []


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs POSIX SIGKILL")
async def test_sigkill_inside_a_tool_then_recover_under_declared(tmp_path: Path) -> None:
    """H-40, H-35, H-37, H-43, H-44, H-46: the state saved at the tool boundary survives a SIGKILL in a tool;
    a new process running it under "declared" closes the killed, non-retry-safe call with an unknown outcome
    without calling it again, and runs the retry-safe sibling exactly once."""
    child = _run_child(tmp_path)  # bounded by its own timeout; its start-up time depends on the machine's load
    started = time.monotonic()  # the recovery below runs in this process: it must not wait for anything
    assert child.returncode == -signal.SIGKILL, child.stderr[-2000:]

    # The effect happened exactly once, in the child, and its result was never recorded.
    ledger = _lines(tmp_path / "ledger.txt")
    assert ledger == ["child call_charge charge 42"]
    # The child checkpointed at the model boundary and at the tool boundary, then died.
    assert [line.split()[1] for line in _lines(tmp_path / "boundaries.log")] == ["model", "tool"]
    assert not (tmp_path / "state.json.tmp").exists()

    state = HarnessState.model_validate_json((tmp_path / "state.json").read_text(encoding="utf-8"))
    last = state.message_history[-1]
    assert isinstance(last, ModelResponse)  # H-37: the tool-boundary state, every call open
    charge_call, lookup_call = [p for p in last.parts if isinstance(p, ToolCallPart)]
    assert (charge_call.tool_call_id, lookup_call.tool_call_id) == ("call_charge", "call_lookup")

    # A new process (here: the parent) rebuilds the same tools, without the crash, and continues.
    child_module = _load_child()
    agent, seen = child_module.build_agent(tmp_path, role="parent", die_in_charge=False)
    result = await Harness(agent).run(previous_state=state, tool_recovery="declared")

    assert result.status == "completed"
    assert result.output == "done"
    assert _lines(tmp_path / "ledger.txt") == ledger  # charge was not called again: still one ledger line
    assert _lines(tmp_path / "lookups-parent.txt") == ["call_lookup acme approved=False"]  # exactly once

    assert result.state is not None
    history = list(result.state.message_history)
    assert history[: len(state.message_history)] == list(state.message_history)
    (charge_return,) = returns(history, "call_charge")
    expected = unknown_outcome_result(charge_call)
    assert charge_return.content == expected.content
    assert charge_return.outcome == "interrupted"
    assert charge_return.metadata == {"candor.unknown_outcome": True}
    assert charge_return.tool_name == "charge"
    (lookup_return,) = returns(history, "call_lookup")
    assert lookup_return.content == "balance of acme: 10"
    # H-44: both returns in one new request, in call order, sent with the first model request.
    recovery_request = history[len(state.message_history)]
    assert isinstance(recovery_request, ModelRequest)
    assert [getattr(p, "tool_call_id", None) for p in recovery_request.parts] == ["call_charge", "call_lookup"]
    assert len(seen) == 1
    assert [p.tool_call_id for p in seen[0][-1].parts if isinstance(p, ToolReturnPart)] == [
        "call_charge",
        "call_lookup",
    ]

    assert time.monotonic() - started < 5
