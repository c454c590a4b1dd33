"""The import graph of our code, read from the source with `ast` (nothing is imported): which of our
modules each module imports, at module level and inside functions alike. `from x import y` counts
as importing `x.y` when `y` is a module of ours, else as importing `x`."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGES = ("infra", "scripts", "trainer", "gputrain_node")


def module_files(root: Path, packages: tuple[str, ...] = PACKAGES) -> dict[str, Path]:
    """Dotted module name -> file; a package is its __init__.py."""
    files: dict[str, Path] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return files


def _imported(name: str, path: Path, node: ast.ImportFrom) -> str:
    """The absolute module a `from ... import` names (relative imports resolved against `name`)."""
    if not node.level:
        return node.module or ""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    base = package[: len(package) - node.level + 1]
    return ".".join([*base, node.module] if node.module else base)


def _ours(name: str, modules: dict[str, Path]) -> str | None:
    """The longest prefix of `name` that is one of our modules (`import a.b.c` names a.b.c)."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        if (prefix := ".".join(parts[:end])) in modules:
            return prefix
    return None


def import_graph(root: Path, packages: tuple[str, ...] = PACKAGES) -> dict[str, set[str]]:
    """Module -> the modules of ours it imports (itself excluded)."""
    modules = module_files(root, packages)
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets: set[str | None] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets |= {_ours(alias.name, modules) for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = _imported(name, path, node)
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    targets.add(sub if sub in modules else _ours(base, modules))
        graph[name] = {t for t in targets if t is not None and t != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle as [a, b, ..., a], or None when the graph has none."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start)):
            return cycle
    return None


def edges(graph: dict[str, set[str]], source: str, target: str) -> list[str]:
    """Every `a -> b` with a in package/module `source` and b in `target` (dotted prefixes)."""

    def within(module: str, prefix: str) -> bool:
        return module == prefix or module.startswith(prefix + ".")

    return sorted(
        f"{a} -> {b}"
        for a, imported in graph.items()
        if within(a, source)
        for b in imported
        if within(b, target)
    )
