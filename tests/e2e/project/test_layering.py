"""Layering (STYLE §2 habit 9): the harness never loads the service; SQL and HTTP stay in their packages.

One part imports the library in a fresh interpreter and inspects `sys.modules`; the other scans the source with
`ast` for the top-level package of every import (relative imports resolved).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[3] / "src"
CANDOR = SRC / "candor"
SERVICE = CANDOR / "service"
FORBIDDEN_FOR_LIBRARY = ("candor.service", "sqlalchemy", "fastapi")


def _loaded_modules(statement: str) -> list[str]:
    code = f"import json, sys\n{statement}\nprint(json.dumps(sorted(sys.modules)))"
    completed = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True, cwd=SRC.parent, timeout=120
    )
    modules: list[str] = json.loads(completed.stdout.strip().splitlines()[-1])
    return modules


@pytest.mark.parametrize(
    "statement",
    ["import candor.harness", "import candor", "import candor.tools, candor.errors", "from candor import Harness"],
)
def test_library_import_loads_no_service_sql_or_http(statement: str) -> None:
    """Habit 9: importing the library loads no candor.service, sqlalchemy or fastapi module."""
    loaded = _loaded_modules(statement)
    assert "candor" in loaded
    offending = [m for m in loaded if any(m == f or m.startswith(f + ".") for f in FORBIDDEN_FOR_LIBRARY)]
    assert offending == []


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(source: str, module: str, *, is_package: bool = False) -> set[str]:
    """Absolute names of every module imported anywhere in `source` (functions and TYPE_CHECKING blocks too)."""
    package = module if is_package else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                prefix = ".".join(base)
                target = f"{prefix}.{node.module}" if node.module else prefix
            else:
                target = node.module or ""
            names.add(target)
            # `from pkg import name` may import the submodule pkg.name (e.g. `from candor import service`)
            names.update(f"{target}.{alias.name}" for alias in node.names if alias.name != "*")
    return names


def _imports_by_file() -> dict[Path, set[str]]:
    result: dict[Path, set[str]] = {}
    for path in sorted(CANDOR.rglob("*.py")):
        result[path] = imported_modules(
            path.read_text(encoding="utf-8"), _module_name(path), is_package=path.name == "__init__.py"
        )
    return result


def _top(name: str) -> str:
    return name.split(".")[0]


def _under(path: Path, directory: Path) -> bool:
    return directory in path.parents


def test_scanner_resolves_imports() -> None:
    """The scanner itself: absolute, relative and nested imports are all found."""
    source = (
        "import sqlalchemy.orm\n"
        "from fastapi import APIRouter\n"
        "from ..service import store\n"
        "from . import sibling\n"
        "def f():\n    import httpx\n"
        "if TYPE_CHECKING:\n    from .x import Y\n"
    )
    found = imported_modules(source, "candor.harness.mod")
    assert {
        "sqlalchemy.orm",
        "fastapi",
        "candor.service",
        "candor.service.store",
        "candor.harness.sibling",
        "httpx",
        "candor.harness.x",
    } <= found
    assert "candor.harness.inner.z" in imported_modules("from .z import q\n", "candor.harness.inner", is_package=True)


def test_harness_never_imports_service() -> None:
    """Habit 9, STYLE §1: no module of the library layer imports candor.service (nor sqlalchemy/fastapi)."""
    # cli.py is the command line of the service (STYLE §1): it is the one module outside service/ that drives it.
    library = [p for p in _imports_by_file().items() if not _under(p[0], SERVICE) and p[0] != SRC / "candor" / "cli.py"]
    assert library, "no library modules found"
    offending = {
        str(path.relative_to(SRC)): sorted(n for n in names if n.startswith(FORBIDDEN_FOR_LIBRARY))
        for path, names in library
    }
    assert {k: v for k, v in offending.items() if v} == {}


def test_client_import_loads_no_service() -> None:
    """`candor.client` loads no module of the service, nor the database layer, the HTTP server or aiohttp: the
    webhook verifier it re-exports lives in `candor.webhook_signature` (standard library only)."""
    loaded = _loaded_modules("import candor.client")
    assert "candor.webhook_signature" in loaded
    heavy = ("candor.service", "sqlalchemy", "fastapi", "uvicorn", "aiohttp")
    assert [m for m in loaded if any(m == f or m.startswith(f + ".") for f in heavy)] == []


def test_sqlalchemy_only_in_store_and_migrations() -> None:
    """Habit 9: sqlalchemy is imported only under service/store/ and service/migrations/."""
    allowed = (SERVICE / "store", SERVICE / "migrations")
    offending = [
        str(path.relative_to(SRC))
        for path, names in _imports_by_file().items()
        if any(_top(n) == "sqlalchemy" for n in names) and not any(_under(path, d) for d in allowed)
    ]
    assert offending == []


def test_fastapi_only_in_http() -> None:
    """Habit 9: fastapi is imported only under service/http/ (nowhere while that package does not exist)."""
    offending = [
        str(path.relative_to(SRC))
        for path, names in _imports_by_file().items()
        if any(_top(n) == "fastapi" for n in names) and not _under(path, SERVICE / "http")
    ]
    assert offending == []


def test_protocol_imports_neither_sql_nor_http() -> None:
    """Habit 9, STYLE §1: service/protocol/ (pure decisions) imports neither sqlalchemy nor fastapi."""
    protocol = SERVICE / "protocol"
    if not protocol.is_dir():
        pytest.skip("service/protocol/ does not exist yet")
    files = {p: n for p, n in _imports_by_file().items() if _under(p, protocol)}
    assert files
    offending = {
        str(path.relative_to(SRC)): sorted(n for n in names if _top(n) in ("sqlalchemy", "fastapi"))
        for path, names in files.items()
    }
    assert {k: v for k, v in offending.items() if v} == {}


def test_store_and_http_exist_or_are_skipped() -> None:
    """Habit 9: the allowed homes are real packages once they exist (a typo in the rule would hide violations)."""
    for directory in (SERVICE / "store", SERVICE / "migrations", SERVICE / "http"):
        if directory.is_dir():
            assert (directory / "__init__.py").is_file() or any(directory.glob("*.py")), directory


# --- private members, the HTTP layer's reach and dialect branches (issue 16) ------------------------------------


def _package_of(path: Path) -> str:
    """The package a module belongs to: its directory (a package's `__init__` belongs to the package itself)."""
    name = _module_name(path)
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def _parse(source: str) -> ast.Module:
    """`ast.parse`, tried once more on CPython 3.11's "AST constructor recursion depth mismatch" (gh-106905: the
    converter's depth counter is shared by threads, so a thread left running by an earlier test in this process can
    upset it; fixed in 3.12)."""
    try:
        return ast.parse(source)
    except SystemError:
        return ast.parse(source)


def _trees() -> dict[Path, ast.Module]:
    return {p: _parse(p.read_text(encoding="utf-8")) for p in sorted(CANDOR.rglob("*.py")) if not _under(p, MIGRATIONS)}


def private_definitions(trees: dict[str, ast.Module]) -> dict[str, set[str]]:
    """`_name` → the packages that define it (functions, classes, assignments, attribute stores)."""
    owners: dict[str, set[str]] = {}
    for package, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = node.name
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                name = node.attr
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                name = node.id
            else:
                continue
            if name.startswith("_") and not name.startswith("__"):
                owners.setdefault(name, set()).add(package)
    return owners


def private_reaches(package: str, tree: ast.Module, owners: dict[str, set[str]]) -> list[str]:
    """`_name`s that `tree` (a module of `package`) reads off another package: `x._name` where only other packages
    define `_name`, and `from <other package> import _name`. Access through `self`/`cls` is the object's own."""
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue
            defined_in = owners.get(node.attr, set())
            if defined_in and package not in defined_in:
                found.append(f"line {node.lineno}: .{node.attr} (defined in {', '.join(sorted(defined_in))})")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("candor"):
            source_package = node.module or ""
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__") and source_package != package:
                    found.append(f"line {node.lineno}: from {source_package} import {alias.name}")
    return found


MIGRATIONS = SERVICE / "migrations"


def test_private_member_scanner() -> None:
    """The scanner: a `_name` defined only in another package is flagged; its own package's, `self.`'s and dunders
    are not."""
    trees = {
        "candor.harness": ast.parse("class S:\n    def _ref(self):\n        return self._ref()\n"),
        "candor.service.worker": ast.parse(
            "from candor.harness.state import _trusted\nx = s._ref()\nself._ref()\ny = s.__dict__\n"
        ),
    }
    owners = private_definitions(trees)
    assert sorted(private_reaches("candor.service.worker", trees["candor.service.worker"], owners)) == [
        "line 1: from candor.harness.state import _trusted",
        "line 2: ._ref (defined in candor.harness)",
    ]
    assert private_reaches("candor.harness", trees["candor.harness"], owners) == []


def test_no_private_member_access_across_packages() -> None:
    """STYLE habit 8: a leading `_` means private to its package; no module reads another package's `_` members
    (the service reads harness state through `history_view()`/`capabilities_view()`/`environment_view()`)."""
    trees = _trees()
    owners = private_definitions({f"{_package_of(p)}#{p}": t for p, t in trees.items()})
    owners = {name: {o.split("#")[0] for o in packages} for name, packages in owners.items()}
    # The check can fail: the accessor the service used to call is still a harness-private name.
    assert private_reaches("candor.service.worker", ast.parse("state._history_ref()"), owners)
    offending = {
        str(path.relative_to(SRC)): found
        for path, tree in trees.items()
        if (found := private_reaches(_package_of(path), tree, owners))
    }
    assert offending == {}


def test_http_never_imports_the_store() -> None:
    """Habit 10: the HTTP layer reaches the database only through commands (and admin): no import of
    candor.service.store under service/http/."""
    offending = {
        str(path.relative_to(SRC)): sorted(n for n in names if n.startswith("candor.service.store"))
        for path, names in _imports_by_file().items()
        if _under(path, SERVICE / "http")
    }
    assert {k: v for k, v in offending.items() if v} == {}


def dialect_branches(tree: ast.Module) -> list[int]:
    """Lines comparing against a dialect: `x.dialect.name == …`, or `== "postgresql"`/`"sqlite"` (and `!=`, `in`)."""
    lines: list[int] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left, *node.comparators]
        names_dialect = any(
            isinstance(o, ast.Attribute)
            and o.attr == "name"
            and isinstance(o.value, ast.Attribute)
            and o.value.attr == "dialect"
            for o in operands
        )
        literal = any(isinstance(o, ast.Constant) and o.value in ("postgresql", "sqlite") for o in operands)
        if names_dialect or literal:
            lines.append(node.lineno)
    return lines


