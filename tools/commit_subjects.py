"""Check commit subjects: `area: imperative`, at most 72 characters, on the commits CI builds.

`.ci/run` calls this before the tests. It checks the non-merge commits after `SINCE` (the last commit made before
the convention was adopted; older history is left as it is): a subject is `area: what it does`, where `area` is a
lower-case word (letters, digits, `-`, `_`, `/`, `.`) naming the part of the tree, and the whole line is at most 72
characters. The why and the figures belong in the body.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

SINCE = "995be99"
MAX_SUBJECT = 72
_SUBJECT = re.compile(r"^(?P<area>[a-z][a-z0-9_./-]*): (?P<summary>\S.*)$")


@dataclass(frozen=True)
class Finding:
    commit: str
    subject: str
    problem: str


def subject_problems(subject: str) -> list[str]:
    """What is wrong with one subject line (empty when it follows the convention)."""
    problems = []
    if len(subject) > MAX_SUBJECT:
        problems.append(f"{len(subject)} characters (at most {MAX_SUBJECT})")
    match = _SUBJECT.match(subject)
    if match is None:
        problems.append("not `area: imperative summary` (a lower-case area, a colon, a space, then the summary)")
    elif match["summary"].rstrip().endswith("."):
        problems.append("ends with a period")
    return problems


def check(commits: Iterable[tuple[str, str]]) -> list[Finding]:
    """Findings for `(sha, subject)` pairs."""
    return [Finding(sha, subject, problem) for sha, subject in commits for problem in subject_problems(subject)]


def commits_since(base: str, head: str = "HEAD") -> list[tuple[str, str]]:
    """Non-merge commits in `base..head`, oldest first. A clone without `base` (shallow) checks nothing."""
    known = subprocess.run(["git", "cat-file", "-e", f"{base}^{{commit}}"], capture_output=True, check=False)
    if known.returncode != 0:
        print(f"commit_subjects: {base} is not in this clone; nothing to check", file=sys.stderr)
        return []
    out = subprocess.run(
        ["git", "log", "--no-merges", "--reverse", "--format=%h%x00%s", f"{base}..{head}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [(line.split("\0", 1)[0], line.split("\0", 1)[1]) for line in out.splitlines() if line]


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    base = args[0] if args else SINCE
    findings = check(commits_since(base))
    for finding in findings:
        print(f"{finding.commit} {finding.subject!r}: {finding.problem}")
    if findings:
        print(f"commit_subjects: {len(findings)} problem(s); reword them (git rebase -i)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
