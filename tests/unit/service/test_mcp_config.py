"""`[agents.<name>.mcp.<server>]` (issue 36, docs/mcp.md): the settings, the toolsets an attempt gets, and the run
view's recovery basis."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from candor.mcp import RecoverableMCP
from candor.service.agents import AgentRegistry, AgentUnavailable
from candor.service.mcp_toolsets import plan_servers
from candor.service.protocol.recovered import RecoveredCall, with_basis
from candor.service.settings import AgentSettings, ServiceSettings
from candor.service.settings_mcp import AgentMcpSettings

FACTORY = "candor.demo.support:support_harness"


@pytest.mark.parametrize(
    ("section", "problem"),
    [
        ({"command": "python", "args": ["server.py"]}, None),
        ({"url": "https://tools.example.com/mcp", "headers_env": {"Authorization": "CRM_TOKEN"}}, None),
        ({"command": "npx", "retry_safe": ["search"], "never_retry": ["send_email"]}, None),
        ({}, "exactly one of command"),
        ({"command": "python", "url": "http://x/mcp"}, "exactly one of command"),
        ({"url": "http://user:pw@x/mcp"}, "without credentials"),
        ({"url": "http://x/mcp?token=1"}, "without credentials"),
        ({"url": "http://x/mcp", "args": ["a"]}, "apply to a stdio server"),
        ({"command": "python", "headers_env": {"Authorization": "T"}}, "applies to a streamable-HTTP server"),
        ({"command": "python", "retry_safe": ["a"], "never_retry": ["a"]}, "both retry_safe and never_retry"),
        ({"command": "python", "env": ["not a name"]}, "not an environment variable name"),
        ({"command": "python", "env": ["CANDOR_DATABASE__URL"]}, "must not start with CANDOR_"),
        ({"url": "http://x/mcp", "headers_env": {"Bad Header": "T"}}, "not an HTTP header name"),
        ({"command": " "}, "must not be blank"),
        ({"command": "python", "timeout": 0}, "greater than 0"),
        ({"command": "python", "password": "x"}, "Extra inputs are not permitted"),  # S-124
    ],
)
def test_server_settings(section: dict[str, Any], problem: str | None) -> None:
    """S-124, issue 36 item 1: one transport per server, no credentials in settings, consistent overrides."""
    if problem is None:
        AgentMcpSettings.model_validate(section)
        return
    with pytest.raises(ValidationError, match=problem):
        AgentMcpSettings.model_validate(section)


def test_server_names_are_checked() -> None:
    """The server name is the suffix of its checkpoint namespace: a short lowercase name."""
    AgentSettings.model_validate({"factory": FACTORY, "mcp": {"crm-2": {"command": "python"}}})
    with pytest.raises(ValidationError, match="MCP server name"):
        AgentSettings.model_validate({"factory": FACTORY, "mcp": {"CRM server": {"command": "python"}}})


def test_servers_load_from_the_settings_file(tmp_path: Path) -> None:
    """Issue 36 item 1: the TOML shape of docs/mcp.md."""
    config = tmp_path / "candor.toml"
    config.write_text(
        '[agents.support]\nfactory = "candor.demo.support:support_harness"\n'
        '[agents.support.mcp.crm]\nurl = "http://127.0.0.1:8931/mcp"\nnever_retry = ["send_email"]\n'
        '[agents.support.mcp.files]\ncommand = "python"\nargs = ["-m", "files_server"]\nretry_safe = ["list"]\n'
    )
    settings = ServiceSettings.load(config, {})
    servers = settings.agents["support"].mcp
    assert servers["crm"].never_retry == ("send_email",) and servers["files"].args == ("-m", "files_server")


def test_plan_reads_secrets_from_the_environment_only() -> None:
    """Issue 36 item 2: header values and passed variables come from the environment when an attempt starts; an
    unset header variable is a missing credential, an unset `env` variable is simply not passed."""
    http = AgentMcpSettings(url="http://x/mcp", headers_env={"Authorization": "CRM_TOKEN"})
    stdio = AgentMcpSettings(command="python", env=("HOME", "UNSET_VAR"))
    plans = plan_servers({"crm": http, "files": stdio}, {"CRM_TOKEN": "Bearer s3cret", "HOME": "/root"})
    assert not isinstance(plans, str)
    assert [(p.name, p.headers, p.env) for p in plans] == [
        ("crm", {"Authorization": "Bearer s3cret"}, {}),
        ("files", {}, {"HOME": "/root"}),
    ]
    assert plan_servers({"crm": http}, {}) == "mcp_credential_missing"


def test_the_registry_builds_fresh_toolsets_per_attempt() -> None:
    """§7.7 step 3, issue 36 item 1: every attempt gets new toolsets with the configured overrides; an agent
    without servers gets none; a missing header variable makes the agent unavailable."""
    servers = {"crm": AgentMcpSettings(url="http://127.0.0.1:9/mcp", retry_safe=("lookup",), never_retry=("send",))}
    registry = AgentRegistry({"support": FACTORY, "plain": FACTORY}, mcp={"support": servers}, environ={})
    first, second = registry.mcp_toolsets("support"), registry.mcp_toolsets("support")
    assert len(first) == 1 and isinstance(first[0], RecoverableMCP) and first[0] is not second[0]
    assert (first[0].server, first[0].retry_safe, first[0].never_retry) == (
        "crm",
        frozenset({"lookup"}),
        frozenset({"send"}),
    )
    assert registry.mcp_toolsets("plain") == []
    secret = {"crm": AgentMcpSettings(url="http://x/mcp", headers_env={"Authorization": "CRM_TOKEN"})}
    with pytest.raises(AgentUnavailable) as caught:
        AgentRegistry({"support": FACTORY}, mcp={"support": secret}, environ={}).mcp_toolsets("support")
    assert caught.value.reason == "mcp_credential_missing" and "CRM_TOKEN" not in str(caught.value)


def test_with_basis_adds_the_recorded_reason_and_source() -> None:
    """Issue 36 item 1: the run view's recovery entries say why and where the declaration came from; an entry for
    another tool (a reused id, H-81) or in another shape is ignored."""
    calls = [
        RecoveredCall(tool_call_id="c1", tool_name="lookup", outcome="replayed"),
        RecoveredCall(tool_call_id="c2", tool_name="send", outcome="unknown"),
        RecoveredCall(tool_call_id="c3", tool_name="other", outcome="unknown"),
    ]
    basis = {
        "calls": {
            "c1": {
                "tool_name": "lookup",
                "reason": "retry_safe",
                "declared_by": "annotation",
                "declaration_changed": False,
            },
            "c2": {
                "tool_name": "send",
                "reason": "not_retry_safe",
                "declared_by": "override",
                "declaration_changed": True,
            },
            "c3": {"tool_name": "renamed", "reason": "retry_safe", "declared_by": "annotation"},
        }
    }
    found = with_basis(calls, basis)
    assert [(c.reason, c.declared_by, c.declaration_changed) for c in found] == [
        ("retry_safe", "annotation", False),
        ("not_retry_safe", "override", True),
        (None, None, None),
    ]
    assert with_basis(calls, None) == calls and with_basis(calls, {"calls": []}) == calls
