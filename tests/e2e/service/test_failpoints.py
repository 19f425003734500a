"""Failpoints of service/failpoints.py.

Issue item "Failpoints for tests": named points (after the model response, before a tool runs, after a checkpoint is
written but before commit, after commit) armed through an environment variable kill the process there with
`os._exit`, so crashes are real, not simulated.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from candor.service import failpoints
from candor.service.failpoints import ENV_VAR, EXIT_CODE, POINTS, Failpoint, parse


@pytest.fixture(autouse=True)
def _disarmed():
    """Every test starts and ends with nothing armed, whatever the outer environment holds."""
    failpoints.reset({})
    yield
    failpoints.reset({})


def test_named_points():
    """Issue "Failpoints for tests": the named points, spelled as the variable spells them."""
    assert {
        "after_model_response",
        "before_tool",
        "checkpoint_before_commit",
        "checkpoint_after_commit",
        "before_seal",
        "outbox_before_settle",
    } == POINTS
    assert failpoints.AFTER_MODEL_RESPONSE == "after_model_response"
    assert failpoints.BEFORE_TOOL == "before_tool"
    assert failpoints.CHECKPOINT_BEFORE_COMMIT == "checkpoint_before_commit"
    assert failpoints.CHECKPOINT_AFTER_COMMIT == "checkpoint_after_commit"
    assert failpoints.BEFORE_SEAL == "before_seal"
    assert failpoints.OUTBOX_BEFORE_SETTLE == "outbox_before_settle"
    assert ENV_VAR == "CANDOR_FAILPOINTS" and EXIT_CODE == 137


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("", {}),
        ("  ", {}),
        ("before_tool", {"before_tool": Failpoint(name="before_tool")}),
        ("before_tool:exit", {"before_tool": Failpoint(name="before_tool", action="exit")}),
        ("before_tool:sigkill", {"before_tool": Failpoint(name="before_tool", action="sigkill")}),
        ("before_tool@3", {"before_tool": Failpoint(name="before_tool", count=3)}),
        ("before_seal:sigkill@2", {"before_seal": Failpoint(name="before_seal", action="sigkill", count=2)}),
        (
            " checkpoint_before_commit@2 , outbox_before_settle:sigkill ,",
            {
                "checkpoint_before_commit": Failpoint(name="checkpoint_before_commit", count=2),
                "outbox_before_settle": Failpoint(name="outbox_before_settle", action="sigkill"),
            },
        ),
    ],
)
def test_parse(value, expected):
    """Issue "Failpoints for tests": `name[:action][@count]`, comma-separated; action `exit` and count 1 by default."""
    assert parse(value) == expected


@pytest.mark.parametrize(
    ("value", "bad_entry"),
    [
        ("before_tol", "before_tol"),
        ("before_tool,after_commit", "after_commit"),
        ("before_tool:explode", "before_tool:explode"),
        ("before_tool@0", "before_tool@0"),
        ("before_tool@-1", "before_tool@-1"),
        ("before_tool@x", "before_tool@x"),
        ("before_tool@2:exit", "before_tool@2:exit"),
        ("before tool", "before tool"),
        ("before_tool,before_tool:sigkill", "before_tool:sigkill"),
    ],
)
def test_parse_refuses_bad_entries_and_names_them(value, bad_entry):
    """Issue "Failpoints for tests": a misspelt arming fails loudly at parse time, naming the entry."""
    with pytest.raises(ValueError) as info:
        parse(value)
    assert repr(bad_entry) in str(info.value)


def test_reset_parses_at_once_and_refuses_a_bad_variable():
    """`reset(environ)` parses eagerly, so a startup or a test sees a bad variable before any hit."""
    assert failpoints.reset({ENV_VAR: "before_tool@2"}) == {"before_tool": Failpoint(name="before_tool", count=2)}
    assert failpoints.armed() == {"before_tool": Failpoint(name="before_tool", count=2)}
    with pytest.raises(ValueError, match="nope"):
        failpoints.reset({ENV_VAR: "nope"})
    assert failpoints.reset({"OTHER": "x"}) == {}


def test_hit_is_a_no_op_when_nothing_is_armed(monkeypatch):
    """Issue "Failpoints for tests": unarmed points cost nothing; the variable is read once per process, not per hit."""
    failpoints.reset({})
    monkeypatch.setenv(ENV_VAR, "before_tool")  # set after parsing: must not be seen
    for name in POINTS:
        failpoints.hit(name)
    failpoints.hit("not_a_point")  # unarmed: not even the name is checked
    assert failpoints.armed() == {}


def test_armed_hit_counts_and_fires_on_the_nth(monkeypatch):
    """`@n` fires on the n-th hit of that point only; other points' hits do not count towards it."""
    fired: list[tuple[str, int]] = []
    monkeypatch.setattr(failpoints, "_fire", lambda point: fired.append((point.name, point.count)))
    failpoints.reset({ENV_VAR: "before_tool@3,before_seal"})
    failpoints.hit(failpoints.BEFORE_TOOL)
    failpoints.hit(failpoints.AFTER_MODEL_RESPONSE)
    failpoints.hit(failpoints.BEFORE_TOOL)
    assert fired == []
    failpoints.hit(failpoints.BEFORE_TOOL)
    assert fired == [("before_tool", 3)]
    failpoints.hit(failpoints.BEFORE_TOOL)
    assert fired == [("before_tool", 3)]
    failpoints.hit(failpoints.BEFORE_SEAL)
    assert fired == [("before_tool", 3), ("before_seal", 1)]


