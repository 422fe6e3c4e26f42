"""No import cycle in the package, counting imports inside functions (issue 21).

A cycle hidden in a function still ties two modules together: neither can be read, tested or
moved without the other. The graph is read with `ast` from the source, so an import that only
runs on some path counts as much as one at the top.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, List, Set

import batchfutures

PACKAGE = Path(batchfutures.__file__).parent


def module_names() -> Dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _target(name: str, modules: Dict[str, Path]) -> str:
    """The module an imported dotted name lives in (a name from a module: that module)."""
    while name not in modules and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


def imports_of(module: str, path: Path, modules: Dict[str, Path]) -> Set[str]:
    is_package = path.name == "__init__.py"
    edges: Set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[:len(base) - node.level + 1]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            names = [f"{prefix}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            target = _target(name, modules)
            if target in modules and target != module:
                edges.add(target)
    return edges


def cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    found: List[List[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in graph[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                other = stack.pop()
                on_stack.discard(other)
                component.append(other)
                if other == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return found


def test_the_cycle_finder_finds_a_cycle_through_a_function_level_import(tmp_path):
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    # an import inside a function counts
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "one.py").write_text("from . import two\n")
    (package / "two.py").write_text("def f():\n    from .one import g\n")
    modules = {"pkg": package / "__init__.py", "pkg.one": package / "one.py",
               "pkg.two": package / "two.py"}
    graph = {name: imports_of(name, path, modules) for name, path in modules.items()}
    assert cycles(graph) == [["pkg.one", "pkg.two"]]


def test_the_package_has_no_import_cycle():
    modules = module_names()
    graph = {name: imports_of(name, path, modules) for name, path in modules.items()}
    assert "batchfutures.worker" in graph and graph["batchfutures.executor"]  # it read the package
    assert cycles(graph) == []
