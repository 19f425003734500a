"""The agent registry of service/agents.py: §3.2 `agents.<name>.factory`, §3.3 startup check (S-56), §7.7 step 3,
§7.9 "Agent factory raised" and §12.3 `agent_unavailable`."""

from __future__ import annotations

import importlib
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai import Agent
from pydantic_ai.models.test import TestModel

from candor import Harness
from candor.service.agents import AgentRegistry, AgentUnavailable
from candor.service.errors import ServiceError
from candor.service.settings import AgentSettings

SECRET = "sk-live-do-not-echo"
"""Text a failing factory or module puts in its exception; it must never reach an `AgentUnavailable` message."""

calls: list[dict[str, Any]] = []


def make_harness(options: dict[str, Any]) -> Harness[Any]:
    """A factory defined in this module, as `test_agents:make_harness`."""
    calls.append(options)
    return Harness(Agent(TestModel(custom_output_text=options.get("reply", "hi"))))


def raising_factory(options: dict[str, Any]) -> Harness[Any]:
    raise RuntimeError(SECRET)


def wrong_type_factory(options: dict[str, Any]) -> object:
    return Agent(TestModel())


async def async_factory(options: dict[str, Any]) -> Harness[Any]:
    return make_harness(options)


class Factories:
    @staticmethod
    def nested(options: dict[str, Any]) -> Harness[Any]:
        return make_harness(options)


NOT_CALLABLE = 42

HERE = __name__


@pytest.fixture(autouse=True)
def _clear_calls():
    calls.clear()


@pytest.fixture
def factory_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Write a module to tmp_path, put tmp_path on sys.path, and drop the module from sys.modules afterwards."""
    written: list[str] = []
    monkeypatch.syspath_prepend(str(tmp_path))

    def write(source: str) -> str:
        name = f"candor_test_factories_{uuid.uuid4().hex}"
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
        written.append(name)
        return name

    yield write
    for name in written:
        sys.modules.pop(name, None)


_GOOD_MODULE = """
    from pydantic_ai import Agent
    from pydantic_ai.models.test import TestModel
    from candor import Harness

    IMPORTS = 1

    def build(options):
        return Harness(Agent(TestModel(custom_output_text=options["reply"])))
