"""Where settings come from: defaults < TOML file < `CANDOR_<SECTION>__<FIELD>` variables (spec §3.1).

`ServiceSettings.load()` (settings.py) sets a `LoadRequest` for the duration of one construction; its
`settings_customise_sources` hook then reads `configured_sources()`. Without a request (direct construction) only
the constructor's arguments count. `describe()` turns a validation error into setting paths and reasons.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError
from pydantic_settings import BaseSettings, EnvSettingsSource, PydanticBaseSettingsSource, TomlConfigSettingsSource
from pydantic_settings.sources.utils import parse_env_vars

__all__ = (
    "ENV_PREFIX",
    "ENV_DELIMITER",
    "NON_SETTING_VARIABLES",
    "LoadRequest",
    "LOAD_REQUEST",
    "configured_sources",
    "describe",
)

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


@dataclass(frozen=True, slots=True)
class LoadRequest:
    """What one `ServiceSettings.load()` reads."""

    config_file: Path | None
    environ: Mapping[str, str]


LOAD_REQUEST: ContextVar[LoadRequest | None] = ContextVar("candor_settings_load", default=None)


class _MappingEnvSource(EnvSettingsSource):
    """The environment source, reading a given mapping instead of `os.environ` (tests pass their own)."""

    def __init__(self, settings_cls: type[BaseSettings], environ: Mapping[str, str]) -> None:
        self._environ = {key: value for key, value in environ.items() if key.upper() not in NON_SETTING_VARIABLES}
        super().__init__(settings_cls)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        return parse_env_vars(self._environ, self.case_sensitive, self.env_ignore_empty, self.env_parse_none_str)


def configured_sources(
    settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource
) -> tuple[PydanticBaseSettingsSource, ...]:
    """The sources of the current `LoadRequest`, first one winning; only `init_settings` outside `load()`."""
    request = LOAD_REQUEST.get()
    if request is None:
        return (init_settings,)
    # First source wins: environment, then the TOML file, then the field defaults (§3.1).
    sources: list[PydanticBaseSettingsSource] = [_MappingEnvSource(settings_cls, request.environ)]
    if request.config_file is not None:
        sources.append(TomlConfigSettingsSource(settings_cls, toml_file=request.config_file))
    return tuple(sources)


def describe(exc: ValidationError) -> str:
    """Setting paths and reasons only: submitted values (possibly secrets) are never echoed."""
    problems = []
    for error in exc.errors(include_input=False, include_url=False):
        path = ".".join(str(part) for part in error["loc"]) or "settings"
        reason = "unknown setting" if error["type"] == "extra_forbidden" else error["msg"]
        problems.append(f"{path}: {reason}")
    return "; ".join(problems)
