"""The layers of docs/architecture.md, checked against the code: every import of one part of the
package by another (at module level or inside a function) must be one the layer table allows, so
that arrows only point down and the next person can trust the map."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "jupyter_gpu_pool"

# What each part may import of the others (a dotted prefix: "local" is all of local/,
# "local.processes" only that module).  Mirrors the table in docs/architecture.md.
ALLOWED: dict[str, set[str]] = {
    "pool": set(),
    "periodic": set(),
    "compat": set(),
    "traits": {"pool"},
    "config": {"pool", "traits"},
    "devices": {"pool", "periodic"},
    "local": {"pool", "config", "devices"},
    "service": {"pool", "config", "traits", "periodic", "devices", "local"},
    "pools": {"config", "local", "service"},
    "cluster": {"pool", "config", "traits", "periodic"},
    "kernel_provisioner": {"pool", "config", "traits", "compat", "devices", "local", "pools", "cluster"},
    "hibernation": {"pool", "devices", "local", "kernel_provisioner.base"},
    "server_extension": {"pool", "config", "traits", "periodic", "compat", "devices", "local", "pools", "cluster",
                         "hibernation", "kernel_provisioner.base"},
    "operator": {"pool", "config", "traits", "periodic", "devices", "cluster"},
    "planning": {"pool", "config", "local", "devices", "cli"},
    "cli": {"pool", "config", "devices", "local", "pools", "kernel_provisioner"},
    "tljh": {"config", "kernel_provisioner", "service"},
    "__init__": {"server_extension"},
}


@functools.cache
def import_nodes(path: Path) -> tuple[ast.Import | ast.ImportFrom, ...]:
    """A file's import statements, wherever they are (parsed once a run: some fifty tests read them)."""
    return tuple(n for n in ast.walk(ast.parse(path.read_text(), str(path))) if isinstance(n, (ast.Import, ast.ImportFrom)))


def _part(module: str) -> str:
    """``jupyter_gpu_pool.local.ledger`` → ``local``; the package's own ``__init__`` → ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def imports_between_parts() -> list[tuple[str, str, str]]:
    """(file, importing part, imported module relative to the package) for each cross-part import."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        module = ".".join(rel.parts)
        package = module[: -len(".__init__")] if module.endswith(".__init__") else module.rsplit(".", 1)[0]
        for node in import_nodes(path):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                if target == "jupyter_gpu_pool" or node.module is None:
                    targets = [f"{target}.{a.name}" for a in node.names]
                else:
                    targets = [target]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            for target in targets:
                if not target.startswith("jupyter_gpu_pool.") or target == "jupyter_gpu_pool.__version__":
                    continue  # the package's root holds only its version and entry points
                if _part(target) != _part(module):
                    found.append((str(rel), _part(module), target.split(".", 1)[1]))
    return found


def test_the_import_scan_sees_relative_absolute_and_function_level_imports():
    seen = {(f, t) for f, _, t in imports_between_parts()}
    assert ("jupyter_gpu_pool/pools", "service.client") in seen  # inside a function
    assert ("jupyter_gpu_pool/local/database", "config") in seen  # relative, module level
    assert any(part == "server_extension" for _, part, _ in imports_between_parts())


def test_every_part_of_the_package_is_in_the_layer_table():
    parts = {p.stem if p.is_file() else p.name for p in PACKAGE.iterdir()
             if (p.is_file() and p.suffix == ".py") or (p / "__init__.py").exists()}
    assert parts == set(ALLOWED), "a new part of the package: give it a row in docs/architecture.md and ALLOWED"


@pytest.mark.parametrize("part", sorted(ALLOWED))
def test_each_part_imports_only_what_its_layer_allows(part):
    wrong = [f"{f} imports {t}" for f, p, t in imports_between_parts()
             if p == part and not any(t == ok or t.startswith(ok + ".") for ok in ALLOWED[part])]
    assert not wrong, "imports against docs/architecture.md's layers:\n" + "\n".join(wrong)


# -- the server extension's rooms ---------------------------------------------------------------------

# What each room of server_extension/ may import of the others (its subpackages, and its top-level modules by
# name).  The backends and the sleep hooks are the bottom: neither knows the culler, the REST layer or each
# other; the REST layer reads through the context and is imported by nothing but the app.
EXTENSION = "server_extension"
EXTENSION_ROOMS: dict[str, set[str]] = {
    "backends": set(),
    "sleep": set(),
    "notebooks": set(),
    "events": set(),
    "metrics": set(),
    "messages": set(),
    "starting": set(),
    "recorder": {"events", "metrics", "notebooks", "sleep"},
    "context": {"backends", "sleep", "notebooks"},
    "admin_requests": {"backends"},
    "activity": {"backends", "context"},
    "journal_watch": {"admin_requests", "messages", "backends", "context", "recorder"},
    "culler": {"messages", "metrics", "activity", "backends", "context", "sleep", "notebooks", "recorder",
               "journal_watch"},
    "rest": {"backends", "context", "notebooks", "admin_requests"},
    "app": {"backends", "sleep", "rest", "notebooks", "events", "metrics", "messages", "starting", "recorder",
            "context", "admin_requests", "activity", "culler", "journal_watch"},
    "__init__": set(),
}