"""


def _unavailable(registry: AgentRegistry, name: str, *, build: bool = False) -> AgentUnavailable:
    with pytest.raises(AgentUnavailable) as info:
        registry.build(name, {}) if build else registry.resolve(name)
    return info.value


def _assert_classified(error: AgentUnavailable, agent: str, reason: str) -> None:
    assert error.code == "agent_unavailable"
    assert isinstance(error, ServiceError)
    assert error.agent == agent and error.reason == reason
    assert repr(agent) in str(error)
    assert SECRET not in str(error)


async def test_build_from_module_on_sys_path(factory_module):
    """§3.2, §7.7 step 3: `"module:attribute"` names a callable `(options) -> Harness`; the harness it builds runs."""
    module = factory_module(_GOOD_MODULE)
    registry = AgentRegistry({"support": f"{module}:build"})
    harness = registry.build("support", {"reply": "hello"})
    assert isinstance(harness, Harness)
    result = await harness.run("hi")
    assert result.output == "hello"


def test_import_is_lazy_and_cached(factory_module):
    """§3.2: constructing the registry imports nothing; the first resolve imports, later ones reuse the callable."""
    module = factory_module(_GOOD_MODULE)
    registry = AgentRegistry({"support": f"{module}:build"})
    assert module not in sys.modules
    factory = registry.resolve("support")
    assert module in sys.modules
    sys.modules.pop(module)  # a second import would register the module again
    assert registry.resolve("support") is factory
    assert module not in sys.modules


def test_build_calls_the_factory_every_time_with_a_copy_of_the_options():
    """§7.7 step 3: a fresh Harness per attempt (state restores data, not authority); options passed each time."""
    registry = AgentRegistry({"local": f"{HERE}:make_harness"})
    options = {"reply": "x", "tenant": "t1"}
    first = registry.build("local", options)
    second = registry.build("local", options)
    assert first is not second and first.agent is not second.agent
    assert calls == [options, options]
    assert calls[0] is not options and calls[0] is not calls[1]  # a factory mutating its options cannot leak


def test_dotted_attribute_path():
    """§3.2: the attribute part may walk into the module (`module:Class.method`)."""
    registry = AgentRegistry({"nested": f"{HERE}:Factories.nested"})
    assert isinstance(registry.build("nested", {}), Harness)


def test_names_sorted():
    """§3.2: the registry knows exactly the configured agent names."""
    registry = AgentRegistry({"b": f"{HERE}:make_harness", "a": f"{HERE}:make_harness"})
    assert registry.names() == ("a", "b")
    assert AgentRegistry({}).names() == ()


def test_from_settings():
    """§3.2: the registry is built from the `[agents.<name>]` settings sections."""
    registry = AgentRegistry.from_settings({"local": AgentSettings(factory=f"{HERE}:make_harness")})
    assert registry.names() == ("local",)
    assert isinstance(registry.build("local", {}), Harness)


def test_unknown_agent():
    """§12.3: `agent_unavailable` — the agent is unknown."""
    registry = AgentRegistry({"local": f"{HERE}:make_harness"})
    _assert_classified(_unavailable(registry, "missing"), "missing", "unknown_agent")
    _assert_classified(_unavailable(registry, "missing", build=True), "missing", "unknown_agent")


@pytest.mark.parametrize(
    ("source", "reason"),
    [
        (f"raise RuntimeError({SECRET!r})", "import_failed"),
        (f"import candor_no_such_module_{uuid.uuid4().hex}  # {SECRET}", "import_failed"),
        (f"def broken(:  # {SECRET}", "import_failed"),
        (f"def __getattr__(name):\n    raise KeyError({SECRET!r})", "attribute_missing"),
        ("x = 1", "attribute_missing"),
        ("build = 'not callable'", "not_callable"),
    ],
    ids=["raises", "missing-dependency", "syntax-error", "getattr-raises", "no-attribute", "not-callable"],
)
def test_module_failures_are_agent_unavailable_without_the_exception_text(factory_module, source, reason):
    """§12.3, §7.9: a factory that does not import is `agent_unavailable`; the message names the agent only.

    The foreign exception is chained for logs, never quoted (STYLE habit 3: messages never echo secrets)."""
    module = factory_module(source)
    registry = AgentRegistry({"support": f"{module}:build"})
    error = _unavailable(registry, "support")
    _assert_classified(error, "support", reason)
    if reason != "not_callable":
        assert error.__cause__ is not None


def test_missing_module():
    """§12.3: a factory naming a module that does not exist is `agent_unavailable`."""
    registry = AgentRegistry({"ghost": f"candor_no_such_module_{uuid.uuid4().hex}:build"})
    error = _unavailable(registry, "ghost")
    _assert_classified(error, "ghost", "import_failed")
    assert isinstance(error.__cause__, ImportError)


@pytest.mark.parametrize("spec", ["", "no_colon", ":build", f"{HERE}:", f"{HERE}:NOT_CALLABLE"])
def test_malformed_or_non_callable_factory(spec):
    """§3.2: the factory must be `"module:attribute"` naming a callable, else `agent_unavailable`."""
    registry = AgentRegistry({"bad": spec})
    reason = "not_callable" if spec.endswith("NOT_CALLABLE") else "invalid_factory"
    _assert_classified(_unavailable(registry, "bad"), "bad", reason)


def test_import_failure_is_not_cached(factory_module, tmp_path):
    """A failed import is retried on the next resolve, so a fixed module can be picked up."""
    module = factory_module("raise RuntimeError('not yet')")
    registry = AgentRegistry({"support": f"{module}:build"})
    _unavailable(registry, "support")
    (tmp_path / f"{module}.py").write_text(textwrap.dedent(_GOOD_MODULE))
    importlib.invalidate_caches()
    assert callable(registry.resolve("support"))


def test_factory_that_raises():
    """§7.9 "Agent factory raised" → `agent_unavailable` (S-49 seals it); the factory's text is not repeated."""
    registry = AgentRegistry({"local": f"{HERE}:raising_factory"})
    error = _unavailable(registry, "local", build=True)
    _assert_classified(error, "local", "factory_failed")
    assert isinstance(error.__cause__, RuntimeError)


@pytest.mark.parametrize("attribute", ["wrong_type_factory", "async_factory"])
def test_factory_must_return_a_harness(attribute, recwarn):
    """§3.2: the factory returns a `candor.Harness`; anything else (an Agent, a coroutine) is `agent_unavailable`."""
    registry = AgentRegistry({"local": f"{HERE}:{attribute}"})
    _assert_classified(_unavailable(registry, "local", build=True), "local", "not_a_harness")
    assert not [w for w in recwarn if "never awaited" in str(w.message)]


def test_check_all_imports_every_factory(factory_module):
    """§3.3 startup check (S-56): every `agents.<name>.factory` imports; afterwards builds need no import."""
    module = factory_module(_GOOD_MODULE)
    registry = AgentRegistry({"support": f"{module}:build", "local": f"{HERE}:make_harness"})
    registry.check_all()
    assert module in sys.modules
    assert calls == []  # checking imports, it never builds a harness


def test_check_all_fails_on_the_first_broken_agent_by_name(factory_module):
    """§3.3 startup check (S-56): one factory that does not import makes the check fail with `agent_unavailable`."""
    broken = factory_module(f"raise ImportError({SECRET!r})")
    registry = AgentRegistry(
        {
            "zeta": f"{broken}:build",
            "alpha": f"{HERE}:make_harness",
            "beta": f"candor_no_such_module_{uuid.uuid4().hex}:build",
        }
    )
    with pytest.raises(AgentUnavailable) as info:
        registry.check_all()
    _assert_classified(info.value, "beta", "import_failed")
