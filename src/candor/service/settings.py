"""Service settings (spec §3): defaults < TOML file < `CANDOR_<SECTION>__<FIELD>` variables; unknown keys refused.

Durations are float seconds and byte sizes are ints. Every model forbids extra keys, so an unknown section, field
or outbox kind fails validation (S-124); `ServiceSettings.load()` also refuses any `CANDOR_` variable that does not
name a setting, except the few non-setting variables in `NON_SETTING_VARIABLES`. `check_startup()` enforces the
cross-setting checks of §3.3 (S-56). `database.url` keeps the operator's spelling (`sqlite:///…`,
`postgresql://…`); store/engine.py maps it to an async driver.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)
from pydantic_settings.sources.utils import parse_env_vars

from .errors import SettingsError
from .protocol.children import unknown_child_agents
from .protocol.tool_recovery import DEFAULT_TOOL_RECOVERY, effective_tool_recovery

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
    "is_client_variable",
    "AgentSettings",
    "AgentModelSettings",
    "SettingsError",
    "ENV_PREFIX",
    "NON_SETTING_VARIABLES",
)

KiB = 1024
MiB = 1024 * KiB

ENV_PREFIX = "CANDOR_"
ENV_DELIMITER = "__"

NON_SETTING_VARIABLES = frozenset(
    {
        "CANDOR_FAILPOINTS",
        "CANDOR_TEST_POSTGRES_URL",
        "CANDOR_REQUIRE_POSTGRES",
        "CANDOR_DEMO_LEDGER",
        "CANDOR_DEMO_CRASH_AFTER",
    }
)
"""`CANDOR_` variables that are not settings (failpoints, the test database, the default demo agents' ledger and
crash point); allowed next to the settings."""

OutboxKind = Literal["webhook", "child_result", "checkpoint_cleanup"]
OUTBOX_KINDS: tuple[OutboxKind, ...] = get_args(OutboxKind)


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


class ServerSettings(_Section):
    """`[server]`: the HTTP listener."""

    listen: str = "127.0.0.1:8080"
    """HTTP listen address, `host:port`."""
    readiness_timeout: float = Field(2.0, gt=0)
    """Limit for the schema check behind `/readyz`."""
    shutdown_timeout: float = Field(15.0, gt=0)
    """Time allowed for a graceful stop."""
    max_request_bytes: int = Field(8 * MiB, ge=1)
    """Larger request bodies answer 413."""
    event_loop: Literal["uvloop", "asyncio"] = "uvloop"
    """The event loop `candor serve` runs on: uvloop (libuv; less CPU per request and per database round trip) or
    the standard library's asyncio loop."""
    http_parser: Literal["httptools", "h11"] = "httptools"
    """uvicorn's HTTP/1.1 implementation: httptools (C parser) or h11 (pure Python)."""

    @field_validator("listen")
    @classmethod
    def _host_port(cls, value: str) -> str:
        host, sep, port = value.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError("must be host:port with a port between 1 and 65535")
        return value


class DatabaseSettings(_Section):
    """`[database]`: the backend (§2.2) and its migrations (§10.3)."""

    url: str = Field("sqlite:///candor.db", min_length=1)
    """`sqlite:///path` or `postgresql://…`."""
    auto_migrate: bool = True
    """`control` and `all` processes migrate at startup."""
    migration_lock_timeout: float = Field(900.0, gt=0)
    """Longest wait for the migration lock."""
    timeout: float = Field(5.0, gt=0)
    """Statement timeout; also the safety margin before a lease deadline (S-25)."""
    pool_size: int = Field(10, ge=1, le=1000)
    """PostgreSQL connections each process keeps open in its pool (SQLite ignores it)."""
    max_overflow: int = Field(10, ge=0, le=1000)
    """PostgreSQL connections a process may open beyond `pool_size` under load; each is closed again when it is
    returned while the pool is full, so a busy process that keeps needing them pays a new connection every time."""


