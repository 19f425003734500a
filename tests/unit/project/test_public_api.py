"""The public faces against the spec's export table (spec §3.1) and constants (§3.2); STYLE §2 habit 8."""

from __future__ import annotations

import importlib
import re

import pytest

SPEC_EXPORTS: dict[str, tuple[str, ...]] = {
    "candor": (
        "Harness",
        "HarnessState",
        "CapabilityState",
        "RunBindings",
        "RunResult",
        "SafeFailure",
        "DeferredToolResume",
        "RunStream",
        "BoundaryEvent",
        "RunResultEvent",
        "EnvironmentProvider",
        "capability_state",
        "MAX_DEFERRED_ITEMS",
        "MAX_DEFERRED_METADATA_BYTES",
    ),
    "candor.tools": (
        "recovery_retryable",
        "RECOVERY_RETRY_SAFE_METADATA_KEY",
        "UNKNOWN_OUTCOME_METADATA_KEY",
        "UNKNOWN_OUTCOME_CONTENT",
        "unknown_outcome_result",
    ),
    "candor.errors": ("HarnessError", "RunError", "StateError", "DefinitionError", "RunCleanupError"),
}


@pytest.mark.parametrize("module_name", list(SPEC_EXPORTS))
def test_all_lists_every_spec_name(module_name: str) -> None:
    """§3.1: each public face lists every name of the export table in `__all__`, without duplicates."""
    module = importlib.import_module(module_name)
    exported = tuple(module.__all__)
    assert len(exported) == len(set(exported))
    missing = set(SPEC_EXPORTS[module_name]) - set(exported)
    assert not missing, f"{module_name}.__all__ lacks {sorted(missing)}"


@pytest.mark.parametrize("module_name", ["candor", "candor.errors"])
def test_all_lists_nothing_else(module_name: str) -> None:
    """§3.1, STYLE §1: `candor` and `candor.errors` re-export the spec names and nothing else."""
    module = importlib.import_module(module_name)
    assert set(module.__all__) == set(SPEC_EXPORTS[module_name])


@pytest.mark.parametrize(("module_name", "name"), [(m, n) for m, names in SPEC_EXPORTS.items() for n in names])
def test_every_spec_name_imports(module_name: str, name: str) -> None:
    """§3.1: `from <module> import <name>` works for every listed name."""
    namespace: dict[str, object] = {}
    exec(f"from {module_name} import {name}", namespace)
    assert namespace[name] is getattr(importlib.import_module(module_name), name)


@pytest.mark.parametrize("module_name", list(SPEC_EXPORTS))
def test_star_import_matches_all(module_name: str) -> None:
    """§3.1: every name in `__all__` exists, so `import *` works."""
    namespace: dict[str, object] = {}
    exec(f"from {module_name} import *", namespace)
    module = importlib.import_module(module_name)
    assert set(module.__all__) <= set(namespace)


def test_tools_constants() -> None:
    """§3.2: the metadata keys and the fixed, model-facing unknown-outcome text."""
    from candor import tools

    assert tools.RECOVERY_RETRY_SAFE_METADATA_KEY == "candor.recovery_retry_safe"
    assert tools.UNKNOWN_OUTCOME_METADATA_KEY == "candor.unknown_outcome"
    assert tools.UNKNOWN_OUTCOME_CONTENT == (
        "No result was recorded for this tool call because its execution was interrupted. The operation may have "
        "partly or fully taken effect. Check the current state before repeating it."
    )


def test_deferred_limits() -> None:
    """§3.2: MAX_DEFERRED_ITEMS == 128 and MAX_DEFERRED_METADATA_BYTES == 65536."""
    import candor

    assert candor.MAX_DEFERRED_ITEMS == 128
    assert candor.MAX_DEFERRED_METADATA_BYTES == 65536


def test_internal_constants() -> None:
    """§3.2: the deferred-function metadata key and candor's own capability ids."""
    from candor.harness import deferred, stream

    assert deferred.DEFERRED_FUNCTION_ID_METADATA_KEY == "candor.deferred_function_id"
    assert stream.USAGE_CAPABILITY_ID == "candor.usage"
    assert stream.STEERING_CAPABILITY_ID == "candor.steering"


def test_id_formats() -> None:
    """§3.2: generated thread ids are `thr_` + 32 lowercase hex, run ids `run_` + 32 lowercase hex."""
    from candor.harness import ids

    thread_ids = {ids.new_thread_id() for _ in range(100)}
    run_ids = {ids.new_run_id() for _ in range(100)}
    assert len(thread_ids) == len(run_ids) == 100
    assert all(re.fullmatch(r"thr_[0-9a-f]{32}", t) for t in thread_ids)
    assert all(re.fullmatch(r"run_[0-9a-f]{32}", r) for r in run_ids)
    assert ids.new_thread_id(lambda n: "ab" * n) == "thr_" + "ab" * 16


def test_unknown_outcome_result_shape() -> None:
    """§3.10: unknown_outcome_result(call) is exactly the documented ToolReturnPart."""
    from pydantic_ai.messages import ToolCallPart, ToolReturnPart

    from candor.tools import UNKNOWN_OUTCOME_CONTENT, unknown_outcome_result

    part = unknown_outcome_result(ToolCallPart(tool_name="pay", args={"n": 1}, tool_call_id="call_9"))
    assert isinstance(part, ToolReturnPart)
    assert (part.tool_name, part.tool_call_id, part.content, part.outcome, part.metadata) == (
        "pay",
        "call_9",
        UNKNOWN_OUTCOME_CONTENT,
        "interrupted",
        {"candor.unknown_outcome": True},
    )


def test_error_family() -> None:
    """§3.11: RunError, StateError, DefinitionError and RunCleanupError are HarnessErrors with code/details/hint."""
    from candor import errors
    from candor.harness import errors as internal

    for name in SPEC_EXPORTS["candor.errors"]:
        assert getattr(errors, name) is getattr(internal, name)
    for cls in (errors.RunError, errors.StateError, errors.DefinitionError, errors.RunCleanupError):
        assert issubclass(cls, errors.HarnessError)
    error = errors.RunError("m", code="c", details={"k": 1}, retry_hint="new_run")
    assert (error.code, error.details, error.retry_hint) == ("c", {"k": 1}, "new_run")
    assert errors.StateError("m", code="c").details == {} and errors.StateError("m", code="c").retry_hint == "none"
    cause = ValueError("x")
    cleanup = errors.RunCleanupError("m", outcome=None, causes=(cause, cause))
    assert (cleanup.code, cleanup.retry_hint, cleanup.details) == ("run_cleanup_failed", "new_run", {"cause_count": 2})
    assert cleanup.outcome is None and cleanup.causes == (cause, cause)
