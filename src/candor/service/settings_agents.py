"""The `[agents.<name>]` settings sections: where an agent's harness factory is, its children, its tool recovery
and the model the service binds to its runs (docs/providers.md)."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator

from .settings_mcp import MCP_SERVER_NAME, AgentMcpSettings
from .settings_sections import Section
from .settings_sources import ENV_PREFIX

__all__ = ("AgentSettings", "AgentModelSettings", "MODEL_PROVIDERS")

_FACTORY = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
MODEL_PROVIDERS = ("openai", "openai-chat")
"""Provider prefixes of `agents.<name>.model.name` the service can build (docs/providers.md)."""


class AgentModelSettings(Section):
    """`[agents.<name>.model]`: the model the service binds to every run of the agent, replacing the agent's own
    (docs/providers.md). The API key is read from the environment variable `api_key_env` when the worker starts;
    it is never a setting, and never stored."""

    name: str
    """A Pydantic AI model string of an OpenAI-wire provider: `openai:<model>` (chat completions)."""
    base_url: str | None = None
    """The provider's API root (e.g. `https://api.openai.com/v1`, a vLLM or Ollama server); default OpenAI's."""
    api_key_env: str = "OPENAI_API_KEY"
    """The environment variable holding the API key. Required to be set unless `base_url` is given."""
    timeout: float = Field(60.0, gt=0, le=3600)
    """Per HTTP attempt: connect, and the wait for each read (each streamed chunk)."""
    request_timeout: float | None = Field(None, gt=0)
    """Deadline for one whole model request, every retry and the whole streamed response included."""
    max_retries: int = Field(2, ge=0, le=10)
    """Retries of one request by the provider client (429, 408, 409, 5xx, connection errors, timeouts)."""

    @field_validator("name")
    @classmethod
    def _provider_model(cls, value: str) -> str:
        provider, sep, model = value.partition(":")
        if not sep or provider not in MODEL_PROVIDERS or not model.strip():
            raise ValueError('must be "openai:<model name>"; other providers: build the model in the factory')
        return value

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"https?://[^\s/?#@]+(/[^\s?#]*)?", value):
            # stored with every response (`provider_url`): no credentials (user:password@, ?key=) may hide in it
            raise ValueError("must be an http:// or https:// URL without credentials, query or fragment")
        return value

    @field_validator("api_key_env")
    @classmethod
    def _variable_name(cls, value: str) -> str:
        if not _ENV_NAME.fullmatch(value):
            raise ValueError("must be an environment variable name")
        if value.upper().startswith(ENV_PREFIX):
            raise ValueError(f"must not start with {ENV_PREFIX} (those variables are settings)")
        return value


class AgentSettings(Section):
    """`[agents.<name>]`: where to find the agent's harness factory."""

    factory: str
    """`"module:attribute"` naming a callable `(options: dict) -> candor.Harness`."""
    children: tuple[str, ...] = ()
    """§7.13: the agents this agent may start as child runs (`start_child_run`); none by default. Every name must
    be a configured agent (checked at startup)."""
    tool_recovery: Literal["declared", "never", "always"] = "declared"
    """What a recovering attempt does with this agent's unanswered tool calls (S-29, H-45…H-47): `declared` re-runs
    retry-safe tools only, `never` answers all unknown-outcome, `always` re-runs all. A run's own
    `options.tool_recovery` wins (protocol/tool_recovery.py)."""
    model: AgentModelSettings | None = None
    """The model bound to every run of this agent (docs/providers.md); unset: the agent's own model."""
    mcp: dict[str, AgentMcpSettings] = Field(default_factory=dict)
    """`[agents.<name>.mcp.<server>]`: MCP servers whose tools every run of this agent gets (docs/mcp.md)."""

    @field_validator("mcp")
    @classmethod
    def _server_names(cls, value: dict[str, AgentMcpSettings]) -> dict[str, AgentMcpSettings]:
        for name in value:
            if not MCP_SERVER_NAME.fullmatch(name):
                raise ValueError(f"MCP server name {name!r} must match {MCP_SERVER_NAME.pattern}")
        return value

    @field_validator("children")
    @classmethod
    def _distinct_names(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if any(not name for name in value):
            raise ValueError("agent names must not be empty")
        if len(set(value)) != len(value):
            raise ValueError("agent names must be distinct")
        return value

    @field_validator("factory")
    @classmethod
    def _module_attribute(cls, value: str) -> str:
        if not _FACTORY.fullmatch(value):
            raise ValueError('must be "module:attribute"')
        return value