def test_dialect_branch_scanner() -> None:
    """The scanner finds both spellings of a dialect branch and ignores other comparisons."""
    source = (
        'a = e.dialect.name == "x"\nb = name != "sqlite"\nc = kind == "webhook"\nd = url.set(drivername="postgresql")\n'
    )
    assert dialect_branches(ast.parse(source)) == [1, 2]


def test_dialect_branches_only_in_dialect_py() -> None:
    """STYLE habit 4: only the two halves of the dialect, store/db/dialect.py (connections) and
    store/schema/dialect.py (DDL and statement fragments), branch on SQLite vs PostgreSQL (migrations are frozen
    history)."""
    allowed = {SERVICE / "store" / "db" / "dialect.py", SERVICE / "store" / "schema" / "dialect.py"}
    assert all(path.is_file() for path in allowed)
    offending = {
        str(path.relative_to(SRC)): lines
        for path, tree in _trees().items()
        if path not in allowed and (lines := dialect_branches(tree))
    }
    assert offending == {}


# --- the store's faces and the package graph (issue 37 item 1) -------------------------------------------------

STORE = SERVICE / "store"
ALEMBIC_SCRIPTS = (MIGRATIONS / "env.py", MIGRATIONS / "versions")
"""Files Alembic executes (from `store/schema/migration.py`), never imported as modules: env.py reaches into the
store it is run by, and the revisions are frozen history."""