def _room(module: str) -> str | None:
    """``jupyter_gpu_pool.server_extension.rest.views`` → ``rest``; None outside the extension."""
    parts = module.split(".")
    if len(parts) < 2 or parts[1] != EXTENSION:
        return None
    return parts[2] if len(parts) > 2 else "__init__"


def test_every_room_of_the_server_extension_is_in_its_table():
    root = PACKAGE / EXTENSION
    rooms = {p.stem if p.is_file() else p.name for p in root.iterdir()
             if (p.is_file() and p.suffix == ".py") or (p / "__init__.py").exists()}
    assert rooms == set(EXTENSION_ROOMS), "a new room of server_extension/: give it a row in EXTENSION_ROOMS"


def test_each_room_of_the_server_extension_imports_only_what_its_row_allows():
    wrong = []
    for source, targets in module_imports().items():
        room = _room(source)
        if room is None:
            continue
        for target in targets:
            other = _room(target)
            if other is not None and other != room and other != "__init__" and other not in EXTENSION_ROOMS[room]:
                wrong.append(f"{source} imports {target}")
    assert not wrong, "imports against the server extension's rooms (docs/architecture.md):\n" + "\n".join(wrong)


# -- no import circle inside a package ----------------------------------------------------------------


def _module_of(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    return ".".join(rel.parts[:-1] if rel.parts[-1] == "__init__" else rel.parts)


def module_imports() -> dict[str, set[str]]:
    """Every module of the package -> the package's modules it imports: at module level, inside a
    function, or only for type checking (under ``if TYPE_CHECKING:``), for each is a dependency a reader
    must follow.  ``from . import x`` names the module ``x`` where there is one."""
    modules = {_module_of(p): p for p in sorted(PACKAGE.rglob("*.py"))}
    found: dict[str, set[str]] = {}
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
        targets: set[str] = set()
        for node in import_nodes(path):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join(up + ([node.module] if node.module else []))
                targets.add(base)
                targets.update(f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in modules)
            elif isinstance(node, ast.Import):
                targets.update(a.name for a in node.names)
        found[module] = {t for t in targets if t in modules and t != module}
    return found


def circles() -> dict[str, list[list[str]]]:
    """Per package: its import circles, each a list of the package's children (modules or
    subpackages) that import one another round (an import of ``a.b.c`` by ``a.d`` is ``d`` -> ``b``
    in package ``a``)."""
    imports = module_imports()
    packages = {m for m in imports if (PACKAGE.parent / m.replace(".", "/") / "__init__.py").exists()}
    out: dict[str, list[list[str]]] = {}
    for package in sorted(packages):
        depth = package.count(".") + 1

        def child(module: str) -> str | None:
            parts = module.split(".")
            return parts[depth] if module.startswith(package + ".") else None

        graph: dict[str, set[str]] = {}
        for source, targets in imports.items():
            a = child(source)
            if a is None:
                continue
            graph.setdefault(a, set()).update(b for t in targets if (b := child(t)) is not None and b != a)
        found = _strongly_connected(graph)
        if found:
            out[package] = found
    return out


def _strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's components of more than one node: each is one or more circles."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_circle_finder_sees_type_only_and_function_level_imports():
    found = _strongly_connected({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}})
    assert found == [["a", "b", "c"]]
    imports = module_imports()
    assert "jupyter_gpu_pool.service.client" in imports["jupyter_gpu_pool.pools"]  # inside a function
    assert "jupyter_gpu_pool.server_extension.backends.base" in imports["jupyter_gpu_pool.server_extension.rest.views"]


@pytest.mark.parametrize("package", sorted(_module_of(p) for p in PACKAGE.rglob("__init__.py")))
def test_no_import_circle_inside_a_package(package):
    found = circles().get(package, [])
    assert not found, f"import circles inside {package} (each group imports one another round):\n" + "\n".join(
        " <-> ".join(c) for c in found)


def test_every_test_module_has_a_name_of_its_own():
    """The tests run in pytest's default import mode, which imports each test file by its base name: two
    files of one name in different folders fail the whole run's collection ('import file mismatch')."""
    tests = Path(__file__).resolve().parent
    seen: dict[str, list[str]] = {}
    for path in tests.rglob("test_*.py"):
        seen.setdefault(path.name, []).append(str(path.relative_to(tests)))
    assert not {name: paths for name, paths in seen.items() if len(paths) > 1}
