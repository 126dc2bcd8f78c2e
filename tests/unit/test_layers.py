"""The rooms of `multiraft/` and the project around it keep their import rules.

Goal: parse every project module (multiraft, raftlog, storage, chaos,
spark_connector, pyspark_raftlog, bench; not tests) and check who may import
whom, as docs/architecture.md states the rules (DESIGN.md section 2, issue 22).

What counts as an import: every `import` and `from ... import` anywhere in a
module: at the top, inside functions (deferred imports), and under
`if TYPE_CHECKING:`. A name imported only for a type annotation still ties the
two modules together, so the layer rules count every import. `from a.b import c`
counts as an import of the module `a.b.c` when that is a project module, else of
`a.b`. Importing `a.b.c` does not count as importing the package `a.b`.

Import cycles are found among project modules over the same edges, TYPE_CHECKING
ones included: a type-only import hides a cycle from the interpreter, not from a
reader, and it is how the cycles through `node.node` were kept alive (the services
took the whole node, under TYPE_CHECKING) until they took narrow collaborators.

The allow-lists below are today's debts, to burn down: each must match exactly
what the code does, so a new violation fails, and so does a fixed one until its
line is removed (the lists only shrink).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("multiraft", "raftlog", "storage", "chaos", "spark_connector", "pyspark_raftlog", "bench")

# Rooms of multiraft/ and the rooms each may import (besides itself). `multiraft.errors`
# (the error table every room answers with) is the one module outside the rooms.
ERRORS = "multiraft.errors"
ROOM_MAY_IMPORT: dict[str, frozenset[str]] = {
    # Sockets and secrets both servers accept through (TLS, the TLS listener, private files).
    "net": frozenset(),
    "transport": frozenset({"net"}),
    "state": frozenset(),
    "metadata": frozenset(),
    # Consumer groups: the state machine group 0 applies beside the catalog (pure, as state/).
    "consumer_groups": frozenset(),
    "runtime": frozenset({"transport", "state", "metadata"}),
    "node": frozenset({"net", "transport", "runtime", "state", "metadata", "consumer_groups"}),
    # http imports metadata and, of the node, only its narrow API (`node.api`, below).
    "http": frozenset({"metadata", "net"}),
    "client": frozenset(),
    "cli": frozenset({"net", "transport", "runtime", "state", "metadata", "consumer_groups", "node", "http",
                      "client"}),
}
# Single modules a room may import beyond its rooms.
MODULES_ALLOWED: dict[str, frozenset[str]] = {
    "http": frozenset({"multiraft.node.api"}),
    "client": frozenset({"multiraft.state.partitioner"}),
}
# Rooms that hold state machines: no I/O, no event loop.
PURE_ROOMS = frozenset({"state", "metadata", "consumer_groups"})
IO_MODULES = frozenset({"asyncio", "aiohttp", "socket", "ssl", "selectors", "subprocess", "threading"})
# The project outside multiraft/: what each may import of multiraft.
OUTSIDE_MAY_IMPORT: dict[str, frozenset[str]] = {
    "raftlog": frozenset(),
    "storage": frozenset(),
    "spark_connector": frozenset({"multiraft.client"}),
    "pyspark_raftlog": frozenset({"multiraft.client"}),
    "chaos": frozenset({"multiraft.client", "multiraft.cli.launcher"}),
}
# Packages a package outside multiraft/ may not import at all. The Raft core stands
# alone: the storage it reads through is its own Protocol (raftlog/storage.py), and
# its simulator lives in tests/sim/, which may import anything.
OUTSIDE_MAY_NOT_IMPORT: dict[str, frozenset[str]] = {
    "raftlog": frozenset({"storage", "multiraft"}),
}
# storage (the batch codec) is the client's only dependency outside multiraft.
CLIENT_OUTSIDE_ALLOWED = frozenset({"storage.batch"})

# To burn down: imports that break the rules above today, (importer, imported).
# Imports that break the rules above: none left (issue 22 paid the last); keep it empty.
ALLOWED_VIOLATIONS: frozenset[tuple[str, str]] = frozenset()
# To burn down: what spark_connector/ and chaos/ import of multiraft besides the client's
# face (`multiraft.client`) and the launcher (none left: keep it so).
ALLOWED_OUTSIDE: frozenset[tuple[str, str]] = frozenset()
# Import cycles allowed, each as the set of modules tied in it: none (issue 22 removed
# the last); keep it empty.
ALLOWED_CYCLES: frozenset[frozenset[str]] = frozenset()


@dataclass(frozen=True, slots=True)
class Import:
    importer: str
    imported: str
    type_only: bool  # under `if TYPE_CHECKING:`


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_modules(root: Path, packages: tuple[str, ...] = PACKAGES) -> dict[str, Path]:
    modules = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            modules[module_name(path, root)] = path
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_nodes(tree: ast.AST, type_only: bool = False):
    """Every Import/ImportFrom node in the tree, with whether it sits under TYPE_CHECKING."""
    for child in ast.iter_child_nodes(tree):
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            yield child, type_only
        elif isinstance(child, ast.If) and _is_type_checking(child.test):
            for statement in child.body:
                yield from _import_nodes(ast.Module(body=[statement], type_ignores=[]), True)
            for statement in child.orelse:
                yield from _import_nodes(ast.Module(body=[statement], type_ignores=[]), type_only)
        else:
            yield from _import_nodes(child, type_only)


def module_imports(name: str, source: str, known: set[str], is_package: bool = False) -> list[Import]:
    """What module `name` (its `source`) imports; `known` names the project's modules."""
    package = name.split(".") if is_package else name.split(".")[:-1]
    found = []
    for node, type_only in _import_nodes(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.extend(Import(name, alias.name, type_only) for alias in node.names)
            continue
        base = node.module or ""
        if node.level:
            base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
        for alias in node.names:
            target = f"{base}.{alias.name}"
            found.append(Import(name, target if target in known else base, type_only))
    return found


def all_imports(root: Path = ROOT) -> list[Import]:
    modules = project_modules(root)
    known = set(modules)
    found = []
    for name, path in modules.items():
        found.extend(module_imports(name, path.read_text(), known, path.name == "__init__.py"))
    return found


def room_of(module: str) -> str | None:
    """`multiraft.<room>.…` -> room; None for modules outside the rooms."""
    parts = module.split(".")
    if parts[0] == "multiraft" and len(parts) >= 2 and parts[1] in ROOM_MAY_IMPORT:
        return parts[1]
    return None


def violations(imports: list[Import]) -> set[tuple[str, str]]:
    """(importer, imported) pairs that break the layer rules."""
    bad = set()
    for item in imports:
        top = item.imported.split(".")[0]
        importer_top = item.importer.split(".")[0]
        if importer_top in OUTSIDE_MAY_IMPORT:
            if top == "multiraft" and item.imported not in OUTSIDE_MAY_IMPORT[importer_top]:
                bad.add((item.importer, item.imported))
            if top in OUTSIDE_MAY_NOT_IMPORT.get(importer_top, frozenset()):
                bad.add((item.importer, item.imported))
            continue
        room = room_of(item.importer)
        if item.importer == ERRORS or item.importer == "multiraft":
            if top == "multiraft":
                bad.add((item.importer, item.imported))
            continue
        if room is None:
            continue
        if room in PURE_ROOMS and top in IO_MODULES:
            bad.add((item.importer, item.imported))
        if room == "client" and top in {"storage", "raftlog"} and item.imported not in CLIENT_OUTSIDE_ALLOWED:
            bad.add((item.importer, item.imported))
        if top != "multiraft" or item.imported == ERRORS:
            continue
        target_room = room_of(item.imported)
        if target_room == room or target_room in ROOM_MAY_IMPORT[room]:
            continue
        if item.imported in MODULES_ALLOWED.get(room, frozenset()):
            continue
        bad.add((item.importer, item.imported))
    return bad


def cycles(imports: list[Import], known: set[str]) -> set[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    edges: dict[str, set[str]] = {name: set() for name in known}
    for item in imports:
        if item.imported in known and item.imported != item.importer:
            edges[item.importer].add(item.imported)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: set[frozenset[str]] = set()
    for start in sorted(known):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.add(frozenset(component))
    return found


@pytest.fixture(scope="module")
def imports() -> list[Import]:
    return all_imports()


def test_every_module_is_in_a_room() -> None:
    # Goal: multiraft/ holds rooms and the error table only; a new flat module must pick a room.
    loose = [name for name in project_modules(ROOT, ("multiraft",))
             if name not in {"multiraft", ERRORS} and room_of(name) is None]
    assert not loose, f"modules outside the rooms of multiraft/: {loose}"


def test_no_new_layer_violation(imports: list[Import]) -> None:
    # Goal: every import obeys the rules, except the named debts, which must still exist.
    found = violations(imports)
    allowed = ALLOWED_VIOLATIONS | ALLOWED_OUTSIDE
    assert sorted(found - allowed) == [], "new layer violations (fix them; see docs/architecture.md)"
    assert sorted(allowed - found) == [], "paid debts: remove them from the allow-list"


def test_no_new_import_cycle(imports: list[Import]) -> None:
    # Goal: no module joins a cycle and no new cycle appears; a broken cycle leaves the list.
    found = cycles(imports, set(project_modules(ROOT)))
    new = [sorted(cycle) for cycle in found if not any(cycle <= allowed for allowed in ALLOWED_CYCLES)]
    assert new == [], "new import cycles"
    stale = [sorted(allowed) for allowed in ALLOWED_CYCLES if allowed not in found]
    assert stale == [], "cycles that changed or are gone: update the allow-list"


def test_the_checker_catches_violations(tmp_path: Path) -> None:
    # Goal: the checks above can fail. Plant modules that break each kind of rule, in
    # a tree of their own, and read them with the same functions.
    files = {
        "multiraft/__init__.py": "",
        "multiraft/errors.py": "",
        "multiraft/transport/__init__.py": "",
        "multiraft/transport/frames.py": "from multiraft.node.node import Node\n",
        "multiraft/state/__init__.py": "",
        "multiraft/state/partition.py": "def f():\n    import asyncio\n",
        "multiraft/runtime/__init__.py": "",
        "multiraft/runtime/group.py": (
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from multiraft.http import app\n"
        ),
        "multiraft/http/__init__.py": "",
        "multiraft/http/app.py": "from multiraft.metadata import catalog\nfrom multiraft.errors import X\n",
        "multiraft/http/view.py": "from multiraft.node.api import NodeApi\nfrom multiraft.node.node import Node\n",
        "multiraft/metadata/__init__.py": "",
        "multiraft/metadata/catalog.py": "",
        "multiraft/node/__init__.py": "",
        "multiraft/node/node.py": "from multiraft.runtime import group\n",
        "multiraft/node/api.py": "",
        "raftlog/__init__.py": "import multiraft.errors\n",
        "raftlog/sim.py": "def f():\n    from storage.memory import MemoryStorage\n",
        "storage/__init__.py": "",
        "storage/memory.py": "from raftlog import messages\n",
        "chaos/__init__.py": "from multiraft.client import Client\nfrom multiraft.node import node\n",
    }
    for relative, text in files.items():
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text(text)
    planted = all_imports(tmp_path)
    assert violations(planted) == {
        ("multiraft.transport.frames", "multiraft.node.node"),
        ("multiraft.state.partition", "asyncio"),
        ("multiraft.runtime.group", "multiraft.http.app"),
        ("multiraft.http.view", "multiraft.node.node"),  # node.api beside it is allowed
        ("raftlog", "multiraft.errors"),
        ("raftlog.sim", "storage.memory"),
        ("chaos", "multiraft.node.node"),
    }
    assert [item.type_only for item in planted if item.importer == "multiraft.runtime.group"] == [False, True]
    (tmp_path / "multiraft/runtime/group.py").write_text("from multiraft.node import node\n")
    assert cycles(all_imports(tmp_path), set(project_modules(tmp_path))) == {
        frozenset({"multiraft.node.node", "multiraft.runtime.group"}),
    }
