"""`[agents.<name>.mcp.<server>]`: the MCP servers an agent's runs get as toolsets (docs/mcp.md).

A server is either a subprocess speaking stdio (`command`, `args`) or a streamable-HTTP endpoint (`url`). Secrets
are never settings: `env` names the environment variables passed to a stdio server and `headers_env` maps HTTP
headers to the variables holding their values; both are read when an attempt builds its toolsets, and neither the
values nor the command or URL are recorded with a checkpoint (only tool names and annotations are).
"""

from __future__ import annotations

import re

from pydantic import Field, field_validator, model_validator

from candor.harness.mcp_policy import check_overrides

from .settings_sections import Section
from .settings_sources import ENV_PREFIX

__all__ = ("AgentMcpSettings", "MCP_SERVER_NAME")

MCP_SERVER_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
"""A server's name (the key of its section): also the suffix of its checkpoint namespace `candor.mcp.<server>`."""
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_HEADER_NAME = re.compile(r"^[A-Za-z0-9-]+$")
_URL = re.compile(r"https?://[^\s/?#@]+(/[^\s?#]*)?")


class AgentMcpSettings(Section):
    """One MCP server of an agent; its tools are offered to every run of the agent."""

    command: str | None = None
    """The executable of a stdio server (e.g. `python`, `npx`); exclusive with `url`."""
    args: tuple[str, ...] = ()
    """Arguments of `command`."""
    cwd: str | None = None
    """Working directory of a stdio server; default the worker's."""
    env: tuple[str, ...] = ()
    """Names of environment variables passed to a stdio server (beside the MCP SDK's safe defaults such as PATH)."""
    url: str | None = None
    """A streamable-HTTP endpoint (`http(s)://host/mcp`); exclusive with `command`. No credentials in it."""
    headers_env: dict[str, str] = Field(default_factory=dict)
    """HTTP header name → the environment variable holding its value (e.g. `Authorization = "CRM_TOKEN"`)."""
    timeout: float = Field(30.0, gt=0, le=3600)
    """Seconds for connecting and for each request, a tool call included; past it the attempt fails
    `tool_unavailable` and is retried (the call's outcome is then judged like after a crash)."""
    retry_safe: tuple[str, ...] = ()
    """Tools re-run after a crash whatever the server annotates."""
    never_retry: tuple[str, ...] = ()
    """Tools never re-run after a crash whatever the server annotates; wins over `retry_safe` and annotations."""

    @model_validator(mode="after")
    def _one_transport(self) -> AgentMcpSettings:
        if (self.command is None) == (self.url is None):
            raise ValueError("give exactly one of command (a stdio server) or url (a streamable-HTTP server)")
        if self.url is not None and (self.args or self.env or self.cwd is not None):
            raise ValueError("args, env and cwd apply to a stdio server (command), not to url")
        if self.command is not None and self.headers_env:
            raise ValueError("headers_env applies to a streamable-HTTP server (url), not to command")
        check_overrides(self.retry_safe, self.never_retry)
        return self

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is not None and not _URL.fullmatch(value):
            raise ValueError("must be an http:// or https:// URL without credentials, query or fragment")
        return value

    @field_validator("command")
    @classmethod
    def _non_blank(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("must not be blank")
        return value

    @field_validator("env")
    @classmethod
    def _variable_names(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for name in value:
            _check_variable(name)
        return value

    @field_validator("headers_env")
    @classmethod
    def _header_variables(cls, value: dict[str, str]) -> dict[str, str]:
        for header, variable in value.items():
            if not _HEADER_NAME.fullmatch(header):
                raise ValueError(f"{header!r} is not an HTTP header name")
            _check_variable(variable)
        return value


def _check_variable(name: str) -> None:
    if not _ENV_NAME.fullmatch(name):
        raise ValueError(f"{name!r} is not an environment variable name")
    if name.upper().startswith(ENV_PREFIX):
        raise ValueError(f"{name!r} must not start with {ENV_PREFIX} (those variables are settings)")
