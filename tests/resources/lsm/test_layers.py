"""The engine's imports run one way: no module imports itself back through others, Dagster never."""

from __future__ import annotations

import ast
from pathlib import Path

ENGINE = Path(__file__).resolve().parents[3] / "resources" / "lsm"


def _module_name(path: Path) -> str:
    parts = path.relative_to(ENGINE.parents[1]).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, modules: set[str]) -> set[str]:
    """The engine modules ``path`` imports anywhere (top level, functions, ``TYPE_CHECKING`` blocks)."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            target = ".".join([*base, node.module] if node.module else base)
            found |= {c for c in [target, *(f"{target}.{a.name}" for a in node.names)] if c in modules}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name in modules}
    return found - {name}


def _engine_graph() -> dict[str, set[str]]:
    paths = {_module_name(p): p for p in ENGINE.rglob("*.py")}
    modules = set(paths)
    # A package's __init__ re-exports lazily: importing ``resources.lsm`` itself is no dependency on its parts.
    return {name: _imports(path, modules) - {"resources.lsm"} for name, path in paths.items()}


def _cycle_through(graph: dict[str, set[str]], start: str) -> list[str] | None:
    """A path of imports from ``start`` back to itself, if there is one."""
    stack, seen = [(start, [start])], set()
    while stack:
        module, path = stack.pop()
        for imported in graph[module]:
            if imported == start:
                return [*path, start]
            if imported not in seen:
                seen.add(imported)
                stack.append((imported, [*path, imported]))
    return None


def test_no_engine_module_imports_itself_back():
    graph = _engine_graph()
    cycles = [cycle for module in sorted(graph) if (cycle := _cycle_through(graph, module))]
    assert not cycles, "import loops: " + "; ".join(" -> ".join(c) for c in cycles)


def test_maintenance_takes_the_handle_not_the_facade():
    graph = _engine_graph()
    lower = [m for m in graph if m.split(".")[2:3] in (["format"], ["read"], ["write"], ["ingest"], ["maintenance"])]
    assert not [m for m in lower if "resources.lsm.table" in graph[m]]


def test_the_engine_never_imports_dagster():
    for path in ENGINE.rglob("*.py"):
        tree = ast.parse(path.read_text())
        names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        names += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and not n.level]
        assert not [n for n in names if n.split(".")[0].startswith("dagster")], path
