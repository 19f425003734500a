"""Service settings (spec §3): `ServiceSettings`, its loading and the startup checks; unknown keys refused.

`ServiceSettings.load()` reads defaults < TOML file < `CANDOR_<SECTION>__<FIELD>` variables (settings_sources.py)
and also refuses any `CANDOR_` variable that does not name a setting, except the few non-setting variables in
`NON_SETTING_VARIABLES`. Every model forbids extra keys, so an unknown section, field or outbox kind fails
validation (S-124); the sections are in settings_sections.py and settings_agents.py. `check_startup()` enforces
the cross-setting checks of §3.3 (S-56). `database.url` keeps the operator's spelling (`sqlite:///…`,
`postgresql://…`); store/db/engine.py maps it to an async driver. This module is the settings' home: every name
below is imported from here.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, ValidationError
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from .errors import SettingsError
from .protocol.children import unknown_child_agents
from .protocol.tool_recovery import DEFAULT_TOOL_RECOVERY, ToolRecovery, effective_tool_recovery
from .settings_agents import AgentModelSettings, AgentSettings
from .settings_sections import (
    OUTBOX_KINDS,
    SHIPPED_OUTBOX_OVERRIDES,
    ControlSettings,
    DatabaseSettings,
    KiB,
    LogSettings,
    OutboxKind,
    OutboxKindOverride,
    OutboxKindPolicy,
    OutboxSettings,
    SecuritySettings,
    ServerSettings,
    TelemetrySettings,
    WorkerSettings,
)
from .settings_sources import (
    ENV_DELIMITER,
    ENV_PREFIX,
    LOAD_REQUEST,
    NON_SETTING_VARIABLES,
    LoadRequest,
    configured_sources,
    describe,
)

__all__ = (
    "ServiceSettings",
    "ServerSettings",
    "DatabaseSettings",
    "WorkerSettings",
    "ControlSettings",
    "OutboxSettings",
    "OutboxKindPolicy",
    "OutboxKindOverride",
    "OutboxKind",
    "OUTBOX_KINDS",
    "SHIPPED_OUTBOX_OVERRIDES",
    "SecuritySettings",
    "LogSettings",
    "TelemetrySettings",
    "is_client_variable",
    "AgentSettings",
    "AgentModelSettings",
    "SettingsError",
    "ENV_PREFIX",
    "NON_SETTING_VARIABLES",
)


class ServiceSettings(BaseSettings):
    """Every setting of spec §3.2. Build it with `load()`; direct construction uses only its arguments."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter=ENV_DELIMITER,
        case_sensitive=False,
        extra="forbid",
        frozen=True,
        validate_default=True,
    )

    server: ServerSettings = Field(default_factory=ServerSettings)
    database: DatabaseSettings = Field(default_factory=DatabaseSettings)
    worker: WorkerSettings = Field(default_factory=WorkerSettings)
    control: ControlSettings = Field(default_factory=ControlSettings)
    outbox: OutboxSettings = Field(default_factory=OutboxSettings)
    security: SecuritySettings = Field(default_factory=SecuritySettings)
    log: LogSettings = Field(default_factory=LogSettings)
    telemetry: TelemetrySettings = Field(default_factory=TelemetrySettings)
    agents: dict[str, AgentSettings] = Field(default_factory=dict)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return configured_sources(settings_cls, init_settings)

    @classmethod
    def load(cls, config_file: Path | None = None, environ: Mapping[str, str] | None = None) -> ServiceSettings:
        """Read defaults, then `config_file` (TOML), then `CANDOR_*` variables; raise `SettingsError` if invalid."""
        environ = os.environ if environ is None else environ
        _refuse_unknown_variables(environ)
        if config_file is not None:
            config_file = Path(config_file)
            if not config_file.is_file():
                raise SettingsError(f"config file {str(config_file)!r} does not exist or is not a file")
        token = LOAD_REQUEST.set(LoadRequest(config_file=config_file, environ=environ))
        try:
            return cls()
        except ValidationError as exc:
            raise SettingsError(describe(exc)) from None
        except ValueError as exc:  # TOML syntax errors and undecodable JSON values from the environment
            raise SettingsError(f"settings could not be read: {type(exc).__name__}") from None
        finally:
            LOAD_REQUEST.reset(token)

    def tool_recovery_for(self, agent: str, options: Mapping[str, Any] | None) -> ToolRecovery:
        """The `tool_recovery` a run of `agent` with `options` is accepted with: its option, else the agent's."""
        section = self.agents.get(agent)
        agent_default = section.tool_recovery if section is not None else DEFAULT_TOOL_RECOVERY
        return effective_tool_recovery(options, agent_default)

    def check_startup(self) -> None:
        """The cross-setting checks of §3.3 (S-56); raises one `SettingsError` naming every violated pair."""
        webhook_lease = self.outbox.policy("webhook").lease_seconds
        problems = [
            message
            for holds, message in (
                (
                    3 * self.worker.authority_seconds < self.worker.lease_seconds,
                    "3 × worker.authority_seconds must be less than worker.lease_seconds",
                ),
                (
                    3 * self.database.timeout < self.worker.lease_seconds,
                    "3 × database.timeout must be less than worker.lease_seconds",
                ),
                (
                    2 * self.control.webhook_timeout < webhook_lease,
                    "2 × control.webhook_timeout must be less than outbox.by_kind.webhook.lease_seconds",
                ),
                (
                    self.worker.drain_seconds < self.server.shutdown_timeout,
                    "worker.drain_seconds must be less than server.shutdown_timeout",
                ),
                (
                    self.worker.output_bytes + 64 * KiB <= self.control.inbox_bytes,
                    "worker.output_bytes + 64 KiB must not exceed control.inbox_bytes",
                ),
            )
            if not holds
        ]
        children = {name: section.children for name, section in self.agents.items()}
        problems += [
            f"agents.{name}.children names {child!r}, which is not a configured agent"
            for name, child in unknown_child_agents(children, self.agents)
        ]
        if problems:
            raise SettingsError("unsafe settings: " + "; ".join(problems))


