"""The run's `tool_recovery` mode: `options.tool_recovery`, else the agent's setting, else "declared".

The mode decides what a recovering attempt does with tool calls that were requested but never answered (S-29, H-45
… H-47): `declared` re-runs only tools marked retry-safe, `never` answers every such call unknown-outcome, `always`
re-runs every one. `options.tool_recovery` is one of the two keys of `options` the service reads itself (with
`client_tools`, §8.8); it is part of the frozen options and of `options_digest`, so a steer naming another mode is a
change of options (409 `run_configuration_immutable`, §8.5). The effective mode is fixed when a run is accepted and
stored in `runs.tool_recovery`: a later change of `[agents.<name>].tool_recovery` applies to later runs only, the
same way `worker.max_attempts` does (S-10).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from candor.harness.recovery import TOOL_RECOVERY_MODES, ToolRecovery, validate_tool_recovery

__all__ = (
    "TOOL_RECOVERY_FIELD",
    "TOOL_RECOVERY_INVALID",
    "DEFAULT_TOOL_RECOVERY",
    "tool_recovery_problem",
    "tool_recovery_message",
    "effective_tool_recovery",
    "TOOL_RECOVERY_MODES",
    "ToolRecovery",
)

TOOL_RECOVERY_FIELD: Final = "options.tool_recovery"
TOOL_RECOVERY_INVALID: Final = "not_a_tool_recovery_mode"
"""The reason of the 400 `invalid_argument` for a value other than "declared", "never" or "always"."""
DEFAULT_TOOL_RECOVERY: Final[ToolRecovery] = "declared"
_ECHO_LIMIT: Final = 40
"""The longest rejected value a message repeats back (a body may hold anything)."""


def tool_recovery_problem(options: Mapping[str, object] | None) -> str | None:
    """The reason `options.tool_recovery` is invalid, or None when it is absent or one of the three modes."""
    if options is None or "tool_recovery" not in options:
        return None
    try:
        validate_tool_recovery(options["tool_recovery"])
    except ValueError:
        return TOOL_RECOVERY_INVALID
    return None


def tool_recovery_message(value: object) -> str:
    """The 400's human message for a rejected `options.tool_recovery`: the allowed values, then what was sent."""
    sent = repr(value)
    if len(sent) > _ECHO_LIMIT:
        sent = sent[: _ECHO_LIMIT - 1] + "…"
    return f'{TOOL_RECOVERY_FIELD} must be one of "declared", "never" or "always" (got {sent})'


def effective_tool_recovery(options: Mapping[str, object] | None, agent_default: str) -> ToolRecovery:
    """The run's mode: its own `options.tool_recovery` wins over the agent's setting (`agent_default`).

    An invalid option (refused at acceptance, so only from a row written by other means) falls back to the agent's.
    """
    chosen = (options or {}).get("tool_recovery")
    if tool_recovery_problem(options) is None and chosen is not None:
        return validate_tool_recovery(chosen)
    return validate_tool_recovery(agent_default)