class WorkerSettings(_Section):
    """`[worker]`: claiming, leases, checkpoints and streams."""

    slots: int = Field(4, ge=1, le=128)
    max_attempts: int = Field(3, ge=1, le=20)
    """Charged attempts per run; copied onto each run at acceptance (S-10)."""
    lease_seconds: float = Field(30.0, ge=3, le=300)
    scan_seconds: float = Field(1.0, gt=0, le=30)
    authority_seconds: float = Field(1.0, gt=0, le=30)
    """Supervisor heartbeat period; also the `expire_leases` period."""
    drain_seconds: float = Field(10.0, ge=0, le=300)
    delivery_count: int = Field(8, ge=1)
    delivery_bytes: int = Field(256 * KiB, ge=1 * KiB)
    output_bytes: int = Field(1 * MiB, ge=1)
    envelope_bytes: int = Field(1 * MiB, ge=1)
    stream_length: int = Field(10000, ge=1)
    stream_ttl: float = Field(600.0, gt=0)
    stream_coalesce_seconds: float = Field(0.1, ge=0)
    stream_trim_seconds: float = Field(10.0, gt=0)
    child_depth: int = Field(4, ge=0)
    child_count: int = Field(16, ge=0)


class ControlSettings(_Section):
    """`[control]`: sweeps, inbox limits and webhooks."""

    scan_seconds: float = Field(1.0, gt=0)
    """Period of `advance_threads` and `deliver_outbox`."""
    sweep_batch: int = Field(100, ge=1)
    inbox_count: int = Field(128, ge=1)
    inbox_bytes: int = Field(2 * MiB, ge=1)
    subscriptions: int = Field(32, ge=0)
    webhook_timeout: float = Field(10.0, gt=0)
    webhook_allow_insecure: bool = False


class OutboxKindPolicy(_Section):
    """The per-kind outbox policy of §9.8 with its defaults and bounds (`[outbox.defaults]`)."""

    max_attempts: int = Field(12, ge=1, le=100)
    batch: int = Field(32, ge=1)
    parallel: int = Field(8, ge=1)
    lease_seconds: float = Field(60.0, ge=10, le=600)
    backlog_count: int = Field(10000, ge=1)
    backlog_age_seconds: float = Field(300.0, gt=0)
    backlog_alert_seconds: float = Field(300.0, ge=0)
    delivered_retention_seconds: float = Field(86400.0, ge=0)
    dead_retention_seconds: float = Field(1209600.0, ge=0)


class OutboxKindOverride(_Section):
    """`[outbox.by_kind.<kind>]`: the fields set here replace the defaults for that kind; same bounds."""

    max_attempts: int | None = Field(None, ge=1, le=100)
    batch: int | None = Field(None, ge=1)
    parallel: int | None = Field(None, ge=1)
    lease_seconds: float | None = Field(None, ge=10, le=600)
    backlog_count: int | None = Field(None, ge=1)
    backlog_age_seconds: float | None = Field(None, gt=0)
    backlog_alert_seconds: float | None = Field(None, ge=0)
    delivered_retention_seconds: float | None = Field(None, ge=0)
    dead_retention_seconds: float | None = Field(None, ge=0)

    def set_values(self) -> dict[str, Any]:
        return {name: value for name, value in self.model_dump().items() if value is not None}


SHIPPED_OUTBOX_OVERRIDES: Mapping[OutboxKind, Mapping[str, Any]] = {
    "webhook": {"delivered_retention_seconds": 604800.0},
    "child_result": {},
    "checkpoint_cleanup": {"delivered_retention_seconds": 3600.0, "parallel": 2},
}
"""§9.8 shipped overrides: applied over `outbox.defaults`, below any configured `outbox.by_kind` value."""


class OutboxSettings(_Section):
    """`[outbox]`: purge pacing plus per-kind policy (§9.8)."""

    purge_interval_seconds: float = Field(60.0, gt=0)
    purge_batch: int = Field(1000, ge=1)
    purge_budget_seconds: float = Field(5.0, gt=0)
    defaults: OutboxKindPolicy = Field(default_factory=OutboxKindPolicy)
    by_kind: dict[OutboxKind, OutboxKindOverride] = Field(default_factory=dict)
    """Configured overrides only; an unknown kind fails validation (S-124)."""

    def policy(self, kind: OutboxKind) -> OutboxKindPolicy:
        """The effective policy of `kind`: defaults, then shipped overrides, then configured ones."""
        if kind not in OUTBOX_KINDS:
            raise KeyError(kind)
        values = self.defaults.model_dump()
        values.update(SHIPPED_OUTBOX_OVERRIDES[kind])
        configured = self.by_kind.get(kind)
        if configured is not None:
            values.update(configured.set_values())
        return OutboxKindPolicy.model_validate(values)