def private_store_modules(names: set[str]) -> list[str]:
    """The names in `names` that are (or are inside) a module of a store subpackage, `candor.service.store.<sub>.
    <module>`, rather than a subpackage's face; a name imported from a face (`…store.db.read_transaction`) is not
    one, as no file of that name exists."""
    found: set[str] = set()
    for name in names:
        parts = name.split(".")
        if parts[:3] != ["candor", "service", "store"] or len(parts) < 5:
            continue
        if (SRC.joinpath(*parts[:4]) / f"{parts[4]}.py").is_file():
            found.add(".".join(parts[:5]))
    return sorted(found)


def test_private_store_module_scanner() -> None:
    """The check can fail: a store module is caught, a face and a name imported from a face are not."""
    assert private_store_modules(
        {
            "candor.service.store.db.engine",
            "candor.service.store.db.engine.write_transaction",
            "candor.service.store.db",
            "candor.service.store.db.write_transaction",
        }
    ) == ["candor.service.store.db.engine"]


def test_code_outside_the_store_imports_only_its_faces() -> None:
    """Issue 37 item 1: commands/, worker/, control/, http/, admin/, outbox/ and every other module outside
    store/ import a store subpackage's `__init__` (its face), never one of its modules."""
    offending = {
        str(path.relative_to(SRC)): found
        for path, names in _imports_by_file().items()
        if not _under(path, STORE) and (found := private_store_modules(names))
    }
    assert offending == {}


