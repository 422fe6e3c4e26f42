"""`requirements=`: which distributions a job's environment holds, at which exact versions.

    None                 the image as it is (nothing shipped)
    "auto"               the installed distributions providing the modules the calls' pickles name
                         (`pickled_modules`), with their dependencies (`closure`), at this
                         client's installed versions, less what the worker image already has
                         (`IMAGE_ROOTS` and their dependencies)
    ["pkg==1.0", ...]    requirement strings, resolved by pip for the job's platform (envbuild.py)
    "path/to/file"       a requirements (or pip-compile/uv export lock) file, resolved the same way

A pickle names a module by reference in a GLOBAL or STACK_GLOBAL opcode (a class, a function of
an installed package) or as cloudpickle's `subimport("pkg")` argument (a module among a by-value
function's globals). A module imported inside a function's body is invisible to "auto": import
it at the module's top level, or list it. Everything here is pure given its inputs; envbuild.py
runs pip and stores the result.
"""

from __future__ import annotations

import importlib
import importlib.metadata as metadata
import json
import os
import pickletools
import re
import sys
from typing import Any, Callable, Dict, FrozenSet, Iterable, List, Mapping, Optional, Set, Tuple, Union

from .errors import ConfigurationError

AUTO = "auto"
# What the worker image holds already (the Dockerfile installs batchfutures and with it these):
# never shipped, so the image's copies of them and their dependencies stay the ones in use.
IMAGE_ROOTS = ("batchfutures", "cloudpickle", "boto3")
# cloudpickle's reducers whose argument is a module name (a module among a function's globals)
_MODULE_LOADERS = frozenset({"subimport", "dynamic_subimport"})
_STRING_OPS = frozenset({"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE", "STRING",
                         "BINSTRING", "SHORT_BINSTRING"})
_GLOBAL_MARK = "\0"  # what a global pushed, as this reader remembers it (no module name has it)
_GET_OPS = frozenset({"GET", "BINGET", "LONG_BINGET"})
_PUT_OPS = frozenset({"PUT", "BINPUT", "LONG_BINPUT"})
# at most this much of the argument pickles is read for "auto" (a map's items are alike)
AUTO_SCAN_BYTES = 4 * 1024 * 1024

RequirementsSetting = Union[None, str, Tuple[str, ...]]


def _packaging(module: str) -> Any:
    """packaging's `module`, or pip's vendored copy of it (pip is what builds environments)."""
    try:
        return importlib.import_module(f"packaging.{module}")
    except ImportError:
        return importlib.import_module(f"pip._vendor.packaging.{module}")


def _kind(value: Any) -> str:
    if isinstance(value, str):
        return "an option" if value.strip() else "an empty string"
    return f"a {type(value).__name__}"


