"""kill -9 of a host mid-call on a real MCP server, for every annotation case and both overrides (issue 36).

The host is a separate process (`_mcp_host.py`) that checkpoints at every boundary; its agent calls one tool of the
tool server (`tool_server.py`, the `mcp` SDK's server) over stdio or streamable HTTP. The tool writes its ledger line
and then waits; the test SIGKILLs the host's process group at that moment, so the call's effect happened and its
result was never recorded. This process then continues from the saved state under `declared` with a fresh toolset.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai.messages import ModelResponse, ToolCallPart, ToolReturnPart

from candor import Harness, HarnessState
from candor.tools import UNKNOWN_OUTCOME_CONTENT

from mcp_support import CALL_ID, SERVER_NAME, calling_agent, http_server, ledger, server_env, toolset

pytestmark = [pytest.mark.crash, pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs POSIX SIGKILL")]

HOST = Path(__file__).with_name("_mcp_host.py")

# (tool, retry_safe, never_retry) → (re-run?, declared_by, reason)
CASES: list[tuple[str, tuple[str, ...], tuple[str, ...], bool, str, str]] = [
    ("read_balance", (), (), True, "annotation", "retry_safe"),  # readOnlyHint
    ("set_limit", (), (), True, "annotation", "retry_safe"),  # idempotentHint, destructiveHint false
    ("wipe_cache", (), (), False, "none", "not_retry_safe"),  # idempotentHint but destructiveHint
    ("charge", (), (), False, "none", "not_retry_safe"),  # no hints
    ("charge", ("charge",), (), True, "override", "retry_safe"),  # the operator knows it is safe
    ("read_balance", (), ("read_balance",), False, "override", "not_retry_safe"),  # the operator refuses it
]


def _kill_mid_call(workdir: Path, tool: str, url: str | None) -> None:
    """Start the host, wait for the tool's effect, SIGKILL the host's process group while the tool still runs."""
    (workdir / f"block-{tool}").write_text("")
    env = dict(os.environ, **server_env(workdir))
    env.pop("PYTHONSTARTUP", None)
    args = [sys.executable, str(HOST), str(workdir), tool, *([url] if url else [])]
    host = subprocess.Popen(args, env=env, stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not ledger(workdir) and host.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert host.stderr is not None
        assert ledger(workdir) == [f"{tool} acme"], host.stderr.read().decode()[-3000:] if host.poll() else "timeout"
    finally:
        os.killpg(host.pid, signal.SIGKILL)
        host.wait()
        (workdir / f"block-{tool}").unlink()
    assert host.returncode == -signal.SIGKILL


async def _recover(
    workdir: Path, tool: str, url: str | None, retry_safe: tuple[str, ...], never: tuple[str, ...]
) -> Any:
    state = HarnessState.model_validate_json((workdir / "state.json").read_text(encoding="utf-8"))
    last = state.message_history[-1]
    assert isinstance(last, ModelResponse)  # H-37: saved at the tool boundary, the call open
    assert [p.tool_call_id for p in last.parts if isinstance(p, ToolCallPart)] == [CALL_ID]
    recorded: Any = state.capabilities[f"candor.mcp.{SERVER_NAME}"].data  # recorded JSON, read field by field
    assert recorded["tools"] is not None
    assert set(recorded["tools"]) == {"read_balance", "set_limit", "wipe_cache", "charge"}
    agent, _ = calling_agent(tool, [toolset(workdir, url=url, retry_safe=retry_safe, never_retry=never)])
    return await Harness(agent).run(previous_state=state, tool_recovery="declared")


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["stdio", "http"])
@pytest.mark.parametrize(("tool", "retry_safe", "never", "rerun", "declared_by", "reason"), CASES)
async def test_kill_mid_call_then_recover_by_the_declaration(
    tmp_path: Path,
    transport: str,
    tool: str,
    retry_safe: tuple[str, ...],
    never: tuple[str, ...],
    rerun: bool,
    declared_by: str,
    reason: str,
) -> None:
    """H-40, H-43, H-46, H-50, H-53: after a SIGKILL mid-call, the unanswered MCP call runs again under `declared`
    exactly when its tool is annotated readOnlyHint or idempotentHint (not destructiveHint) or listed in
    `retry_safe`, and never when listed in `never_retry`; otherwise the model gets the unknown-outcome result. The
    `candor.recovery` entry says where the declaration came from."""
    if transport == "http":
        with http_server(tmp_path) as url:
            _kill_mid_call(tmp_path, tool, url)
            result = await _recover(tmp_path, tool, url, retry_safe, never)
    else:
        _kill_mid_call(tmp_path, tool, None)
        result = await _recover(tmp_path, tool, None, retry_safe, never)

    assert result.status == "completed" and result.output == "done"
    assert ledger(tmp_path) == [f"{tool} acme"] * (2 if rerun else 1)
    (answer,) = [
        part
        for message in result.state.message_history
        for part in getattr(message, "parts", ())
        if isinstance(part, ToolReturnPart) and part.tool_call_id == CALL_ID
    ]
    if rerun:
        assert answer.content == f"{tool} done for acme"
        assert (answer.metadata or {}).get("candor.recovery") == "replayed"
    else:
        assert answer.content == UNKNOWN_OUTCOME_CONTENT and answer.outcome == "interrupted"
    basis = result.state.capabilities["candor.recovery"].data["calls"][CALL_ID]
    assert basis == {
        "tool_name": tool,
        "action": "replay" if rerun else "unknown_outcome",
        "reason": reason,
        "declared_by": declared_by,
        "declaration_changed": False,
    }
