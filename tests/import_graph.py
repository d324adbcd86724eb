"""The import graph of Bouquet's packages, read from the source: every `import`, lazy ones (inside
functions) included, type-checking-only ones left out.

`python tests/import_graph.py` lists the edges between top-level packages and any circle among
modules; `tests/test_import_graph.py` checks that the edges only point downward:
server_app → strategies → models / datasets, client_app → strategies → models / datasets, and the
in-process and deployment harness (`server_app.harness`) on top of both halves.
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("server_app", "client_app", "strategies", "models", "datasets")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _runtime_nodes(tree: ast.AST):
    """Every node except those under `if TYPE_CHECKING:` (annotations only, never imported)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        yield node
        yield from _runtime_nodes(node)


def module_imports() -> dict[str, set[str]]:
    """module → the project modules it imports (anywhere in its body)."""
    modules = {module_name(p): p for package in PACKAGES for p in (REPO / package).rglob("*.py")}
    edges: dict[str, set[str]] = defaultdict(set)
    for name, path in modules.items():
        for node in _runtime_nodes(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [f"{node.module}.{alias.name}" for alias in node.names] + [node.module]
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name and target.split(".")[0] in PACKAGES:
                    edges[name].add(target)
        edges.setdefault(name, set())
    return dict(edges)


def group(module: str) -> str:
    """The layer a module belongs to: its top-level package, or `server_app.harness`."""
    return "server_app.harness" if module.startswith("server_app.harness") else module.split(".")[0]


def package_edges(edges: dict[str, set[str]]) -> dict[tuple[str, str], list[str]]:
    """(from layer, to layer) → example module edges, for edges between different layers."""
    out: dict[tuple[str, str], list[str]] = defaultdict(list)
    for source, targets in edges.items():
        for target in sorted(targets):
            if group(source) != group(target):
                out[(group(source), group(target))].append(f"{source} → {target}")
    return dict(out)


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (import circles), by Tarjan's algorithm."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


if __name__ == "__main__":
    graph = module_imports()
    for (source, target), examples in sorted(package_edges(graph).items()):
        print(f"{source} → {target}  ({len(examples)} imports, e.g. {examples[0]})")
    for circle in cycles(graph):
        print("circle:", " ↔ ".join(circle))