def test_reset_forgets_hit_counts(monkeypatch):
    """Resetting rearms from zero, so each test counts its own hits."""
    fired: list[str] = []
    monkeypatch.setattr(failpoints, "_fire", lambda point: fired.append(point.name))
    failpoints.reset({ENV_VAR: "before_tool@2"})
    failpoints.hit(failpoints.BEFORE_TOOL)
    failpoints.reset({ENV_VAR: "before_tool@2"})
    failpoints.hit(failpoints.BEFORE_TOOL)
    assert fired == []


def test_armed_hit_refuses_an_unknown_name():
    """While anything is armed, a misspelt call site fails instead of silently never firing."""
    failpoints.reset({ENV_VAR: "before_tool"})
    with pytest.raises(ValueError, match="befor_tool"):
        failpoints.hit("befor_tool")


def _run(code: str, armed: str | None) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if key != ENV_VAR}
    if armed is not None:
        env[ENV_VAR] = armed
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


_SCRIPT = """
    from candor.service import failpoints

    print("start", flush=True)
    failpoints.hit(failpoints.AFTER_MODEL_RESPONSE)
    print("model response passed", flush=True)
    for i in range(1, 4):
        print(f"tool {i}", flush=True)
        failpoints.hit(failpoints.BEFORE_TOOL)
        print(f"ran tool {i}", flush=True)
    print("finished", flush=True)
"""


@pytest.mark.crash
def test_real_process_dies_with_137_at_the_armed_point():
    """Issue "Failpoints for tests": an armed point kills a real process with `os._exit(137)` exactly there."""
    done = _run(_SCRIPT, "before_tool")
    assert done.returncode == EXIT_CODE, done.stderr
    assert done.stdout.splitlines() == ["start", "model response passed", "tool 1"]
    assert "failpoint before_tool fired" in done.stderr


@pytest.mark.crash
def test_real_process_dies_on_the_nth_hit():
    """Issue "Failpoints for tests": `@n` lets a crash land on a later boundary of the same run."""
    done = _run(_SCRIPT, "before_tool@3")
    assert done.returncode == EXIT_CODE, done.stderr
    assert done.stdout.splitlines()[-2:] == ["ran tool 2", "tool 3"]


@pytest.mark.crash
def test_real_process_killed_by_sigkill():
    """Issue "Failpoints for tests": `:sigkill` sends the process a real SIGKILL, as an OOM kill would."""
    done = _run(_SCRIPT, "before_tool:sigkill@2")
    assert done.returncode == -signal.SIGKILL
    assert "ran tool 2" not in done.stdout


@pytest.mark.crash
def test_exit_action_flushes_buffered_stdio_first():
    """Issue "Failpoints for tests": `exit` flushes stdio, so a crashed child's last output is still readable."""
    code = """
        from candor.service import failpoints
        print("buffered, not flushed")
        failpoints.hit(failpoints.CHECKPOINT_BEFORE_COMMIT)
        print("never")
    """
    done = _run(code, "checkpoint_before_commit")
    assert done.returncode == EXIT_CODE
    assert done.stdout == "buffered, not flushed\n"


@pytest.mark.crash
def test_real_process_unarmed_or_other_point_runs_to_the_end():
    """Nothing armed, or another point armed, never stops the process."""
    for armed in (None, "", "checkpoint_after_commit"):
        done = _run(_SCRIPT, armed)
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines()[-1] == "finished"


@pytest.mark.crash
def test_real_process_with_bad_variable_fails_at_first_hit():
    """Issue "Failpoints for tests": a bad `CANDOR_FAILPOINTS` raises `ValueError` naming the entry, not a silent run."""
    done = _run(_SCRIPT, "before_tool,checkpoint_commit")
    assert done.returncode == 1
    assert "ValueError" in done.stderr and "'checkpoint_commit'" in done.stderr
    assert "model response passed" not in done.stdout
