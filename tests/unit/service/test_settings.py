"""Settings (§3): sources and their precedence, bounds, unknown keys refused (S-124), unsafe combinations (S-56)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from candor.service.settings import (
    NON_SETTING_VARIABLES,
    OUTBOX_KINDS,
    ServiceSettings,
    SettingsError,
    is_client_variable,
)

KEY = "A" * 43 + "="  # url-safe base64 of 32 bytes


def load(tmp_path: Path, toml: str | None = None, **environ: str) -> ServiceSettings:
    config = None
    if toml is not None:
        config = tmp_path / "candor.toml"
        config.write_text(toml)
    return ServiceSettings.load(config, environ)


def refused(tmp_path: Path, toml: str | None = None, **environ: str) -> SettingsError:
    with pytest.raises(SettingsError) as caught:
        load(tmp_path, toml, **environ).check_startup()
    assert caught.value.code == "invalid_settings"
    return caught.value


def test_defaults(tmp_path: Path) -> None:
    """§3.2 defaults, durations as float seconds and sizes as bytes; the defaults pass the startup checks."""
    settings = load(tmp_path)
    assert settings.server.listen == "127.0.0.1:8080"
    assert settings.server.max_request_bytes == 8 * 1024 * 1024
    assert settings.database.url == "sqlite:///candor.db"
    assert settings.database.auto_migrate is True
    assert settings.database.migration_lock_timeout == 900.0
    assert (settings.worker.slots, settings.worker.max_attempts, settings.worker.lease_seconds) == (64, 3, 30.0)
    assert settings.worker.delivery_bytes == 256 * 1024
    assert settings.control.inbox_bytes == 2 * 1024 * 1024
    assert settings.security.keys == ()
    assert settings.agents == {}
    settings.check_startup()


def test_outbox_policy_defaults_and_shipped_overrides(tmp_path: Path) -> None:
    """§9.8: per-kind defaults plus the shipped overrides for webhook and checkpoint_cleanup."""
    outbox = load(tmp_path).outbox
    webhook, child, cleanup = (outbox.policy(kind) for kind in ("webhook", "child_result", "checkpoint_cleanup"))
    assert webhook.delivered_retention_seconds == 604800 and webhook.max_attempts == 12
    assert child.delivered_retention_seconds == 86400 and child.parallel == 8
    assert cleanup.delivered_retention_seconds == 3600 and cleanup.parallel == 2
    assert set(OUTBOX_KINDS) == {"webhook", "child_result", "checkpoint_cleanup"}


def test_precedence_defaults_file_environment(tmp_path: Path) -> None:
    """§3.1: defaults < TOML file < `CANDOR_<SECTION>__<FIELD>`; names are case-insensitive; sections merge."""
    toml = """
[worker]
slots = 8
lease_seconds = 40

[outbox.defaults]
max_attempts = 5

[outbox.by_kind.webhook]
max_attempts = 20
parallel = 3

