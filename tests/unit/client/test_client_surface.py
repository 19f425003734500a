"""What a person exploring `candor.client` sees: typed run fields and real method signatures (issue 35 item 3)."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from candor.client import AsyncCandorClient, CandorClient, RecoveredCall, Run
from candor.client._core import Operations

RUN: dict[str, Any] = {
    "id": "run_1",
    "thread_id": "thr_1",
    "agent": "support",
    "principal_id": "key_1",
    "status": "completed",
    "wait_reason": None,
    "pending": None,
    "output": "ok",
    "failure": None,
    "parent_run_id": None,
    "version": 3,
    "tool_recovery": "never",
}
METHODS = (
    "create_thread",
    "post_message",
    "get_thread",
    "get_run",
    "list_runs",
    "interrupt_run",
    "resume",
    "wait_for_run",
)


def test_run_carries_tool_recovery_and_the_recovered_calls() -> None:
    """§8.4 (issue 13 item 2, issue 35): `tool_recovery` and `recovery` are typed fields, not only `raw[...]`."""
    detail = Run.of(
        RUN
        | {
            "recovery": [
                {"tool_call_id": "c1", "tool_name": "charge", "outcome": "unknown"},
                {"tool_call_id": "c2", "tool_name": "lookup", "outcome": "replayed"},
            ]
        }
    )
    assert detail.tool_recovery == "never"
    assert detail.recovery == (
        RecoveredCall(tool_call_id="c1", tool_name="charge", outcome="unknown"),
        RecoveredCall(tool_call_id="c2", tool_name="lookup", outcome="replayed"),
    )
    listed = Run.of(RUN)  # a run list carries no recovery: None, not "nothing was recovered"
    assert listed.recovery is None and Run.of(RUN | {"recovery": []}).recovery == ()
    older = Run.of({key: value for key, value in RUN.items() if key != "tool_recovery"})
    assert older.tool_recovery is None


@pytest.mark.parametrize("client", [CandorClient, AsyncCandorClient])
@pytest.mark.parametrize("name", METHODS)
def test_methods_show_their_real_signature_and_docstring(client: type, name: str) -> None:
    """Issue 35: `inspect.signature` / `help()` show each method's parameters (not `(*args, **kwargs)`), its
    result type (not the internal `Operation[...]`) and a docstring."""
    method = getattr(client, name)
    operation = getattr(Operations, name)
    signature = inspect.signature(method)
    assert list(signature.parameters) == list(inspect.signature(operation).parameters)
    assert all(p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in signature.parameters.values())
    assert "Operation" not in str(signature.return_annotation)
    assert method.__doc__ and method.__doc__ == operation.__doc__


def test_get_run_signature_reads_like_the_method() -> None:
    """Issue 35: the bound method's signature is what a caller types."""
    with CandorClient("http://127.0.0.1:1", api_key="k") as client:
        assert str(inspect.signature(client.get_run)) == "(run_id: 'str') -> 'Run'"
