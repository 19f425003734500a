"""bench/_server_profile.py: reading perf's reports into the server's phases (issue 12: a profile where a target is
missed). perf itself is not run here; its `--stdio` output is replayed as recorded on this project's machine."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from bench import _server_profile as server_profile

BY_COMMAND_AND_OBJECT = """\
# Samples: 3K of event 'cpu-clock'
#
# Overhead  Command          Shared Object
# ........  ...............  ..............................................
#
    48.19%  swapper          [kernel.kallsyms]
    32.97%  python           libpython3.11.so.1.0
     8.00%  postgres         postgres
     1.59%  python           [kernel.kallsyms]
     1.00%  postgres         [kernel.kallsyms]
     1.00%  postgres         libc.so.6
"""
BY_COMMAND = """\
# Overhead  Command
#
    48.19%  swapper
    35.00%  python
    10.00%  postgres
"""
INCLUSIVE = """\
# Children      Self  Symbol
# ........  ........  ........................................
#
    10.00%     0.00%  [.] PostgresMain
     6.00%     0.00%  [.] PortalRun
     0.40%     0.00%  [.] PortalRun
     2.00%     0.00%  [.] AfterTriggerEndQuery
     1.00%     0.01%  [.] ExecConstraints
     0.50%     0.00%  [.] standard_ExecutorStart
     0.30%     0.00%  [.] standard_ExecutorEnd
     0.70%     0.01%  [.] CommitTransactionCommand
     0.25%     0.00%  [.] XLogFlush
     0.20%     0.20%  [k] tcp_sendmsg
"""


@pytest.fixture
def perf_reports(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """`perf report` answered from the texts above, by the options asked; the commands are recorded."""
    asked: list[list[str]] = []

    def fake_run(command: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        asked.append(command)
        if "--children" in command:
            text = INCLUSIVE
        elif "comm,dso" in command:
            text = BY_COMMAND_AND_OBJECT
        else:
            text = BY_COMMAND
        return subprocess.CompletedProcess(command, 0, stdout=text, stderr="")

    monkeypatch.setattr(subprocess, "run", fake_run)
    return asked


def test_phases_are_shares_of_the_server_samples(perf_reports: list[list[str]]) -> None:
    """Each phase is its functions' inclusive samples over the `postgres` processes' samples; a function listed
    twice (two mappings of the binary) counts once per line, summed."""
    found = server_profile.summarize(Path("recording.data"))
    assert found.machine_share == pytest.approx(0.10)
    assert found.kernel_share == pytest.approx(0.10)  # 1.00% of 10.00%: the `postgres` rows of the kernel only
    assert found.phases["serving a client"] == pytest.approx(1.0)
    assert found.phases["statement execution"] == pytest.approx(0.64)
    assert found.phases["foreign-key checks"] == pytest.approx(0.20)
    assert found.phases["CHECK constraints"] == pytest.approx(0.10)
    assert found.phases["executor start and end"] == pytest.approx(0.08)
    assert found.phases["commit"] == pytest.approx(0.07)
    assert found.phases["WAL flush"] == pytest.approx(0.025)
    assert found.phases["PL/pgSQL triggers"] == 0.0  # not in the report: no sample passed through it
    assert all(command[:4] == ["perf", "report", "-i", "recording.data"] for command in perf_reports)


def test_a_recording_without_the_server_has_no_phases(monkeypatch: pytest.MonkeyPatch) -> None:
    def fake_run(command: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(command, 0, stdout="    99.00%  swapper\n", stderr="")

    monkeypatch.setattr(subprocess, "run", fake_run)
    found = server_profile.summarize(Path("recording.data"))
    assert found.machine_share == 0.0 and set(found.phases.values()) == {0.0}


def _profile(system: str, server_ms: float, **phases: float) -> dict[str, Any]:
    shares = {name: 0.0 for name, _ in server_profile.PHASES} | {
        name.replace("_", " "): share for name, share in phases.items()
    }
    return {
        "system": system,
        "workload": "sequential 80 steps",
        "server_cpu_ms_per_step": server_ms,
        "kernel_share": 0.1,
        "phases": shares,
    }


def test_the_table_and_the_reading_name_every_phase_and_peer() -> None:
    profiles = [
        _profile("candor-service+postgresql", 2.88, statement_execution=0.68, commit=0.07),
        _profile("langgraph+postgresql", 1.83, commit=0.10),
    ]
    table = server_profile.profile_table(profiles)
    header = next(line for line in table if line.startswith("| System"))
    assert all(name in header for name, _ in server_profile.PHASES)
    assert "| candor-service+postgresql | sequential 80 steps | 2.88 | 10% | 0% | 68% |" in "\n".join(table)
    (line,) = server_profile.profile_lines(profiles, "candor-service+postgresql")
    assert "2.88 ms" in line and "langgraph+postgresql 1.83 ms (commit 10%)" in line and "68% executed" in line
    assert server_profile.profile_table([]) == [] and server_profile.profile_lines(profiles, "other") == []


def test_recordings_go_where_asked_unless_off_or_perf_cannot_record(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(server_profile, "available", lambda: None)
    assert server_profile.recordings_dir(None, False, tmp_path) == (tmp_path / "server-profile", None)
    assert server_profile.recordings_dir(tmp_path / "kept", False, tmp_path) == (tmp_path / "kept", None)
    assert server_profile.recordings_dir(tmp_path / "kept", True, tmp_path) == (None, None)
    monkeypatch.setattr(server_profile, "available", lambda: "perf is not installed (Debian: linux-perf)")
    assert server_profile.recordings_dir(None, False, tmp_path) == (None, "perf is not installed (Debian: linux-perf)")
