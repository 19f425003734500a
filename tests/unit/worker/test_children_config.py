"""The child-run opt-in (§7.13, §3.3): `[agents.<name>] children = [...]`, checked against the configured agents."""

from __future__ import annotations

from pathlib import Path

import pytest

from candor.service.agents import AgentRegistry
from candor.service.core import agent_registry
from candor.service.settings import ServiceSettings, SettingsError

FACTORY = "worker.support:factory"


def _load(tmp_path: Path, toml: str) -> ServiceSettings:
    config = tmp_path / "candor.toml"
    config.write_text(toml)
    return ServiceSettings.load(config, {})


def test_children_default_to_none_and_reach_the_registry(tmp_path: Path) -> None:
    """§7.13: an agent starts no child unless its section lists the agents it may start."""
    settings = _load(
        tmp_path,
        f'[agents.lead]\nfactory = "{FACTORY}"\nchildren = ["helper"]\n[agents.helper]\nfactory = "{FACTORY}"\n',
    )
    settings.check_startup()
    assert settings.agents["helper"].children == ()
    registry = agent_registry(settings)
    assert (registry.children_of("lead"), registry.children_of("helper"), registry.children_of("ghost")) == (
        ("helper",),
        (),
        (),
    )


def test_unknown_child_agent_refuses_startup(tmp_path: Path) -> None:
    """§3.3, §7.13: a `children` entry that names no configured agent stops the process with a clear error."""
    settings = _load(tmp_path, f'[agents.lead]\nfactory = "{FACTORY}"\nchildren = ["helper", "ghost"]\n')
    with pytest.raises(SettingsError) as caught:
        settings.check_startup()
    assert caught.value.code == "invalid_settings"
    assert "agents.lead.children names 'ghost'" in str(caught.value)
    assert "'helper'" in str(caught.value)


@pytest.mark.parametrize("children", ['[""]', '["helper", "helper"]'])
def test_children_must_be_distinct_names(tmp_path: Path, children: str) -> None:
    """§7.13: empty or repeated names in `children` are refused when the settings are read."""
    toml = f'[agents.lead]\nfactory = "{FACTORY}"\nchildren = {children}\n[agents.helper]\nfactory = "{FACTORY}"\n'
    with pytest.raises(SettingsError):
        _load(tmp_path, toml)


def test_registry_refuses_unknown_children() -> None:
    """§7.13: a registry built in code checks its `children` against its factories as well."""
    with pytest.raises(ValueError, match="lead → ghost"):
        AgentRegistry({"lead": FACTORY}, children={"lead": ["ghost"]})
