"""Agent registry: `agents.<name>.factory` strings (§3.2) resolved to callables that build a fresh Harness per attempt.

A factory is `"module:attribute"` naming a callable `(options: dict) -> candor.Harness`; the attribute may be a
dotted path inside the module (`"pkg.agents:Factories.support"`). Factories are imported lazily and cached;
`check_all()` imports them all at startup (§3.3, S-56) so no attempt imports on the event loop. `build()` calls the
factory for every attempt (§7.7 step 3): a checkpoint restores data, never authority, so no harness, agent or
binding outlives the attempt that built it.

Every failure is `AgentUnavailable` (`agent_unavailable`, §12.3), which seals the run `failed` (§7.9, S-49). Its
message names the agent and the kind of failure, never the foreign exception's text (that may quote configuration
or secrets); the exception is chained as `__cause__` for logs.
"""

from __future__ import annotations

import importlib
import inspect
import os
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Literal, cast

from candor import Harness

from .errors import ServiceError
from .mcp_toolsets import build_toolsets, mcp_installed, plan_servers
from .protocol.children import unknown_child_agents
from .providers import ModelPlan, build_model, plan_model

if TYPE_CHECKING:
    from pydantic_ai.models import Model
    from pydantic_ai.toolsets import AbstractToolset

    from .settings import AgentModelSettings, AgentSettings
    from .settings_mcp import AgentMcpSettings

__all__ = ("AgentFactory", "AgentRegistry", "AgentUnavailable", "UnavailableReason")

AgentFactory = Callable[[dict[str, Any]], Harness[Any]]
"""What a factory string names: options → a fresh harness."""

UnavailableReason = Literal[
    "unknown_agent",
    "invalid_factory",
    "import_failed",
    "attribute_missing",
    "not_callable",
    "factory_failed",
    "not_a_harness",
    "api_key_missing",
    "provider_not_installed",
    "mcp_not_installed",
    "mcp_credential_missing",
]

_DESCRIPTIONS: dict[UnavailableReason, str] = {
    "unknown_agent": "no such agent is configured",
    "invalid_factory": 'its factory is not "module:attribute"',
    "import_failed": "its factory module failed to import",
    "attribute_missing": "its factory module has no such attribute",
    "not_callable": "its factory is not callable",
    "factory_failed": "its factory raised",
    "not_a_harness": "its factory did not return a candor.Harness",
    "api_key_missing": "the environment variable its model's API key is read from is not set",
    "provider_not_installed": 'its model needs the "openai" extra (pip install "candor[openai]")',
    "mcp_not_installed": 'its MCP servers need the "mcp" extra (pip install "candor[mcp]")',
    "mcp_credential_missing": "an environment variable one of its MCP servers' headers are read from is not set",
}


class AgentUnavailable(ServiceError):
    """The agent is unknown, its factory does not import, or the factory failed (§12.3 `agent_unavailable`)."""

    code: ClassVar[str] = "agent_unavailable"

    def __init__(self, agent: str, reason: UnavailableReason) -> None:
        super().__init__(f"agent {agent!r} is unavailable: {_DESCRIPTIONS[reason]}")
        self.agent = agent
        """The agent name."""
        self.reason = reason
        """Which step failed; for logs, the run's failure code is always `code`."""