def _section_fields() -> dict[str, type[BaseModel] | None]:
    """Section name → its model (None for `agents`, whose keys are free-form agent names)."""
    return {
        "server": ServerSettings,
        "database": DatabaseSettings,
        "worker": WorkerSettings,
        "control": ControlSettings,
        "outbox": OutboxSettings,
        "security": SecuritySettings,
        "log": LogSettings,
        "telemetry": TelemetrySettings,
        "agents": None,
    }


def is_client_variable(name: str) -> bool:
    """Whether a `CANDOR_` variable is left to clients and scripts (`CANDOR_KEY`, `CANDOR_URL`): no `__` and no
    setting section as its first word. `CANDOR_DATABASE_URL` (a settings typo) is not one: it is refused."""
    rest = name.upper()[len(ENV_PREFIX) :]
    return ENV_DELIMITER not in rest and not any(
        rest == section.upper() or rest.startswith(section.upper() + "_") for section in _section_fields()
    )


def _refuse_unknown_variables(environ: Mapping[str, str]) -> None:
    """S-124: every `CANDOR_` variable that names a setting section must be `CANDOR_<SECTION>__<FIELD>…` naming a
    known field. Variables without `__` whose first word is no section are the clients' (`is_client_variable`)."""
    sections = _section_fields()
    unknown: list[str] = []
    for name in environ:
        upper = name.upper()
        if not upper.startswith(ENV_PREFIX) or upper in NON_SETTING_VARIABLES or is_client_variable(upper):
            continue
        parts = upper[len(ENV_PREFIX) :].lower().split(ENV_DELIMITER)
        if len(parts) < 2 or parts[0] not in sections or not all(parts):
            unknown.append(name)
            continue
        model = sections[parts[0]]
        if model is not None and parts[1] not in model.model_fields:
            unknown.append(name)
    # Deeper paths (outbox kinds, agent fields) are refused by the models' extra="forbid" and the kind literal.
    if unknown:
        raise SettingsError("unknown CANDOR_ variables: " + ", ".join(sorted(unknown)))
