"""The `candor` command line: settings refusal and migrations (spec §2.1, §3, §10.3)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

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


def _line(result: Any) -> str:
    lines: list[str] = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("candor: "), result.output
    assert "Traceback" not in result.output
    return lines[0]


@pytest.mark.parametrize(
    ("env", "code", "text"),
    [
        ({"CANDOR_DATABASE__URL": "mysql://u@h/db"}, 2, "invalid settings: database.url: unsupported"),
        ({"CANDOR_DATABASE__URL": "sqlite:///:memory:"}, 2, "invalid settings: database.url"),
        (
            {"CANDOR_DATABASE__URL": "postgresql://postgres@127.0.0.1:1/none", "CANDOR_DATABASE__TIMEOUT": "1"},
            3,
            "database unreachable at 127.0.0.1:1/none (",
        ),
        ({"CANDOR_WORKER__NOPE": "1"}, 2, "invalid settings: unknown CANDOR_ variables: CANDOR_WORKER__NOPE"),
    ],
    ids=["bad-scheme", "in-memory-sqlite", "unreachable", "unknown-setting"],
)
@pytest.mark.parametrize("command", [["migrate", "--check"], ["migrate"], ["bootstrap"], ["workspace", "list"]])
def test_every_command_fails_with_one_line_and_a_distinct_exit_code(
    tmp_path: Path, env: dict[str, str], code: int, text: str, command: list[str]
) -> None:
    """S-124 (issue 14): 2 invalid settings (a bad URL too), 3 database unreachable (naming host, port and
    database, issue 35); one clean line, no traceback, never "invalid settings: invalid settings:"."""
    result = runner.invoke(app, command, env={**sqlite_env(tmp_path), **env})
    assert result.exit_code == code
    line = _line(result)
    assert text in line and line.count("invalid settings") <= 1


def test_client_variables_do_not_stop_commands(tmp_path: Path) -> None:
    """S-124 refined by issue 14: the docs' `CANDOR_KEY` is the client's, not an unknown setting."""
    env = sqlite_env(tmp_path) | {"CANDOR_KEY": "cnd_x"}
    assert runner.invoke(app, ["migrate"], env=env).exit_code == 0
    check = runner.invoke(app, ["migrate", "--check"], env=env)
    assert check.exit_code == 0, check.output


def test_migrate_check_on_a_fresh_database_is_one_line(tmp_path: Path) -> None:
    """S-123: pending → exit 1 with one line naming the build's head and the fix."""
    result = runner.invoke(app, ["migrate", "--check"], env=sqlite_env(tmp_path))
    assert result.exit_code == 1 and "candor migrate" in _line(result)


def test_keys_list_enable_and_refuse_bad_permissions(tmp_path: Path) -> None:
    """§4.4: `key list` and `key enable`; `--permissions ""` and unknown permissions refuse (exit 2, naming the
    unknown one); timestamps are RFC 3339 like the HTTP API."""
    import json

    env = sqlite_env(tmp_path)
    runner.invoke(app, ["migrate"], env=env)
    boot = json.loads(runner.invoke(app, ["bootstrap"], env=env).stdout)
    workspace = boot["workspace_id"]
    empty = runner.invoke(app, ["key", "create", "--workspace", workspace, "--permissions", ""], env=env)
    assert empty.exit_code == 2 and "at least one" in _line(empty)
    bogus = runner.invoke(app, ["key", "create", "--workspace", workspace, "--permissions", "read,root"], env=env)
    assert bogus.exit_code == 2 and "'root'" in _line(bogus)
    disabled = json.loads(runner.invoke(app, ["key", "disable", boot["key_id"]], env=env).stdout)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", disabled["disabled_at"])
    enabled = json.loads(runner.invoke(app, ["key", "enable", boot["key_id"]], env=env).stdout)
    assert enabled["disabled_at"] is None
    listed = json.loads(runner.invoke(app, ["key", "list", "--workspace", workspace], env=env).stdout)
    assert [key["key_id"] for key in listed] == [boot["key_id"]] and "secret" not in listed[0]
    missing = runner.invoke(app, ["key", "enable", "key_" + "0" * 32], env=env)
    assert missing.exit_code == 1 and "not_found" in _line(missing)


def test_version_and_clean_help() -> None:
    """`candor --version`; every `--help` is plain text without internal spec references or type noise."""
    assert runner.invoke(app, ["--version"]).stdout.startswith("candor ")
    commands = [
        [],
        ["migrate"],
        ["serve"],
        ["bootstrap"],
        ["workspace"],
        ["workspace", "create"],
        ["key"],
        ["key", "create"],
        ["key", "list"],
        ["key", "enable"],
        ["key", "disable"],
    ]
    for command in commands:
        result = runner.invoke(app, [*command, "--help"])
        assert result.exit_code == 0, command
        assert "§" not in result.output and not re.search(r"\b[SH]-\d+", result.output), command
        assert "<bool>" not in result.output and "<path>" not in result.output, command
