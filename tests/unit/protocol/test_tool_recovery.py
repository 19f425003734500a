"""The run's `tool_recovery` mode, pure (issue 13 item 1; S-29): the option wins over the agent's setting."""

from __future__ import annotations

from typing import Any

import pytest

from candor.service.protocol.tool_recovery import (
    effective_tool_recovery,
    tool_recovery_message,
    tool_recovery_problem,
)


@pytest.mark.parametrize(
    ("options", "agent_default", "expected"),
    [
        (None, "declared", "declared"),
        ({}, "never", "never"),
        ({"tone": "brief"}, "always", "always"),
        ({"tool_recovery": "always"}, "never", "always"),
        ({"tool_recovery": "never"}, "declared", "never"),
        ({"tool_recovery": "bogus"}, "never", "never"),  # only reachable for rows written by other means
    ],
)
def test_effective_mode(options: Any, agent_default: str, expected: str) -> None:
    assert effective_tool_recovery(options, agent_default) == expected


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        (None, None),
        ({}, None),
        ({"tool_recovery": "declared"}, None),
        ({"tool_recovery": "never"}, None),
        ({"tool_recovery": "always"}, None),
        ({"tool_recovery": "Always"}, "not_a_tool_recovery_mode"),
        ({"tool_recovery": None}, "not_a_tool_recovery_mode"),
        ({"tool_recovery": 1}, "not_a_tool_recovery_mode"),
    ],
)
def test_option_problem(options: Any, problem: str | None) -> None:
    assert tool_recovery_problem(options) == problem


def test_agent_default_must_be_a_mode() -> None:
    with pytest.raises(ValueError):
        effective_tool_recovery({}, "sometimes")


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("sometimes", 'options.tool_recovery must be one of "declared", "never" or "always" (got \'sometimes\')'),
        (None, 'options.tool_recovery must be one of "declared", "never" or "always" (got None)'),
        ("x" * 100, 'options.tool_recovery must be one of "declared", "never" or "always" (got \'' + "x" * 38 + "…)"),
    ],
)
def test_message_names_the_allowed_values(value: Any, message: str) -> None:
    """Issue 35 item 3: the 400's message names the three modes and what was sent (bounded)."""
    assert tool_recovery_message(value) == message
