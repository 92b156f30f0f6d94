"""The import graph of a package, read from its source (nothing is imported).

Every import statement counts, wherever it stands: at the top, under `if TYPE_CHECKING:`, or inside a
function. `from a import b` is an arrow to the module `a.b` when that is a module of the package, else to `a`.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

Graph = Mapping[str, set[str]]


def imported_modules(path: Path) -> set[str]:
    """Every dotted name an import in `path` names: the module, and for `from m import x` also `m.x`."""
    names: set[str] = set()
    for module, alias in imports(path):
        names.add(module)
        if alias is not None:
            names.add(f"{module}.{alias}")
    return names


def imports(path: Path) -> list[tuple[str, str | None]]:
    """(module, name) for each name of `from module import name`; (module, None) for `import module`."""
    tree = ast.parse(path.read_text(), str(path))
    found: list[tuple[str, str | None]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((alias.name, None) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.extend((node.module, alias.name) for alias in node.names)
    return found


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def module_graph(package_dir: Path) -> dict[str, set[str]]:
    """Module -> the modules of the same top package it imports (a package's `__init__` has the package's
    name)."""
    root = package_dir.parent
    files = {module_name(f, root): f for f in sorted(package_dir.rglob("*.py"))}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        targets = set()
        for module, alias in imports(path):
            target = f"{module}.{alias}" if f"{module}.{alias}" in files else module
            if target in files and target != name:
                targets.add(target)
        graph[name] = targets
    return graph


def rooms(graph: Graph, package: str, room: Callable[[str], str | None]) -> dict[str, set[str]]:
    """The graph of `package`'s modules collapsed into rooms: `room(module)` names its room (None: left out).
    Arrows inside a room and arrows leaving the package are dropped."""
    out: dict[str, set[str]] = {}
    for module, targets in graph.items():
        here = room(module) if module.startswith(package + ".") else None
        if here is None:
            continue
        out.setdefault(here, set())
        for t in targets:
            there = room(t) if t.startswith(package + ".") else None
            if there is not None and there != here:
                out[here].add(there)
    for targets in list(out.values()):
        for t in targets:
            out.setdefault(t, set())
    return out


def cycles(graph: Graph) -> list[list[str]]:
    """The strongly connected components of more than one node (or a node importing itself), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(start: str) -> None:  # Tarjan's algorithm, iterative so a deep graph needs no recursion
        work: list[tuple[str, Iterable[str]]] = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1 or node in graph.get(node, ()):
                        found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def longest_chain(graph: Graph) -> list[str]:
    """The longest import chain of an acyclic graph, importer first: its length is the number of floors
    (a module that imports nothing is on floor 1; an importer is one floor above the highest it imports)."""
    best: dict[str, list[str]] = {}

    def chain(node: str) -> list[str]:
        if node not in best:
            below = [chain(t) for t in sorted(graph.get(node, ()))]
            best[node] = [node, *max(below, key=len, default=[])]
        return best[node]

    return max((chain(n) for n in sorted(graph)), key=len, default=[])
