"""docs/rules.md: the rule and section ids the code and tests cite, checked and regenerated from the sources.

Three kinds of id are cited in `src/` and `tests/`:

* `H-n` (harness rules) and `S-n` (service rules): numbered testable statements of the two specifications;
* `§n` / `§n.m`: a section of a specification. Which one is decided by where the citation stands: files of the
  library layer (`src/candor/harness/`, `candor/__init__.py`, `candor/tools.py`, `candor/errors.py`,
  `tests/*/harness/`, `tests/support/scripted.py`, `tests/unit/project/test_public_api.py`) cite the harness
  specification, every other file the service
  specification, and `STYLE §n` the style guide.

docs/rules.md holds one table row per id: the statement column is written by hand and kept on regeneration; the
"implemented in" column (modules under `src/` citing the id) and the "tests" column (test files citing it) are
generated. `python -m tools.rules_doc` rewrites the file; `python -m tools.rules_doc --check` (and
tests/unit/project/test_rules_doc.py) fails when

* an id cited in code or tests has no row (or a row with no statement),
* a row's id is cited by no test, or
* a generated column is stale.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "rules.md"
MISSING_STATEMENT = "(statement missing)"

_RULE = re.compile(r"\b([HS])-(\d+)\b")
_SECTION = re.compile(r"(STYLE\s+)?§(\d+(?:\.\d+)*)")
_LIBRARY_FILES = (
    "src/candor/__init__.py",
    "src/candor/tools.py",
    "src/candor/errors.py",
    "tests/support/scripted.py",
    "tests/unit/project/test_public_api.py",
)
_LIBRARY_DIRS = ("src/candor/harness/", "tests/unit/harness/", "tests/integration/harness/", "tests/e2e/harness/")
_NOT_CITATIONS = frozenset({"tests/unit/project/test_rules_doc.py"})
_ROW = re.compile(r"^\|\s*(?P<id>[^|]+?)\s*\|\s*(?P<statement>[^|]*?)\s*\|[^|]*\|[^|]*\|\s*$")

GROUPS: tuple[tuple[str, str], ...] = (
    ("H", "Harness rules (`H-n`)"),
    ("S", "Service rules (`S-n`)"),
    ("harness §", "Harness specification sections"),
    ("service §", "Service specification sections"),
    ("STYLE §", "Style guide sections"),
)

HEADER = """\
# Rules and sections cited in the code

Every rule id (`H-n` for the harness, `S-n` for the service) and every specification section (`§n`, `§n.m`) that a
module or a test names, with a one-sentence statement in our own words, the modules that implement it and the tests
that name it. A `§` citation belongs to the harness specification when it stands in a library-layer file
(`src/candor/harness/`, `candor/{__init__,tools,errors}.py`, `tests/*/harness/`, `tests/support/scripted.py`,
`tests/unit/project/test_public_api.py`), to the style guide when written `STYLE §n`, and to the service
specification otherwise.