[agents.demo]
factory = "examples.demo:build"
"""
    settings = load(
        tmp_path,
        toml,
        CANDOR_WORKER__SLOTS="16",
        candor_database__auto_migrate="false",
        CANDOR_OUTBOX__BY_KIND__WEBHOOK__MAX_ATTEMPTS="30",
        CANDOR_OUTBOX__BY_KIND__CHILD_RESULT__BATCH="7",
        CANDOR_SECURITY__KEYS=f'["{KEY}"]',
    )
    assert settings.worker.slots == 16  # environment beats the file
    assert settings.worker.lease_seconds == 40.0  # the file beats the default, other fields stay
    assert settings.database.auto_migrate is False
    webhook = settings.outbox.policy("webhook")
    assert (webhook.max_attempts, webhook.parallel, webhook.delivered_retention_seconds) == (30, 3, 604800)
    child = settings.outbox.policy("child_result")
    assert (child.max_attempts, child.batch) == (5, 7)  # [outbox.defaults] applies to every kind
    assert settings.outbox.policy("checkpoint_cleanup").parallel == 2
    assert settings.agents["demo"].factory == "examples.demo:build"
    assert [key.get_secret_value() for key in settings.security.keys] == [KEY]


def test_non_setting_variables_are_allowed(tmp_path: Path) -> None:
    """Failpoints and the test database are `CANDOR_` variables that are not settings."""
    assert load(tmp_path, **{name: "x" for name in NON_SETTING_VARIABLES}).worker.slots == 64


@pytest.mark.parametrize(
    "toml",
    [
        "[bogus]\nx = 1\n",
        "[worker]\nslotz = 1\n",
        "[outbox.by_kind.email]\nmax_attempts = 3\n",
        "[outbox.by_kind.webhook]\nretries = 3\n",
        "[outbox.defaults]\nspeed = 3\n",
        '[agents.demo]\nfactory = "a:b"\nextra = 1\n',
        "listen = 1\n",
    ],
)
def test_unknown_keys_in_the_file_are_refused(tmp_path: Path, toml: str) -> None:
    """S-124: an unknown section, field or outbox kind in the TOML file makes startup fail."""
    refused(tmp_path, toml)


@pytest.mark.parametrize(
    "name",
    [
        "CANDOR_WORKER",
        "CANDOR_WORKER_SLOTS",
        "CANDOR_DATABASE_URL",
        "CANDOR_WORKER__SLOTZ",
        "CANDOR_NOPE__SLOTS",
        "CANDOR__WORKER__SLOTS",
        "candor_worker__slotz",
        "CANDOR_OUTBOX__BY_KIND__EMAIL__MAX_ATTEMPTS",
        "CANDOR_OUTBOX__BY_KIND__WEBHOOK__RETRIES",
        "CANDOR_AGENTS__DEMO__FACTORYX",
    ],
)
def test_unknown_environment_variables_are_refused(tmp_path: Path, name: str) -> None:
    """S-124: an unknown `CANDOR_` variable naming a section (or unknown outbox kind in one) makes startup fail;
    so does a section name with one underscore (`CANDOR_DATABASE_URL`, a typo of `CANDOR_DATABASE__URL`)."""
    error = refused(tmp_path, **{name: "3"})
    assert "=3" not in str(error)


@pytest.mark.parametrize("name", ["CANDOR_KEY", "CANDOR_URL", "CANDOR_BOGUS"])
def test_client_variables_are_not_settings(name: str) -> None:
    """S-124 refined by issue 14: `CANDOR_<WORD>` without `__` whose word is no section belongs to clients and
    scripts (the docs' `CANDOR_KEY`): every command accepts it next to the settings."""
    settings = ServiceSettings.load(environ={name: "cnd_secret", "CANDOR_LOG__FORMAT": "json"})
    assert settings.log.format == "json" and is_client_variable(name)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("CANDOR_WORKER__SLOTS", "0"),
        ("CANDOR_WORKER__SLOTS", "4097"),
        ("CANDOR_WORKER__MAX_ATTEMPTS", "21"),
        ("CANDOR_WORKER__LEASE_SECONDS", "2"),
        ("CANDOR_WORKER__LEASE_SECONDS", "301"),
        ("CANDOR_WORKER__SCAN_SECONDS", "0"),
        ("CANDOR_WORKER__AUTHORITY_SECONDS", "31"),
        ("CANDOR_WORKER__DRAIN_SECONDS", "-1"),
        ("CANDOR_WORKER__DELIVERY_COUNT", "0"),
        ("CANDOR_WORKER__DELIVERY_BYTES", "1023"),
        ("CANDOR_OUTBOX__DEFAULTS__MAX_ATTEMPTS", "101"),
        ("CANDOR_OUTBOX__BY_KIND__WEBHOOK__LEASE_SECONDS", "9"),
        ("CANDOR_OUTBOX__BY_KIND__CHILD_RESULT__LEASE_SECONDS", "601"),
        ("CANDOR_SERVER__LISTEN", "localhost"),
        ("CANDOR_AGENTS__DEMO__FACTORY", "no_colon"),
        ("CANDOR_WORKER__SLOTS", "four"),
    ],
)
def test_bounds(tmp_path: Path, name: str, value: str) -> None:
    """§3.2 and §9.8 bounds."""
    refused(tmp_path, **{name: value})


