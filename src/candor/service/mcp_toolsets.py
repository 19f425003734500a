"""The MCP toolsets of an agent's runs, built from `[agents.<name>.mcp.<server>]` for every attempt (docs/mcp.md).

A fresh `candor.mcp.RecoverableMCP` per server per attempt, as for the harness itself (§7.7 step 3): a checkpoint
restores data, never a connection. `plan_servers` is the pure part (settings + environment → what to build, or why
not); `build_toolsets` imports the `mcp` extra and builds them.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from candor.mcp import RecoverableMCP

    from .settings_mcp import AgentMcpSettings

__all__ = ("ServerPlan", "McpUnavailableReason", "plan_servers", "build_toolsets", "mcp_installed")

McpUnavailableReason = Literal["mcp_not_installed", "mcp_credential_missing"]


@dataclass(frozen=True, kw_only=True)
class ServerPlan:
    """One server to connect to, with the values read from the environment."""

    name: str
    settings: AgentMcpSettings
    env: dict[str, str] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)


def mcp_installed() -> bool:
    return importlib.util.find_spec("fastmcp") is not None and importlib.util.find_spec("mcp") is not None


def plan_servers(
    servers: Mapping[str, AgentMcpSettings], environ: Mapping[str, str]
) -> list[ServerPlan] | McpUnavailableReason:
    """The servers in name order. A header variable that is unset is a missing credential; an `env` variable that
    is unset is simply not passed (the server gets the SDK's defaults)."""
    plans: list[ServerPlan] = []
    for name, settings in sorted(servers.items()):
        headers: dict[str, str] = {}
        for header, variable in settings.headers_env.items():
            value = environ.get(variable)
            if not value:
                return "mcp_credential_missing"
            headers[header] = value
        env = {variable: environ[variable] for variable in settings.env if variable in environ}
        plans.append(ServerPlan(name=name, settings=settings, env=env, headers=headers))
    return plans


def build_toolsets(plans: list[ServerPlan]) -> list[RecoverableMCP]:
    """The toolsets of `plans`; requires the `mcp` extra (check `mcp_installed()` first)."""
    from candor.mcp import mcp_http, mcp_stdio

    toolsets: list[RecoverableMCP] = []
    for plan in plans:
        settings = plan.settings
        overrides = {"retry_safe": settings.retry_safe, "never_retry": settings.never_retry}
        if settings.command is not None:
            toolset = mcp_stdio(
                settings.command,
                settings.args,
                server=plan.name,
                env=plan.env,
                cwd=settings.cwd,
                timeout=settings.timeout,
                **overrides,
            )
        else:
            assert settings.url is not None  # one of the two, checked by the settings
            toolset = mcp_http(
                settings.url, server=plan.name, headers=plan.headers, timeout=settings.timeout, **overrides
            )
        toolsets.append(toolset)
    return toolsets