class AgentRegistry:
    """Agent name → factory string, resolved on first use."""

    def __init__(
        self,
        factories: Mapping[str, str],
        *,
        children: Mapping[str, Iterable[str]] | None = None,
        models: Mapping[str, AgentModelSettings | None] | None = None,
        mcp: Mapping[str, Mapping[str, AgentMcpSettings]] | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        """`children` maps an agent to the agents it may start as child runs (§7.13); each must be configured.
        `models` maps an agent to the model bound to its runs (docs/providers.md); its API key is read from
        `environ` (default `os.environ`). `mcp` maps an agent to its MCP servers (docs/mcp.md)."""
        self._factories = dict(factories)
        self._children = {name: tuple(names) for name, names in (children or {}).items()}
        if unknown := unknown_child_agents(self._children, self._factories):
            raise ValueError("child agents that are not configured: " + ", ".join(f"{a} → {c}" for a, c in unknown))
        self._resolved: dict[str, AgentFactory] = {}
        self._model_settings = {name: spec for name, spec in (models or {}).items() if spec is not None}
        self._environ = environ
        self._models: dict[str, Model] = {}
        self._mcp = {name: dict(servers) for name, servers in (mcp or {}).items() if servers}

    @classmethod
    def from_settings(cls, agents: Mapping[str, AgentSettings]) -> AgentRegistry:
        """The registry of the `[agents.<name>]` settings sections."""
        return cls(
            {name: section.factory for name, section in agents.items()},
            children={name: section.children for name, section in agents.items()},
            models={name: section.model for name, section in agents.items()},
            mcp={name: section.mcp for name, section in agents.items()},
        )

    def children_of(self, name: str) -> tuple[str, ...]:
        """§7.13: the agents `name` may start as child runs, sorted; empty unless configured (authority is explicit)."""
        return tuple(sorted(self._children.get(name, ())))

    def names(self) -> tuple[str, ...]:
        """The configured agent names, sorted."""
        return tuple(sorted(self._factories))

    def resolve(self, name: str) -> AgentFactory:
        """The factory callable of `name`, importing its module the first time; failures are not cached."""
        cached = self._resolved.get(name)
        if cached is not None:
            return cached
        factory = self._import(name)
        self._resolved[name] = factory
        return factory

    def build(self, name: str, options: Mapping[str, Any]) -> Harness[Any]:
        """A fresh harness for one attempt (§7.7 step 3): the factory is called every time, with a copy of `options`."""
        factory = self.resolve(name)
        try:
            harness = factory(dict(options))
        except Exception as exc:  # §7.9: "Agent factory raised" seals `agent_unavailable`, whatever it raised
            raise AgentUnavailable(name, "factory_failed") from exc
        if not isinstance(harness, Harness):
            if inspect.iscoroutine(harness):
                harness.close()  # an async factory: not supported, and never awaited
            raise AgentUnavailable(name, "not_a_harness")
        return harness

    def model(self, name: str) -> Model | None:
        """The model configured for `name` (None: the agent's own), built once per process and shared by its runs
        (one connection pool); raises `AgentUnavailable` when its key variable is unset or the extra is missing."""
        cached = self._models.get(name)
        if cached is not None:
            return cached
        spec = self._model_settings.get(name)
        if spec is None:
            return None
        plan = plan_model(spec, os.environ if self._environ is None else self._environ)
        if not isinstance(plan, ModelPlan):
            raise AgentUnavailable(name, plan)
        model = build_model(plan)
        if isinstance(model, str):
            raise AgentUnavailable(name, model)
        self._models[name] = model
        return model

    def check_all(self) -> None:
        """§3.3, S-56: import every factory and build every configured model; raises `AgentUnavailable` for the
        first agent (by name) that fails."""
        for name in self.names():
            self.resolve(name)
            self.model(name)
            self.mcp_toolsets(name)  # builds only: nothing connects until a run enters the toolsets

    def mcp_toolsets(self, name: str) -> list[AbstractToolset[Any]]:
        """Fresh toolsets for `name`'s MCP servers, one attempt's worth (docs/mcp.md); empty when it has none.

        Raises `AgentUnavailable` when the `mcp` extra is missing or a header's variable is unset. A server that is
        down is not detected here: the run fails `tool_unavailable` when it connects, and is retried."""
        servers = self._mcp.get(name)
        if not servers:
            return []
        if not mcp_installed():
            raise AgentUnavailable(name, "mcp_not_installed")
        plans = plan_servers(servers, os.environ if self._environ is None else self._environ)
        if isinstance(plans, str):
            raise AgentUnavailable(name, plans)
        return list(build_toolsets(plans))

    def _import(self, name: str) -> AgentFactory:
        spec = self._factories.get(name)
        if spec is None:
            raise AgentUnavailable(name, "unknown_agent")
        module_name, sep, attribute = spec.partition(":")
        if not sep or not module_name or not attribute:
            raise AgentUnavailable(name, "invalid_factory")
        try:
            target: Any = importlib.import_module(module_name)
        except Exception as exc:  # ImportError, SyntaxError, or anything the module raised while importing
            raise AgentUnavailable(name, "import_failed") from exc
        try:
            for part in attribute.split("."):
                target = getattr(target, part)
        except Exception as exc:  # AttributeError, or whatever a module `__getattr__` or property raised
            raise AgentUnavailable(name, "attribute_missing") from exc
        if not callable(target):
            raise AgentUnavailable(name, "not_callable")
        return cast(AgentFactory, target)
