"""The package's rooms and what each may import (docs/architecture.md draws them).

    core               batchfutures/*.py: the executor, its job-state core, storage, errors;
                       inside it, names (layout.py) and formats (wire.py, serialization.py) are
                       pure, storage.py's I/O needs no client, map's pipeline (mapping.py) is the
                       executor's
    worker/            what runs in the container: it needs no executor, poller or emulator
    cli/               the command; nothing but __main__ imports it
    emulator/          the Batch API side (service, server, listings, records, the job model)
    emulator/runtime/  where attempts run; it reads the job model, never the API's front

The graph is read with `ast` (tests/test_import_cycles.py), imports inside functions included,
so a rule broken only on some path still fails here.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
from pathlib import Path, PurePath
from typing import Dict, List, Set, Tuple

import pytest
from test_import_cycles import imports_of, module_names

PACKAGE = "batchfutures"
# what the worker may use of the core: storage, seals, pickles, errors; nothing of the client
WORKER_MAY_IMPORT = {"serialization", "wire", "storage", "layout", "signing", "awsclients", "dependencies",
                     "errors", "statuses", "batchlimits", "_version", "sqsapi", "warmwire",
                     "envarchive", "workdir", "checkpoints", "retrypolicy",
                     "shipfiles"}  # the files= archive's format: the worker unpacks what it packs
# the emulator's front: what answers requests; the runtime never reaches back into it
EMULATOR_FRONT = {"service", "server", "listing", "logservice", "table", "submitjob", "auth",
                  "tagging", "__main__"}
# the core's vocabulary the emulator shares with the client
EMULATOR_MAY_IMPORT = {"statuses", "batchlimits", "workdir", "errors", "jobdetail", "_version", "budget"}


def room(module: str) -> str:
    parts = module.split(".")[1:]
    if parts[:2] == ["emulator", "runtime"]:
        return "emulator/runtime"
    if parts and parts[0] in ("worker", "cli", "emulator"):
        return parts[0]
    return "core"


def broken_rules(graph: Dict[str, Set[str]]) -> List[Tuple[str, str]]:
    """The (importer, imported) pairs that cross rooms against the rules above."""
    broken = []
    for module, targets in graph.items():
        here, name = room(module), module.split(".", 1)[-1]
        for target in targets:
            there, target_name = room(target), target.split(".", 1)[-1]
            if here == there:
                continue
            allowed = {
                # the package exports node(); the local environment starts the emulator
                "core": (there == "worker" and module == PACKAGE and target_name == "worker.nodes")
                or (there == "cli" and name == "__main__")
                or (there in ("emulator", "emulator/runtime") and name == "environments")
                # the SQS seam reaches the emulator's folder-backed queues (warm workers)
                or (name == "sqsapi" and target_name == "emulator.sqs"),
                "worker": there == "core" and target_name in WORKER_MAY_IMPORT,
                "cli": there in ("core", "worker"),
                "emulator": there == "emulator/runtime"
                or (there == "core" and target_name in EMULATOR_MAY_IMPORT),
                "emulator/runtime": (there == "emulator"
                                     and target_name.split(".")[-1] not in EMULATOR_FRONT)
                or (there == "core" and target_name in EMULATOR_MAY_IMPORT)
                or target_name == "worker.main",  # the threads launcher runs the worker's code
            }[here]
            if not allowed:
                broken.append((module, target))
    return sorted(broken)


@pytest.mark.parametrize("importer, imported, allowed", [
    ("batchfutures.worker.main", "batchfutures.storage", True),
    ("batchfutures.worker.main", "batchfutures.executor", False),
    ("batchfutures.worker.pool", "batchfutures.emulator.jobstate", False),
    ("batchfutures.cli.app", "batchfutures.executor", True),
    ("batchfutures.session", "batchfutures.cli.app", False),
    ("batchfutures.__main__", "batchfutures.cli.app", True),
    ("batchfutures", "batchfutures.worker.nodes", True),
    ("batchfutures.executor", "batchfutures.worker.main", False),
    ("batchfutures.environments", "batchfutures.emulator", True),
    ("batchfutures.poller", "batchfutures.emulator.runtime.scheduler", False),
    ("batchfutures.emulator.service", "batchfutures.emulator.runtime.scheduler", True),
    ("batchfutures.emulator.runtime.scheduler", "batchfutures.emulator.jobstate", True),
    ("batchfutures.emulator.runtime.scheduler", "batchfutures.emulator.service", False),
    ("batchfutures.emulator.runtime.threads", "batchfutures.worker.main", True),
    ("batchfutures.emulator.runtime.threads", "batchfutures.executor", False),
    ("batchfutures.emulator.table", "batchfutures.statuses", True),
    ("batchfutures.emulator.table", "batchfutures.storage", False),
    ("batchfutures.emulator.submitjob", "batchfutures.batchlimits", True),  # Batch's limits, one home
    ("batchfutures.worker.calls", "batchfutures.batchlimits", True),
])
def test_the_rules_between_rooms(importer, imported, allowed):
    assert (broken_rules({importer: {imported}}) == []) is allowed


def test_the_package_keeps_to_its_rooms():
    modules = module_names()
    graph = {name: imports_of(name, path, modules) for name, path in modules.items()}
    assert {room(m) for m in graph} == {"core", "worker", "cli", "emulator", "emulator/runtime"}
    assert broken_rules(graph) == []


# -- rooms inside the core: names, formats, storage's I/O, map's pipeline -----------------------
# the client's machinery: what a name, a format or storage's I/O never needs
CLIENT = {"executor", "mapping", "session", "poller", "submission", "coalescer", "jobs", "results",
          "cache", "chunking", "reconcile", "environments", "jobview", "futures", "progress",
          "warmpool", "dryrun", "cleanup"}
# layout.py names objects (pure); wire.py and serialization.py are the bytes; storage.py reads and
# writes them: none of them reaches into the client, and names and formats do no I/O
PURE = {"layout", "wire", "serialization"}
# mapping.py is map's pipeline, under the executor's map and map_futures alone
MAPPING_USERS = {"executor"}


def broken_core_rules(graph: Dict[str, Set[str]]) -> List[Tuple[str, str]]:
    """The (importer, imported) pairs inside the core that break the rules above."""
    broken = []
    for module, targets in graph.items():
        if room(module) != "core":
            continue
        name = module.split(".", 1)[-1]
        for target in targets:
            if room(target) != "core":
                continue
            target_name = target.split(".", 1)[-1]
            allowed = not (
                (name in PURE | {"storage"} and target_name in CLIENT)
                or (name in PURE and target_name == "storage")
                or (name == "layout" and target_name != "errors")  # names only
                or (target_name == "mapping" and name not in MAPPING_USERS))
            if not allowed:
                broken.append((module, target))
    return sorted(broken)


@pytest.mark.parametrize("importer, imported, allowed", [
    ("batchfutures.storage", "batchfutures.layout", True),
    ("batchfutures.storage", "batchfutures.wire", True),
    ("batchfutures.storage", "batchfutures.session", False),
    ("batchfutures.layout", "batchfutures.errors", True),
    ("batchfutures.layout", "batchfutures.signing", False),  # a name needs no key
    ("batchfutures.wire", "batchfutures.serialization", True),
    ("batchfutures.wire", "batchfutures.storage", False),  # a format does no I/O
    ("batchfutures.wire", "batchfutures.jobs", False),
    ("batchfutures.serialization", "batchfutures.executor", False),
    ("batchfutures.executor", "batchfutures.mapping", True),
    ("batchfutures.mapping", "batchfutures.session", True),
    ("batchfutures.session", "batchfutures.mapping", False),  # map's pipeline is the executor's
    ("batchfutures.cli.app", "batchfutures.mapping", True),  # another room: the rules above
])
def test_the_rules_inside_the_core(importer, imported, allowed):
    assert (broken_core_rules({importer: {imported}}) == []) is allowed


def test_the_core_keeps_to_its_rooms():
    modules = module_names()
    graph = {name: imports_of(name, path, modules) for name, path in modules.items()}
    assert {f"{PACKAGE}.{name}" for name in PURE | {"storage", "mapping"}} <= set(graph)
    assert broken_core_rules(graph) == []


def test_no_two_modules_share_a_name():
    seen: Dict[str, List[str]] = {}
    for name, path in module_names().items():
        if PurePath(path).name not in ("__init__.py", "__main__.py"):
            seen.setdefault(PurePath(path).name, []).append(name)
    assert {file: names for file, names in seen.items() if len(names) > 1} == {}


DOCUMENTED = [Path(__file__).resolve().parents[1] / "README.md",
              *sorted((Path(__file__).resolve().parents[1] / "docs").glob("*.md"))]
NOT_A_PATH = {"batchfutures.yaml"}  # the template's file name


def documented_paths() -> Set[str]:
    found: Set[str] = set()
    for document in DOCUMENTED:
        found |= set(re.findall(r"\bbatchfutures(?:\.[A-Za-z_]\w*)+", document.read_text()))
    return found - NOT_A_PATH


def resolves(dotted: str) -> bool:
    """A module, or an attribute of the longest module prefix that imports."""
    if dotted.endswith(".__main__"):  # importing it would run the command: find it only
        return importlib.util.find_spec(dotted) is not None
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            value: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            if not hasattr(value, name):
                return False
            value = getattr(value, name)
        return True
    return False


def test_every_import_path_the_docs_name_still_resolves():
    paths = documented_paths()
    assert "batchfutures.worker" in paths and "batchfutures.jobview.describe" in paths
    assert sorted(p for p in paths if not resolves(p)) == []