def test_security_keys_must_be_fernet_keys_and_are_never_echoed(tmp_path: Path) -> None:
    """`security.keys` are url-safe base64 of 32 bytes; an error names the key's position, never its value."""
    error = refused(tmp_path, CANDOR_SECURITY__KEYS='["top-secret-value"]')
    assert "top-secret-value" not in str(error)
    assert "security.keys" in str(error)


@pytest.mark.parametrize(
    ("environ", "names"),
    [
        ({"CANDOR_WORKER__AUTHORITY_SECONDS": "10"}, ["worker.authority_seconds", "worker.lease_seconds"]),
        ({"CANDOR_WORKER__LEASE_SECONDS": "15"}, ["database.timeout", "worker.lease_seconds"]),
        ({"CANDOR_DATABASE__TIMEOUT": "10"}, ["database.timeout"]),
        ({"CANDOR_CONTROL__WEBHOOK_TIMEOUT": "30"}, ["control.webhook_timeout", "webhook.lease_seconds"]),
        ({"CANDOR_OUTBOX__BY_KIND__WEBHOOK__LEASE_SECONDS": "20"}, ["control.webhook_timeout"]),
        ({"CANDOR_WORKER__DRAIN_SECONDS": "15"}, ["worker.drain_seconds", "server.shutdown_timeout"]),
        ({"CANDOR_SERVER__SHUTDOWN_TIMEOUT": "5"}, ["worker.drain_seconds"]),
        ({"CANDOR_WORKER__OUTPUT_BYTES": str(2 * 1024 * 1024 - 64 * 1024 + 1)}, ["worker.output_bytes"]),
        ({"CANDOR_CONTROL__INBOX_BYTES": str(1024 * 1024)}, ["control.inbox_bytes"]),
    ],
)
def test_unsafe_combinations_are_refused(tmp_path: Path, environ: dict[str, str], names: list[str]) -> None:
    """S-56: each §3.3 inequality refuses startup, and the message names the settings involved."""
    error = refused(tmp_path, **environ)
    for name in names:
        assert name in str(error)


@pytest.mark.parametrize(
    "environ",
    [
        {"CANDOR_WORKER__AUTHORITY_SECONDS": "9.9"},  # 3 × 9.9 < 30
        {"CANDOR_WORKER__OUTPUT_BYTES": str(2 * 1024 * 1024 - 64 * 1024)},  # equality is allowed
        {"CANDOR_WORKER__DRAIN_SECONDS": "14.5"},
    ],
)
def test_boundary_combinations_are_accepted(tmp_path: Path, environ: dict[str, str]) -> None:
    """S-56: values just inside the §3.3 bounds start."""
    load(tmp_path, **environ).check_startup()


def test_missing_or_broken_config_file(tmp_path: Path) -> None:
    with pytest.raises(SettingsError):
        ServiceSettings.load(tmp_path / "absent.toml", {})
    (tmp_path / "bad.toml").write_text("[worker\n")
    with pytest.raises(SettingsError):
        ServiceSettings.load(tmp_path / "bad.toml", {})


def test_direct_construction_ignores_the_environment(monkeypatch: Any) -> None:
    """Only `load()` reads variables; building settings in code uses its arguments and the defaults."""
    monkeypatch.setenv("CANDOR_WORKER__SLOTS", "9")
    assert ServiceSettings().worker.slots == 64
    assert ServiceSettings(worker={"slots": 2}).worker.slots == 2
