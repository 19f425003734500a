"""Configured models (`[agents.<name>.model]`, docs/providers.md): a Pydantic AI OpenAI chat model per agent.

The worker binds the model to every run of the agent (`RunBindings.model`), so the agent's factory builds tools and
instructions and the operator picks the provider. The API key comes from the environment variable the settings
name, read when the model is first built in this process; it lives only in the provider client's memory, never in
settings dumps, states, checkpoints, stream entries or error messages.

Retry policy (one attempt): the OpenAI client retries a request `max_retries` times on 408, 409, 429, 5xx,
connection errors and timeouts, waiting what `Retry-After`/`retry-after-ms` asks (up to the client's cap) or an
exponential backoff from 0.5 s to 8 s with jitter. When it gives up, the harness ends the run `failed` with
`model_unavailable` (H-31) and the worker recovers the attempt as a charged, transient failure (§7.9, S-50) until
`worker.max_attempts` is spent.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from pydantic_ai.settings import ModelSettings

if TYPE_CHECKING:
    from pydantic_ai.models import Model

    from .settings import AgentModelSettings

__all__ = ("ModelProblem", "ModelPlan", "plan_model", "build_model")

ModelProblem = Literal["api_key_missing", "provider_not_installed"]


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelPlan:
    """What to build for one agent: everything but the key is from the settings."""

    model_name: str
    base_url: str | None
    api_key: str | None
    """None only for a keyless server at `base_url` (a placeholder is sent, as Pydantic AI does)."""
    settings: ModelSettings

    def __repr__(self) -> str:  # the key never reaches a log line or a traceback's locals through repr()
        return f"ModelPlan(model_name={self.model_name!r}, base_url={self.base_url!r}, api_key=<hidden>)"


def plan_model(settings: AgentModelSettings, environ: Mapping[str, str]) -> ModelPlan | ModelProblem:
    """The model to build from `settings` and the environment, or why it cannot be built (pure)."""
    api_key = environ.get(settings.api_key_env) or None
    if api_key is None and settings.base_url is None:
        return "api_key_missing"  # OpenAI itself always needs a key; a local server at base_url may not
    model_settings = ModelSettings(timeout=settings.timeout, max_retries=settings.max_retries)
    if settings.request_timeout is not None:
        model_settings["request_timeout"] = settings.request_timeout
    return ModelPlan(
        model_name=settings.name.partition(":")[2],
        base_url=settings.base_url,
        api_key=api_key,
        settings=model_settings,
    )


def build_model(plan: ModelPlan) -> Model | Literal["provider_not_installed"]:
    """An `OpenAIChatModel` for `plan`; `provider_not_installed` without the `openai` extra."""
    try:
        from pydantic_ai.models.openai import OpenAIChatModel
        from pydantic_ai.providers.openai import OpenAIProvider
    except ImportError:
        return "provider_not_installed"
    provider: Any = OpenAIProvider(base_url=plan.base_url, api_key=plan.api_key or "api-key-not-set")
    return OpenAIChatModel(plan.model_name, provider=provider, settings=plan.settings)
