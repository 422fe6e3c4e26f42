"""Imports inside functions only where start-up needs them, each with its reason (issue 30).

An import inside a function hides a dependency from the top of the module, where a reader looks
for it. One stays inside a function only for one of these reasons, named in a comment on its line
or in the comment lines right above it (above the imports right before it, for a group):

    start-up:  the module costs >= 1 ms (the fewest of 9 fresh interpreters, bytecode cached) on a
               start that does not use it: `from batchfutures import BatchExecutor`, a local run,
               an AWS run, a worker's attempt, a command of `batchfutures` (each imports what it
               runs) or its --help, `python -m batchfutures.emulator` and its --help
    cycle:     at the top it would close an import cycle
    optional:  the dependency may be absent (an extra)

`if TYPE_CHECKING:` imports are at the top: they are not counted here.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Dict, List

import pytest

import batchfutures

PACKAGE = Path(batchfutures.__file__).parent
REASON = re.compile(r"#.*\b(start-up|cycle|optional):\s*\S")


def _import_groups(tree: ast.AST) -> List[List[ast.stmt]]:
    """The imports inside functions, in runs of consecutive import statements of one body."""
    groups: List[List[ast.stmt]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for field in ("body", "orelse", "finalbody", "handlers"):
            body = getattr(node, field, None)
            if not isinstance(body, list):
                continue
            run: List[ast.stmt] = []
            for statement in body:
                if in_function and isinstance(statement, (ast.Import, ast.ImportFrom)):
                    run.append(statement)
                    continue
                if run:
                    groups.append(run)
                    run = []
            if run:
                groups.append(run)
        for child in ast.iter_child_nodes(node):
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                           ast.Lambda)))

    visit(tree, False)
    return groups


def unexplained_imports(source: str) -> List[int]:
    """The line numbers of imports inside functions whose group gives no reason."""
    lines = source.splitlines()
    unexplained = []
    for group in _import_groups(ast.parse(source)):
        first = group[0].lineno
        comments = [lines[number - 1] for statement in group
                    for number in range(statement.lineno, (statement.end_lineno or statement.lineno) + 1)]
        above = first - 2
        while above >= 0 and lines[above].strip().startswith("#"):
            comments.append(lines[above])
            above -= 1
        if not any(REASON.search(line) for line in comments):
            unexplained.extend(statement.lineno for statement in group)
    return unexplained


def function_imports(source: str) -> int:
    return sum(len(group) for group in _import_groups(ast.parse(source)))


def package_files() -> Dict[str, str]:
    return {path.relative_to(PACKAGE).as_posix(): path.read_text()
            for path in sorted(PACKAGE.rglob("*.py"))}


@pytest.mark.parametrize("source, unexplained", [
    ("import json\ndef f():\n    return json\n", []),  # at the top: nothing to say
    ("def f():\n    import json\n", [2]),
    ("def f():\n    import boto3  # start-up: ~70 ms the emulator never needs\n", []),
    ("def f():\n    # start-up: ~70 ms the emulator never needs\n    import boto3\n", []),
    ("def f():\n    # boto3 is heavy\n    import boto3\n", [3]),  # no reason named
    ("def f():\n    # start-up:\n    import boto3\n", [3]),  # a reason named, none given
    ("def f():\n    # optional: tqdm may be absent\n    # (the [progress] extra)\n"
     "    from tqdm import tqdm\n", []),
    ("def f():\n    # start-up: boto3 is heavy\n    import boto3\n    import botocore.config\n", []),
    ("def f():\n    # start-up: boto3 is heavy\n    import boto3\n    x = 1\n    import botocore\n",
     [5]),  # a reason covers its run of imports only
    ("def f():\n    try:\n        # optional: may be absent\n        import s3fs\n"
     "    except ImportError:\n        pass\n", []),
    ("def f():\n    def g():\n        from . import wire  # cycle: wire imports this module\n", []),
    ("class A:\n    def f(self):\n        from . import wire\n", [3]),
    ("if True:\n    import json\n", []),  # not in a function
    ("f = lambda: __import__('json')\n", []),  # not an import statement
])
def test_an_import_inside_a_function_names_its_reason(source, unexplained):
    assert unexplained_imports(source) == unexplained


def test_every_file_gives_each_import_inside_a_function_its_reason():
    files = package_files()
    assert "environments.py" in files and "worker/main.py" in files  # it read the package
    found = {name: unexplained_imports(source) for name, source in files.items()}
    assert {name: lines for name, lines in found.items() if lines} == {}


def test_imports_inside_functions_stay_few():
    """The codebases we imitate have 0 to 2.4 per 1,000 lines; the package keeps under 2.4."""
    files = package_files()
    count = sum(function_imports(source) for source in files.values())
    lines = sum(len(source.splitlines()) for source in files.values())
    assert count <= 2.4 * lines / 1000, f"{count} imports inside functions in {lines} lines"
