"""Edited arguments on resume: refuse up front what the worker would refuse later (H-75).

An approval may carry `arguments` to run the tool with instead of the model's. The worker validates them against
the tool's schema when the successor starts and fails it with `deferred_override_invalid` otherwise — by then the
wait is over. So the resume checks them first, the same way: build the waiting run's agent (its factory with the
run's options) and validate each edit with its tool's argument validator. Best effort, like the client-tool name
check (§8.8): when the factory cannot run in this process, or the tool is not declared statically (a dynamic
toolset), the worker's check is the one that applies.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from pydantic import ValidationError
from pydantic_ai.toolsets import AbstractToolset

from ..core import Service
from ..protocol.resume import Approve, ResumeAnswers
from ..store.reads import RunRow

__all__ = ("edited_argument_problems", "walk_static_toolsets")


def edited_argument_problems(service: Service, waiting: RunRow, answers: ResumeAnswers) -> list[tuple[str, str]]:
    """`(field, reason)` for each edit its tool's schema refuses: field `approvals.<id>.arguments`, reason
    `does_not_fit_tool_schema`. Empty when there is no edit or nothing can be checked here."""
    edits = {
        call_id: answer.arguments
        for call_id, answer in answers.approvals.items()
        if isinstance(answer, Approve) and answer.arguments is not None
    }
    if not edits:
        return []
    tool_names = {
        item.get("tool_call_id"): item.get("tool_name") for item in (waiting.pending or {}).get("approvals", [])
    }
    try:
        harness = service.agents.build(waiting.agent, waiting.options or {})
    except Exception:  # noqa: BLE001 - the factory cannot run here: the worker checks (H-75)
        return []
    validators = _argument_validators(harness)
    problems = []
    for call_id, arguments in edits.items():
        validator = validators.get(str(tool_names.get(call_id)))
        if validator is None:
            continue
        try:
            validator.validate_python(arguments)
        except ValidationError:
            problems.append((f"approvals.{call_id}.arguments", "does_not_fit_tool_schema"))
    return problems


def _argument_validators(harness: Any) -> dict[str, Any]:
    """Tool name → its pydantic argument validator, for the tools the agent declares statically."""
    found: dict[str, Any] = {}

    def visit(toolset: AbstractToolset[Any]) -> None:
        tools = getattr(toolset, "tools", None)
        if isinstance(tools, Mapping):
            for name, tool in tools.items():
                validator = getattr(getattr(tool, "function_schema", None), "validator", None)
                if isinstance(name, str) and validator is not None:
                    found[name] = validator

    walk_static_toolsets(harness, visit)
    return found


def walk_static_toolsets(harness: Any, visit: Callable[[AbstractToolset[Any]], None]) -> None:
    """Call `visit` on every toolset of the harness's agent, nested ones included (`AbstractToolset.apply`); a
    toolset that cannot be walked in this process is passed over."""
    for toolset in getattr(getattr(harness, "agent", None), "toolsets", ()) or ():
        if isinstance(toolset, AbstractToolset):
            try:
                toolset.apply(visit)
            except Exception:  # noqa: BLE001 - a toolset that cannot be walked contributes nothing
                continue