def test_faces_export_what_they_import() -> None:
    """Each store subpackage's face lists in `__all__` exactly the names it imports (no silent extra exports), and
    none is named like a module of its package (`schema.migrate` would be the function or the module by turns)."""
    subpackages = [p for p in STORE.iterdir() if (p / "__init__.py").is_file()]
    assert subpackages
    for package in subpackages:
        tree = _parse((package / "__init__.py").read_text(encoding="utf-8"))
        imported = {
            alias.asname or alias.name
            for node in tree.body
            if isinstance(node, ast.ImportFrom) and node.module != "__future__"
            for alias in node.names
        }
        exported = next(
            ast.literal_eval(node.value)
            for node in tree.body
            if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "__all__" for t in node.targets)
        )
        assert sorted(exported) == sorted(imported), package.name
        assert not {name for name in exported if (package / f"{name}.py").is_file()}, package.name


def package_graph(parent: Path, imports: dict[Path, set[str]]) -> dict[str, set[str]]:
    """Which children of the package at `parent` (subpackages and modules) import which other children."""
    prefix = _module_name(parent / "__init__.py") + "."
    children = {p.stem if p.is_file() else p.name for p in parent.iterdir() if p.suffix == ".py" or p.is_dir()}
    children.discard("__init__")
    graph: dict[str, set[str]] = {}
    for path, names in imports.items():
        if not _under(path, parent) or (path.parent == parent and path.name == "__init__.py"):
            continue
        source = path.relative_to(parent).parts[0].removesuffix(".py")
        for name in names:
            if name.startswith(prefix):
                target = name[len(prefix) :].split(".")[0]
                if target != source and target in children:
                    graph.setdefault(source, set()).add(target)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str]:
    """A cycle of `graph` as `[a, b, …, a]`, or `[]` when it has none (depth-first search, nodes in name order)."""
    done: set[str] = set()
    path: list[str] = []

    def visit(node: str) -> list[str]:
        if node in path:
            return [*path[path.index(node) :], node]
        if node in done:
            return []
        path.append(node)
        for target in sorted(graph.get(node, ())):
            if cycle := visit(target):
                return cycle
        path.pop()
        done.add(node)
        return []

    for node in sorted(graph):
        if cycle := visit(node):
            return cycle
    return []


def test_cycle_finder() -> None:
    """The check can fail: a cycle is named from its first node; a diamond is no cycle."""
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"d"}, "c": {"d"}}) == []
    package = SERVICE / "store"
    fake = {package / "db" / "engine.py": {"candor.service.store.schema.tables"}, package / "schema" / "x.py": set()}
    fake[package / "schema" / "tables.py"] = {"candor.service.store.db"}
    assert find_cycle(package_graph(package, fake)) == ["db", "schema", "db"]


def _scanned_imports() -> dict[Path, set[str]]:
    return {p: n for p, n in _imports_by_file().items() if not any(p == s or _under(p, s) for s in ALEMBIC_SCRIPTS)}


@pytest.mark.parametrize("parent", [SERVICE, STORE], ids=["service", "store"])
def test_package_import_graph_has_no_cycle(parent: Path) -> None:
    """Issue 37 item 1: the children of candor.service (subpackages and modules) and the subpackages of
    candor.service.store import each other without a cycle, counting every import (in functions and
    TYPE_CHECKING blocks too), so each layer can be read, tested and changed without the ones above it."""
    graph = package_graph(parent, _scanned_imports())
    assert graph, parent
    assert find_cycle(graph) == []