**Regenerate** after adding or removing a citation: `python -m tools.rules_doc` (or `make rules`). It keeps the
statements, rewrites the two generated columns and adds a row, marked `(statement missing)`, for every new id:
write its statement by hand. `tests/unit/project/test_rules_doc.py` fails when an id cited in `src/` or `tests/` has
no row or no statement, when a row names an id no test cites, or when the generated columns are stale.
"""


@dataclass(frozen=True, slots=True)
class Citations:
    """Where each id is cited: repository-relative paths, split into modules and tests."""

    modules: Mapping[str, frozenset[str]]
    tests: Mapping[str, frozenset[str]]

    def ids(self) -> set[str]:
        return set(self.modules) | set(self.tests)


def section_document(path: str) -> str:
    """The specification a `§` citation in `path` (repository-relative, `/`-separated) refers to."""
    if path in _LIBRARY_FILES or path.startswith(_LIBRARY_DIRS):
        return "harness"
    return "service"


def ids_in(text: str, path: str) -> set[str]:
    """Every id cited in `text`, qualified (`H-3`, `S-40`, `harness §3.9`, `service §8.6`, `STYLE §2`)."""
    found = {f"{letter}-{number}" for letter, number in _RULE.findall(text)}
    for style, number in _SECTION.findall(text):
        found.add(f"STYLE §{number}" if style else f"{section_document(path)} §{number}")
    return found


def collect(files: Iterable[tuple[str, str]]) -> Citations:
    """Citations from `(relative path, text)` pairs; paths under `tests/` count as tests, the others as modules."""
    modules: dict[str, set[str]] = defaultdict(set)
    tests: dict[str, set[str]] = defaultdict(set)
    for path, text in files:
        target, shown = (
            (tests, path.removeprefix("tests/"))
            if path.startswith("tests/")
            else (modules, path.removeprefix("src/candor/"))
        )
        for rule_id in ids_in(text, path):
            target[rule_id].add(shown)
    return Citations(
        modules={k: frozenset(v) for k, v in modules.items()}, tests={k: frozenset(v) for k, v in tests.items()}
    )


def source_files(root: Path = ROOT) -> list[tuple[str, str]]:
    """`(relative path, text)` of every Python file under src/ and tests/, except the checker's own test (whose
    sample ids are examples, not citations)."""
    paths = sorted([*root.joinpath("src").rglob("*.py"), *root.joinpath("tests").rglob("*.py")])
    relative = [(p, p.relative_to(root).as_posix()) for p in paths]
    return [(rel, p.read_text(encoding="utf-8")) for p, rel in relative if rel not in _NOT_CITATIONS]


def parse_statements(document: str) -> dict[str, str]:
    """The hand-written statement of every row of an existing docs/rules.md."""
    statements: dict[str, str] = {}
    for line in document.splitlines():
        match = _ROW.match(line)
        if match and match["id"] not in ("Id", "---"):
            statements[match["id"]] = match["statement"]
    return statements


def sort_key(rule_id: str) -> tuple[int, tuple[int, ...]]:
    group = next(i for i, (prefix, _) in enumerate(GROUPS) if rule_id.startswith(prefix))
    number = re.split(r"[-§]", rule_id)[-1]
    return group, tuple(int(part) for part in number.split("."))


def render(citations: Citations, statements: Mapping[str, str]) -> str:
    """The whole docs/rules.md for these citations, keeping the given statements."""
    lines = [HEADER]
    ids = sorted(citations.ids(), key=sort_key)
    for prefix, title in GROUPS:
        group = [i for i in ids if i.startswith(prefix) and (prefix not in ("H", "S") or i[1] == "-")]
        if not group:
            continue
        lines += [f"## {title}", "", "| Id | Statement | Implemented in | Tests |", "|---|---|---|---|"]
        for rule_id in group:
            modules = ", ".join(f"`{m}`" for m in sorted(citations.modules.get(rule_id, ()))) or "—"
            tests = ", ".join(f"`{t}`" for t in sorted(citations.tests.get(rule_id, ()))) or "—"
            statement = statements.get(rule_id) or MISSING_STATEMENT
            lines.append(f"| {rule_id} | {statement} | {modules} | {tests} |")
        lines.append("")
    return "\n".join(lines)


def problems(citations: Citations, document: str) -> list[str]:
    """Why `document` is not the true docs/rules.md for `citations` (empty when it is)."""
    statements = parse_statements(document)
    found: list[str] = []
    for rule_id in sorted(citations.ids() - set(statements), key=sort_key):
        found.append(f"{rule_id}: cited in code or tests but has no row in docs/rules.md")
    for rule_id in sorted(set(statements) - set(citations.tests), key=sort_key):
        found.append(f"{rule_id}: listed in docs/rules.md but no test cites it")
    for rule_id, statement in statements.items():
        if statement in ("", MISSING_STATEMENT):
            found.append(f"{rule_id}: has no statement")
    if not found and render(citations, statements) != document:
        found.append("the generated columns are stale: run `python -m tools.rules_doc`")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="report problems instead of rewriting the file")
    args = parser.parse_args(argv)
    citations = collect(source_files())
    document = DOC.read_text(encoding="utf-8") if DOC.exists() else ""
    if args.check:
        found = problems(citations, document)
        for problem in found:
            print(problem, file=sys.stderr)
        return 1 if found else 0
    DOC.write_text(render(citations, parse_statements(document)), encoding="utf-8")
    missing = [i for i, s in parse_statements(DOC.read_text(encoding="utf-8")).items() if s == MISSING_STATEMENT]
    if missing:
        print(f"{len(missing)} rows need a statement: {', '.join(missing)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
