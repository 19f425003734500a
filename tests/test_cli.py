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


def test_bootstrap_once_then_refuses(tmp_path: Path) -> None:
    """S-130: bootstrap prints {workspace_id, key_id, secret} once, stores only a hash, and refuses afterwards."""
    import json

    env = sqlite_env(tmp_path)
    assert runner.invoke(app, ["migrate"], env=env).exit_code == 0
    first = runner.invoke(app, ["bootstrap"], env=env)
    assert first.exit_code == 0, first.output
    printed = json.loads(first.stdout.strip().splitlines()[-1])
    assert set(printed) == {"workspace_id", "key_id", "secret"}
    assert printed["secret"] not in (tmp_path / "candor.db").read_bytes().decode("latin-1")
    again = runner.invoke(app, ["bootstrap"], env=env)
    assert again.exit_code != 0
    listed = json.loads(runner.invoke(app, ["workspace", "list"], env=env).stdout.strip().splitlines()[-1])
    assert [w["workspace_id"] for w in listed] == [printed["workspace_id"]]


def test_bootstrap_refuses_a_database_that_is_not_migrated(tmp_path: Path) -> None:
    """S-122: no process, bootstrap included, operates on a schema that is not the build's."""
    result = runner.invoke(app, ["bootstrap"], env=sqlite_env(tmp_path))
    assert result.exit_code != 0


def test_workspace_and_key_commands(tmp_path: Path) -> None:
    """S-130, §4.4: workspace create/archive and key create/disable print JSON; the key secret is shown once."""
    import json

    env = sqlite_env(tmp_path)
    runner.invoke(app, ["migrate"], env=env)
    created = json.loads(runner.invoke(app, ["workspace", "create", "acme"], env=env).stdout.strip())
    key = json.loads(
        runner.invoke(
            app, ["key", "create", "--workspace", created["workspace_id"], "--permissions", "read,run"], env=env
        ).stdout.strip()
    )
    assert key["permissions"] == ["read", "run"] and key["secret"]
    disabled = json.loads(runner.invoke(app, ["key", "disable", key["key_id"]], env=env).stdout.strip())
    assert disabled["disabled_at"] is not None
    archived = json.loads(runner.invoke(app, ["workspace", "archive", created["workspace_id"]], env=env).stdout.strip())
    assert archived["archived_at"] is not None
    unknown = runner.invoke(app, ["key", "create", "--workspace", "wsp_" + "0" * 32], env=env)
    assert unknown.exit_code == 1