def canonical(name: str) -> str:
    """A distribution's name as PEP 503 compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()


def check_setting(value: Any) -> RequirementsSetting:
    """The `requirements=` setting, checked: None, "auto", a tuple of requirement strings, or
    the absolute path of a requirements file (hashable, so it can be part of JobSettings)."""
    if value is None or value == AUTO:
        return value
    if isinstance(value, (str, os.PathLike)):
        path = os.path.abspath(os.fspath(value))
        if not os.path.isfile(path):
            raise ConfigurationError(
                f"requirements={os.fspath(value)!r}: not \"auto\" and not a requirements file "
                f"(no file there); give \"auto\", a list of requirement strings, or a file's path")
        return path
    if isinstance(value, (list, tuple)):
        Requirement = _packaging("requirements").Requirement
        specs: List[str] = []
        for index, item in enumerate(value):  # never the value: it may hold an index's token
            if not isinstance(item, str) or not item.strip() or item.strip().startswith("-"):
                raise ConfigurationError(
                    f"requirements[{index}] must be a requirement string such as "
                    f"'numpy==2.1.3', not {_kind(item)} (pip options belong in pip's "
                    f"configuration)")
            try:
                Requirement(item.strip())
            except Exception:
                raise ConfigurationError(f"requirements[{index}] is not a requirement string "
                                         f"(PEP 508, such as 'numpy==2.1.3')") from None
            specs.append(item.strip())
        return tuple(specs)
    raise ConfigurationError(
        f"requirements must be None, \"auto\", a list of requirement strings or a file's path, "
        f"not a {type(value).__name__}")


# -- "auto": the modules a pickle names --------------------------------------------------------
def pickled_modules(data: Union[bytes, bytearray, memoryview]) -> Set[str]:
    """Top-level names of the modules a pickle refers to by name."""
    found: Set[str] = set()
    memo: Dict[int, Optional[str]] = {}
    pushed: List[Optional[str]] = [None, None]  # the last two values pushed (strings, else None)
    loader_next = False
    try:
        for op, arg, _ in pickletools.genops(bytes(data)):
            name = op.name
            value: Optional[str] = None
            if name in _STRING_OPS or name in _GET_OPS:
                value = memo.get(int(str(arg))) if name in _GET_OPS else (
                    arg if isinstance(arg, str) else None)
                if value is not None and value.startswith(_GLOBAL_MARK):  # a global, again
                    loader_next = value[1:] in _MODULE_LOADERS
                elif value is not None and loader_next:  # subimport's argument: a module name
                    found.add(value.partition(".")[0])
                    loader_next = False
            elif name == "MEMOIZE":
                memo[len(memo)] = pushed[-1]
                continue
            elif name in _PUT_OPS:
                memo[int(str(arg))] = pushed[-1]
                continue
            elif name in ("GLOBAL", "STACK_GLOBAL", "INST"):
                if name == "STACK_GLOBAL":
                    module, attribute = pushed[-2], pushed[-1]
                else:
                    module, _, attribute = str(arg).partition(" ")
                if module:
                    found.add(module.partition(".")[0])
                loader_next = attribute in _MODULE_LOADERS
                value = f"{_GLOBAL_MARK}{attribute}"  # memoized, it may be fetched again
            elif name in ("FRAME", "PROTO", "TUPLE1", "TUPLE2", "TUPLE3", "MARK"):
                continue  # push nothing the next op reads as a name
            pushed = [pushed[-1], value]
    except Exception:  # a truncated or odd pickle: what was read so far
        pass
    return found


def modules_of(pickles: Iterable[bytes], arguments: Iterable[bytes] = (),
               scan_bytes: int = AUTO_SCAN_BYTES) -> Set[str]:
    """The modules named by the function pickles (all read) and the argument pickles (the first
    `scan_bytes` of them)."""
    found: Set[str] = set()
    for data in pickles:
        found |= pickled_modules(data)
    budget = scan_bytes
    for data in arguments:
        if budget <= 0:
            break
        found |= pickled_modules(data)
        budget -= len(data)
    return found


def distributions_for(modules: Iterable[str], providers: Mapping[str, List[str]],
                      standard: FrozenSet[str] = frozenset(sys.stdlib_module_names)) -> Set[str]:
    """The distributions (canonical names) providing `modules`, from a
    `packages_distributions()` map; standard-library and unprovided modules give none."""
    names: Set[str] = set()
    for module in modules:
        if module in standard or module.startswith("__"):
            continue
        names.update(canonical(dist) for dist in providers.get(module, ()))
    return names


def target_markers(machine: str, python: Tuple[int, int]) -> Dict[str, str]:
    """The PEP 508 marker environment of a Linux CPython `python` worker on `machine`."""
    here = sys.version_info
    full = (f"{here[0]}.{here[1]}.{here[2]}" if (here[0], here[1]) == tuple(python)
            else f"{python[0]}.{python[1]}.0")
    return {"implementation_name": "cpython", "implementation_version": full,
            "os_name": "posix", "platform_machine": machine, "platform_release": "",
            "platform_system": "Linux", "platform_version": "",
            "python_full_version": full, "platform_python_implementation": "CPython",
            "python_version": f"{python[0]}.{python[1]}", "sys_platform": "linux"}


def closure(roots: Iterable[str], requires_of: Callable[[str], Optional[List[str]]],
            version_of: Callable[[str], Optional[str]], markers: Mapping[str, str]
            ) -> Dict[str, str]:
    """`roots` and the distributions they require (for the platform `markers` describe, with the
    extras asked for), as {canonical name: installed version}; one not installed is left out
    (nothing here to pin it to)."""
    Requirement = _packaging("requirements").Requirement
    pinned: Dict[str, str] = {}
    extras_seen: Dict[str, Set[str]] = {}
    stack: List[Tuple[str, FrozenSet[str]]] = [(canonical(r), frozenset()) for r in roots]
    while stack:
        name, extras = stack.pop()
        done = extras_seen.get(name)
        if done is not None and extras <= done:
            continue
        version = version_of(name)
        if version is None:
            continue
        extras_seen[name] = (done or set()) | set(extras)
        pinned[name] = version
        for text in requires_of(name) or ():
            try:
                requirement = Requirement(text)
            except Exception:
                continue
            marker = requirement.marker
            if marker is not None and not any(
                    marker.evaluate({**markers, "extra": extra})
                    for extra in sorted(extras_seen[name]) or [""]):
                continue
            stack.append((canonical(requirement.name), frozenset(requirement.extras)))
    return pinned


def auto_pins(modules: Iterable[str], markers: Mapping[str, str], *,
              providers: Optional[Mapping[str, List[str]]] = None,
              requires_of: Optional[Callable[[str], Optional[List[str]]]] = None,
              version_of: Optional[Callable[[str], Optional[str]]] = None,
              is_local: Optional[Callable[[str], bool]] = None) -> List[str]:
    """"auto"'s pins, sorted: `name==version` of the distributions providing `modules` and their
    dependencies, at the installed versions, less the image's (IMAGE_ROOTS and theirs) and less
    those installed from a local folder (`pip install -e .`: no index has them; their modules
    live outside site-packages, so they travel by value, serialization.local_modules)."""
    providers = metadata.packages_distributions() if providers is None else providers
    requires_of = requires_of or installed_requires
    version_of = version_of or installed_version
    is_local = is_local or installed_from_folder
    wanted = closure(distributions_for(modules, providers), requires_of, version_of, markers)
    image = closure(IMAGE_ROOTS, requires_of, version_of, markers)
    return sorted(f"{name}=={version}" for name, version in wanted.items()
                  if name not in image and name not in {canonical(r) for r in IMAGE_ROOTS}
                  and not is_local(name))


def installed_from_folder(name: str) -> bool:
    """Whether a distribution was installed from a local folder or in editable mode (PEP 610's
    direct_url.json: `dir_info`)."""
    try:
        text = metadata.distribution(name).read_text("direct_url.json")
    except metadata.PackageNotFoundError:
        return False
    return is_folder_url(text)


def is_folder_url(direct_url: Optional[str]) -> bool:
    """Whether a PEP 610 direct_url.json names a local folder (`dir_info`, editable or not)."""
    try:
        data = json.loads(direct_url or "{}")
    except ValueError:
        return False
    return isinstance(data, dict) and "dir_info" in data


def installed_version(name: str) -> Optional[str]:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def installed_requires(name: str) -> Optional[List[str]]:
    try:
        return metadata.requires(name)
    except metadata.PackageNotFoundError:
        return None


def image_distributions(markers: Mapping[str, str]) -> Set[str]:
    """The distributions the worker image has already (IMAGE_ROOTS and their dependencies, as
    installed here), canonical names."""
    names = set(closure(IMAGE_ROOTS, installed_requires, installed_version, markers))
    return names | {canonical(r) for r in IMAGE_ROOTS}


def pins_from_report(report: Mapping[str, Any], exclude: Iterable[str] = ()) -> List[str]:
    """`name==version` of each distribution in pip's installation report (`--report`), sorted,
    less `exclude` (canonical names)."""
    skip = {canonical(name) for name in exclude}
    pins = set()
    for item in report.get("install", []):
        meta = item.get("metadata") or {}
        name, version = meta.get("name"), meta.get("version")
        if name and version and canonical(name) not in skip:
            pins.add(f"{canonical(name)}=={version}")
    return sorted(pins)
