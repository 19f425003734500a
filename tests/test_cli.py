"""The `candor` command line: settings refusal and migrations (spec §2.1, §3, §10.3)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from candor.cli import app

runner = CliRunner()


def sqlite_env(tmp_path: Path) -> dict[str, str]:
    return {"CANDOR_DATABASE__URL": f"sqlite:///{tmp_path / 'candor.db'}"}


def test_migrate_check_reports_pending_then_current(tmp_path: Path) -> None:
    """S-123: `migrate --check` changes nothing and exits non-zero while migrations are pending; 0 once applied."""
    env = sqlite_env(tmp_path)
    pending = runner.invoke(app, ["migrate", "--check"], env=env)
    assert pending.exit_code == 1
    again = runner.invoke(app, ["migrate", "--check"], env=env)
    assert again.exit_code == 1  # still pending: --check applied nothing
    assert runner.invoke(app, ["migrate"], env=env).exit_code == 0
    assert runner.invoke(app, ["migrate", "--check"], env=env).exit_code == 0


@pytest.mark.parametrize(
    ("env", "config"),
    [
        ({"CANDOR_WORKER__NOT_A_SETTING": "1"}, None),
        ({}, "[worker]\nlease_seconds = 3\nauthority_seconds = 1\n"),
        ({}, "[nonsense]\nx = 1\n"),
    ],
    ids=["unknown-env-variable", "unsafe-lease-vs-authority", "unknown-section"],
)
def test_bad_settings_refuse_to_start(tmp_path: Path, env: dict[str, str], config: str | None) -> None:
    """S-124, S-56: unknown settings and unsafe combinations refuse with exit code 2 and a clear message."""
    args = ["migrate"]
    if config is not None:
        path = tmp_path / "candor.toml"
        path.write_text(config)
        args += ["--config", str(path)]
    result = runner.invoke(app, args, env={**sqlite_env(tmp_path), **env})
    assert result.exit_code == 2
    assert "invalid settings" in result.output
    assert not (tmp_path / "candor.db").exists()