class LogSettings(_Section):
    """`[log]`: what `candor serve` writes to stderr: one line per HTTP request, admin write and attempt event."""

    level: Literal["debug", "info", "warning", "error"] = "info"
    format: Literal["text", "json"] = "text"
    """`text`: `time level logger message key=value …`; `json`: one JSON object per line."""


class SecuritySettings(_Section):
    """`[security]`: the key ring for webhook signing secrets (Fernet keys; first encrypts, all decrypt)."""

    keys: tuple[SecretStr, ...] = ()

    @field_validator("keys")
    @classmethod
    def _fernet_keys(cls, value: tuple[SecretStr, ...]) -> tuple[SecretStr, ...]:
        for position, key in enumerate(value):
            try:
                raw = base64.urlsafe_b64decode(key.get_secret_value().encode("ascii"))
            except (binascii.Error, UnicodeEncodeError, ValueError):
                raw = b""
            if len(raw) != 32:
                # The message names the position only: a key never appears in an error.
                raise ValueError(f"key {position} is not url-safe base64 of 32 bytes (a Fernet key)")
        return value


_FACTORY = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
MODEL_PROVIDERS = ("openai", "openai-chat")
"""Provider prefixes of `agents.<name>.model.name` the service can build (docs/providers.md)."""


class AgentModelSettings(_Section):
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


class AgentSettings(_Section):
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


@dataclass(frozen=True, slots=True)
class _LoadRequest:
    config_file: Path | None
    environ: Mapping[str, str]


_LOAD_REQUEST: ContextVar[_LoadRequest | None] = ContextVar("candor_settings_load", default=None)


class _MappingEnvSource(EnvSettingsSource):
    """The environment source, reading a given mapping instead of `os.environ` (tests pass their own)."""

    def __init__(self, settings_cls: type[BaseSettings], environ: Mapping[str, str]) -> None:
        self._environ = {key: value for key, value in environ.items() if key.upper() not in NON_SETTING_VARIABLES}
        super().__init__(settings_cls)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        return parse_env_vars(self._environ, self.case_sensitive, self.env_ignore_empty, self.env_parse_none_str)


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
        request = _LOAD_REQUEST.get()
        if request is None:
            return (init_settings,)
        # First source wins: environment, then the TOML file, then the field defaults (§3.1).
        sources: list[PydanticBaseSettingsSource] = [_MappingEnvSource(settings_cls, request.environ)]
        if request.config_file is not None:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=request.config_file))
        return tuple(sources)

    @classmethod
    def load(cls, config_file: Path | None = None, environ: Mapping[str, str] | None = None) -> ServiceSettings:
        """Read defaults, then `config_file` (TOML), then `CANDOR_*` variables; raise `SettingsError` if invalid."""
        environ = os.environ if environ is None else environ
        _refuse_unknown_variables(environ)
        if config_file is not None:
            config_file = Path(config_file)
            if not config_file.is_file():
                raise SettingsError(f"config file {str(config_file)!r} does not exist or is not a file")
        token = _LOAD_REQUEST.set(_LoadRequest(config_file=config_file, environ=environ))
        try:
            return cls()
        except ValidationError as exc:
            raise SettingsError(_describe(exc)) from None
        except ValueError as exc:  # TOML syntax errors and undecodable JSON values from the environment
            raise SettingsError(f"settings could not be read: {type(exc).__name__}") from None
        finally:
            _LOAD_REQUEST.reset(token)

    def tool_recovery_for(self, agent: str, options: Mapping[str, Any] | None) -> str:
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


def _describe(exc: ValidationError) -> str:
    """Setting paths and reasons only: submitted values (possibly secrets) are never echoed."""
    problems = []
    for error in exc.errors(include_input=False, include_url=False):
        path = ".".join(str(part) for part in error["loc"]) or "settings"
        reason = "unknown setting" if error["type"] == "extra_forbidden" else error["msg"]
        problems.append(f"{path}: {reason}")
    return "; ".join(problems)
