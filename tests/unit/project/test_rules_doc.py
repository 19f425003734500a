"""docs/rules.md against the ids the sources cite (tools/rules_doc.py), and the checker itself.

This file is left out of the scan (its sample ids are examples, not citations).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
if str(ROOT) not in sys.path:  # `tools` is a repository-root package, not part of the installed distribution
    sys.path.insert(0, str(ROOT))

from tools import rules_doc  # noqa: E402

SOURCES = [
    ("src/candor/harness/state.py", '"""H-1, H-2: ids (§3.3)."""'),
    ("src/candor/service/store/runs.py", "# S-20: fenced (§7.3); STYLE §2"),
    ("tests/unit/harness/test_state.py", '"""H-1, H-2, §3.3."""'),
    ("tests/integration/commands/test_runs.py", '"""S-20, §7.3, STYLE §2."""'),
]
STATEMENTS = {
    "H-1": "one",
    "H-2": "two",
    "S-20": "fenced",
    "harness §3.3": "state",
    "service §7.3": "leases",
    "STYLE §2": "habits",
}


def _document(statements: dict[str, str] = STATEMENTS, sources: list[tuple[str, str]] = SOURCES) -> str:
    return rules_doc.render(rules_doc.collect(sources), statements)


def test_docs_rules_md_lists_every_cited_id() -> None:
    """docs/rules.md has a row with a statement for every id cited in src/ or tests/, every row is cited by a test,
    and the generated columns are current. Fix: `python -m tools.rules_doc`, then write any missing statement."""
    document = rules_doc.DOC.read_text(encoding="utf-8")
    assert rules_doc.problems(rules_doc.collect(rules_doc.source_files()), document) == []


def test_sections_resolve_by_layer() -> None:
    """A `§` belongs to the harness spec in library files, to the service spec elsewhere, to STYLE when so written."""
    assert rules_doc.ids_in("§3.3 and STYLE §1", "tests/unit/harness/test_x.py") == {"harness §3.3", "STYLE §1"}
    assert rules_doc.ids_in("§3.3", "src/candor/tools.py") == {"harness §3.3"}
    assert rules_doc.ids_in("§3.3, S-4", "src/candor/service/x.py") == {"service §3.3", "S-4"}
    assert rules_doc.ids_in("HS-1, XH-2, H-12x", "tests/x.py") == set()


def test_generated_columns() -> None:
    """Modules citing an id fill "implemented in", test files citing it fill "tests"."""
    document = _document()
    assert "| H-1 | one | `harness/state.py` | `unit/harness/test_state.py` |" in document
    assert "| service §7.3 | leases | `service/store/runs.py` | `integration/commands/test_runs.py` |" in document
    assert rules_doc.problems(rules_doc.collect(SOURCES), document) == []


def test_fails_on_an_id_without_a_row() -> None:
    """A new citation in the code with no row in the document is reported."""
    document = _document()
    sources = [*SOURCES, ("src/candor/harness/x.py", "# H-3"), ("tests/unit/harness/test_x.py", "# H-3")]
    assert rules_doc.problems(rules_doc.collect(sources), document) == [
        "H-3: cited in code or tests but has no row in docs/rules.md"
    ]


def test_fails_on_a_row_no_test_cites() -> None:
    """A row whose id only the code (or nothing) cites is reported."""
    sources = [*SOURCES, ("src/candor/harness/x.py", "# H-3")]
    document = _document({**STATEMENTS, "H-3": "three"}, sources)
    assert rules_doc.problems(rules_doc.collect(sources), document) == [
        "H-3: listed in docs/rules.md but no test cites it"
    ]
    stale_row = _document() + "| H-9 | nine | — | — |\n"
    assert rules_doc.problems(rules_doc.collect(SOURCES), stale_row) == [
        "H-9: listed in docs/rules.md but no test cites it"
    ]


def test_fails_on_a_missing_statement_and_stale_columns() -> None:
    """A row without a statement, and a generated column that no longer matches the sources, are reported."""
    unwritten = _document({k: v for k, v in STATEMENTS.items() if k != "H-2"})
    assert rules_doc.problems(rules_doc.collect(SOURCES), unwritten) == ["H-2: has no statement"]
    moved = [(path.replace("state.py", "ids.py"), text) for path, text in SOURCES]
    assert rules_doc.problems(rules_doc.collect(moved), _document()) == [
        "the generated columns are stale: run `python -m tools.rules_doc`"
    ]


def test_regeneration_keeps_statements() -> None:
    """Rewriting keeps every hand-written statement and marks new ids for writing."""
    sources = [*SOURCES, ("tests/unit/harness/test_x.py", "# H-3")]
    regenerated = rules_doc.render(rules_doc.collect(sources), rules_doc.parse_statements(_document()))
    statements = rules_doc.parse_statements(regenerated)
    assert {k: statements[k] for k in STATEMENTS} == STATEMENTS
    assert statements["H-3"] == rules_doc.MISSING_STATEMENT
