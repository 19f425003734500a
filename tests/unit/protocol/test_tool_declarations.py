"""What the run inspector reads about an agent's tools (`protocol.tool_declarations`, `commands.inspection`):
H-50, H-51 (only the boolean `True` marks a tool retry-safe), H-52 (`recovery_retryable`), §8.8 (client tools are
external and never retry-safe)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic_ai import Agent, Tool
from pydantic_ai.models.test import TestModel
from pydantic_ai.tools import ToolDefinition
from pydantic_ai.toolsets import ExternalToolset

from candor import Harness
from candor.service.commands.inspection import declared_tools
from candor.service.protocol.tool_declarations import client_tool_declarations, declaration_of
from candor.tools import RECOVERY_RETRY_SAFE_METADATA_KEY, OutcomeUnknown, recovery_retryable, with_reconciler


@pytest.mark.parametrize(
    ("metadata", "retry_safe"),
    [
        (None, False),
        ({}, False),
        ({RECOVERY_RETRY_SAFE_METADATA_KEY: True}, True),
        ({RECOVERY_RETRY_SAFE_METADATA_KEY: "true"}, False),  # H-51: only the boolean
        ({RECOVERY_RETRY_SAFE_METADATA_KEY: 1}, False),
        ({RECOVERY_RETRY_SAFE_METADATA_KEY: False}, False),
    ],
)
def test_retry_safe_is_only_the_boolean_true(metadata: Any, retry_safe: bool) -> None:
    """H-50, H-51."""
    found = declaration_of("t", metadata, requires_approval=False, external=False, description=None)
    assert found.retry_safe is retry_safe and found.kind == "function" and found.reconciler is False


@pytest.mark.parametrize(
    ("requires_approval", "external", "kind"),
    [(False, False, "function"), (True, False, "approval"), (False, True, "external"), (True, True, "external")],
)
def test_kind(requires_approval: bool, external: bool, kind: str) -> None:
    found = declaration_of("t", None, requires_approval=requires_approval, external=external, description="d")
    assert found.kind == kind and found.description == "d"


def test_client_tools_are_external_and_malformed_items_are_skipped() -> None:
    """§8.8: a run's `options.client_tools`."""
    options = {"client_tools": [{"name": "get_weather", "description": "Weather."}, {"description": "no name"}, 3]}
    found = client_tool_declarations(options)
    assert [(t.name, t.kind, t.retry_safe, t.description) for t in found] == [
        ("get_weather", "external", False, "Weather.")
    ]
    assert client_tool_declarations({}) == [] and client_tool_declarations({"client_tools": None}) == []


def test_declared_tools_of_a_harness() -> None:
    """H-52: `recovery_retryable` marks a tool; a tool needing approval, a reconciled tool and an external toolset's
    tool are told apart; a harness without an agent declares nothing."""

    def plain(x: int) -> int:
        """Plain."""
        return x

    def safe(x: int) -> int:
        """Safe."""
        return x

    def gated(x: int) -> int:
        """Gated."""
        return x

    def paid(x: int) -> int:
        """Paid."""
        return x

    external = ExternalToolset([ToolDefinition(name="remote", description="Remote.", kind="external")])
    agent = Agent(
        TestModel(),
        tools=[
            Tool(plain),
            recovery_retryable(safe),
            Tool(gated, requires_approval=True),
            with_reconciler(Tool(paid), lambda request: OutcomeUnknown()),
        ],
        toolsets=[external],
    )
    found = {t.name: (t.kind, t.retry_safe, t.reconciler) for t in declared_tools(Harness(agent))}
    assert found == {
        "plain": ("function", False, False),
        "safe": ("function", True, False),
        "gated": ("approval", False, False),
        "paid": ("function", False, True),
        "remote": ("external", False, False),
    }
    assert declared_tools(object()) == []
