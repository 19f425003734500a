"""The commit-subject convention that `.ci/run` checks (tools/commit_subjects.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from tools.commit_subjects import MAX_SUBJECT, check, commits_since, subject_problems


@pytest.mark.parametrize(
    "subject",
    [
        "worker: retry transient store errors within the lease",
        "store/step_commit: write a plain step as one insert",
        "docs: say how a step is stored",
        "ci: check commit subjects",
    ],
)
def test_subjects_that_follow_the_convention_pass(subject: str) -> None:
    assert subject_problems(subject) == []


@pytest.mark.parametrize(
    ("subject", "problem"),
    [
        ("worker: " + "a" * MAX_SUBJECT, "characters"),
        ("Fix the worker", "not `area: imperative summary`"),
        ("Worker: fix it", "not `area: imperative summary`"),
        ("worker:fix it", "not `area: imperative summary`"),
        ("worker: fix it.", "ends with a period"),
    ],
)
def test_subjects_that_break_the_convention_are_named(subject: str, problem: str) -> None:
    problems = subject_problems(subject)
    assert any(problem in p for p in problems), problems


def test_check_reports_each_problem_with_its_commit() -> None:
    findings = check([("abc1234", "ok: fine"), ("def5678", "Bad subject.")])
    assert [f.commit for f in findings] == ["def5678"]


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout.strip()


def test_commits_since_skips_merges_and_reads_subjects(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _git(tmp_path, "init", "-q", "-b", "main")
    _git(tmp_path, "config", "user.email", "t@example.com")
    _git(tmp_path, "config", "user.name", "t")
    _git(tmp_path, "commit", "-q", "--allow-empty", "-m", "base: start")
    base = _git(tmp_path, "rev-parse", "HEAD")
    _git(tmp_path, "checkout", "-q", "-b", "side")
    _git(tmp_path, "commit", "-q", "--allow-empty", "-m", "side: add a thing")
    _git(tmp_path, "checkout", "-q", "main")
    _git(tmp_path, "commit", "-q", "--allow-empty", "-m", "Main work without an area")
    _git(tmp_path, "merge", "-q", "--no-ff", "side", "-m", "Merge branch 'side' with a long subject " + "x" * 80)
    monkeypatch.chdir(tmp_path)
    commits = commits_since(base)
    assert sorted(subject for _, subject in commits) == ["Main work without an area", "side: add a thing"]
    assert [f.subject for f in check(commits)] == ["Main work without an area"]


def test_an_unknown_base_checks_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _git(tmp_path, "init", "-q", "-b", "main")
    monkeypatch.chdir(tmp_path)
    assert commits_since("0" * 40) == []
