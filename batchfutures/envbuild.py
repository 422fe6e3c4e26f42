"""Building a job's environment (`requirements=`) for the job's platform, stored once, reused.

    prepare(env, storage, setting, functions, arguments) -> the archive's URL (the job's pointer)
      target   the job's platform: Linux, the job definition's architecture (runtimePlatform's
               cpuArchitecture, X86_64 unless it says ARM64), glibc >= AWS_GLIBC, the client's
               Python minor (the worker must run it: the pickles need it); locally the chosen
               interpreter's own machine, glibc and Python (`interpreter_target`)
      pins     requirements.py: "auto" from the pickles at this client's versions; a list or a
               file resolved by `pip install --dry-run --report` for the target
      digest   sha256 of the pins, the target's platform tags and its Python (`environment_digest`)
      reuse    R/envs/<digest>.zip there: nothing built, nothing uploaded
      build    `pip install --target DIR --no-deps --only-binary=:all: --platform ... --python-version
               X.Y --implementation cp <pins>`, DIR packed (envarchive.pack), sealed, written with
               a conditional create (two clients building one digest at once store one)

pip runs as `<this interpreter> -m pip` in this process's environment, so the user's pip
configuration (pip.conf, PIP_INDEX_URL, PIP_EXTRA_INDEX_URL, PIP_FIND_LINKS, PIP_NO_INDEX...)
applies as it does to their own installs. Binary wheels only: a requirement without a wheel for
the target fails here, before anything is uploaded or submitted, with EnvironmentBuildError naming
it and the two fixes (publish or point pip at a wheel for that platform, or bake it into the image).

What was prepared is remembered per storage root and setting for the process (`_prepared`; for
"auto", per set of modules the pickles name), so the jobs of one executor pay for pip, and for
reading the installed distributions, once.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import subprocess
import sys
import tempfile
import threading
import weakref
from dataclasses import dataclass
from typing import (
    TYPE_CHECKING,
    Any,
    Callable,
    Dict,
    FrozenSet,
    Iterable,
    List,
    Mapping,
    Optional,
    Sequence,
    Set,
    Tuple,
)

from . import envarchive, requirements
from .errors import ConfigurationError, EnvironmentBuildError

if TYPE_CHECKING:  # pragma: no cover
    from .environments import Environment
    from .storage import Storage

logger = logging.getLogger("batchfutures")

AWS_GLIBC = (2, 28)  # the worker image (python:3.X-slim) has at least this glibc
OLDEST_MANYLINUX = 17  # manylinux_2_17 (manylinux2014), the oldest tag a wheel carries now
FORMAT = 1  # of the archive; part of the digest
PIP_TIMEOUT = 1800.0
_MACHINES = {"x86_64": "x86_64", "amd64": "x86_64", "x86-64": "x86_64", "x64": "x86_64",
             "arm64": "aarch64", "aarch64": "aarch64", "armv8": "aarch64"}
_NO_MATCH = re.compile(r"No matching distribution found for ([^\s;]+)")
_NO_VERSION = re.compile(r"Could not find a version that satisfies the requirement ([^\s;]+)")


@dataclass(frozen=True)
class Target:
    """Where the environment runs: Linux on `machine`, glibc >= `glibc`, CPython `python`."""

    machine: str
    python: Tuple[int, int]
    glibc: Tuple[int, int] = AWS_GLIBC

    def platforms(self) -> List[str]:
        return platform_tags(self.machine, self.glibc)

    def pip_options(self) -> List[str]:
        options = ["--only-binary=:all:", "--implementation", "cp",
                   "--python-version", f"{self.python[0]}.{self.python[1]}"]
        for tag in self.platforms():
            options += ["--platform", tag]
        return options

    def describe(self) -> str:
        return (f"Linux {self.machine}, glibc {self.glibc[0]}.{self.glibc[1]}, "
                f"CPython {self.python[0]}.{self.python[1]}")


def normalize_machine(value: str) -> str:
    machine = _MACHINES.get(str(value).strip().lower())
    if machine is None:
        raise ConfigurationError(f"requirements=: no wheels for the architecture {value!r} "
                                 f"(x86_64 and arm64 are supported)")
    return machine


def platform_tags(machine: str, glibc: Tuple[int, int]) -> List[str]:
    """pip's --platform tags of a Linux `machine` with `glibc`: manylinux_2_<glibc>_<m> down to
    manylinux_2_17, then manylinux2014 (which pip widens to manylinux2010 and 1 on x86_64)."""
    arch = normalize_machine(machine)
    if glibc[0] != 2 or glibc[1] < OLDEST_MANYLINUX:
        raise ConfigurationError(f"requirements=: glibc {glibc[0]}.{glibc[1]} is older than "
                                 f"manylinux2014's 2.{OLDEST_MANYLINUX}")
    tags = [f"manylinux_2_{minor}_{arch}" for minor in range(glibc[1], OLDEST_MANYLINUX - 1, -1)]
    return tags + [f"manylinux2014_{arch}"]


def environment_digest(pins: Sequence[str], target: Target) -> str:
    """The archive's name: the pinned set, the platform tags and the Python it was built for."""
    text = json.dumps({"format": FORMAT, "pins": sorted(pins), "platforms": target.platforms(),
                       "python": list(target.python), "implementation": "cp"},
                      sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def missing_wheel(stderr: str) -> Optional[str]:
    """The requirement pip found no distribution for, from its error output (None: another error)."""
    for pattern in (_NO_MATCH, _NO_VERSION):
        match = pattern.search(stderr)
        if match:
            return match.group(1).rstrip(".")
    return None


def pip_failure(stderr: str, target: Target, what: str) -> EnvironmentBuildError:
    """The error of a failed pip run, naming the package and the fixes when a wheel is missing."""
    package = missing_wheel(stderr)
    if package is not None:
        return EnvironmentBuildError(
            f"requirements=: no wheel of {package} for the job's platform ({target.describe()}); "
            f"nothing was uploaded or submitted. Either make a wheel of {package} for that "
            f"platform reachable by pip (publish one, or point pip's find-links or index at "
            f"one), or install {package} in the worker image and leave it out of requirements=")
    lines = [line for line in stderr.strip().splitlines() if line.strip()][-8:]
    return EnvironmentBuildError(f"requirements=: pip could not {what} for {target.describe()}: "
                                 + " | ".join(lines))


def _run_pip(args: List[str], target: Target, what: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input", *args]
    logger.debug("batchfutures: %s", " ".join(command))
    environ = {k: v for k, v in os.environ.items() if k not in ("PIP_TARGET", "PIP_USER",
                                                              "PIP_PREFIX", "PIP_REQUIRE_VIRTUALENV")}
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=PIP_TIMEOUT,
                              env=environ, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as error:
        raise EnvironmentBuildError(f"requirements=: could not run pip ({error})") from None
    if done.returncode != 0:
        raise pip_failure(done.stderr, target, what)
    return done


# -- the target -----------------------------------------------------------------------------
_PROBE = ("import json, platform, sys; "
          "print(json.dumps([list(sys.version_info[:2]), platform.machine(), platform.libc_ver()]))")
_targets: Dict[str, Target] = {}
_targets_lock = threading.Lock()


def interpreter_target(python: str) -> Target:
    """The platform of a local interpreter (the emulator's image), asked once per path."""
    with _targets_lock:
        known = _targets.get(python)
    if known is not None:
        return known
    try:
        done = subprocess.run([python, "-I", "-c", _PROBE], capture_output=True, text=True,
                              timeout=60, stdin=subprocess.DEVNULL)
        version, machine, (libc, libc_version) = json.loads(done.stdout)
    except (OSError, subprocess.SubprocessError, ValueError, TypeError) as error:
        raise EnvironmentBuildError(f"requirements=: cannot ask the interpreter {python} for its "
                                    f"platform ({error})") from None
    if not sys.platform.startswith("linux") or libc != "glibc":
        raise EnvironmentBuildError(
            f"requirements=: the interpreter {python} is not a glibc Linux one (libc "
            f"{libc or 'unknown'}); environments are built from manylinux wheels")
    glibc = tuple(int(part) for part in libc_version.split(".")[:2])
    target = Target(normalize_machine(machine), (int(version[0]), int(version[1])),
                    (glibc[0], glibc[1]))
    with _targets_lock:
        _targets[python] = target
    return target


def target_for(env: "Environment") -> Target:
    """The job's platform for `env`: a LocalEnvironment's interpreter, or the AWS job
    definition's architecture with the client's Python."""
    if env.image_python is not None:  # LocalEnvironment: the interpreter its attempts run on
        return interpreter_target(env.image_python)
    try:
        definition = env.describe_definition()
    except Exception as error:  # the definition is read again, and explained, at submit
        logger.debug("batchfutures: requirements=: job definition not read (%s)", error)
        definition = None
    return Target(definition_machine(definition), (sys.version_info[0], sys.version_info[1]))


def definition_machine(definition: Optional[Mapping[str, Any]]) -> str:
    """The architecture a job definition's containers run on: its runtimePlatform's
    cpuArchitecture (X86_64 or ARM64), X86_64 when it says none (Batch's default)."""
    container = (definition or {}).get("containerProperties") or {}
    platform = container.get("runtimePlatform") or {}
    return normalize_machine(platform.get("cpuArchitecture") or "X86_64")


# -- the pins ---------------------------------------------------------------------------------
def resolve(setting: requirements.RequirementsSetting, target: Target,
            functions: Iterable[bytes] = (), arguments: Iterable[bytes] = (), *,
            modules: Optional[FrozenSet[str]] = None) -> List[str]:
    """The exact `name==version` set of a `requirements=` setting for `target` (not None);
    "auto" reads the pickles' modules, unless `modules` says them already."""
    markers = requirements.target_markers(target.machine, target.python)
    if setting == requirements.AUTO:
        if modules is None:
            modules = frozenset(requirements.modules_of(functions, arguments))
        return requirements.auto_pins(modules, markers)
    if isinstance(setting, str):
        given = ["-r", setting]
    else:
        given = list(setting or ())
        if not given:
            return []
    with tempfile.TemporaryDirectory(prefix="batchfutures-resolve-") as folder:
        report = os.path.join(folder, "report.json")
        _run_pip(["install", "--dry-run", "--ignore-installed", "--quiet", "--report", report,
                  # --target: pip takes platform options only with it (nothing is written)
                  "--target", os.path.join(folder, "unused"), *target.pip_options(), *given],
                 target, "resolve the requirements")
        with open(report, encoding="utf-8") as handle:
            data = json.load(handle)
    return requirements.pins_from_report(data, requirements.image_distributions(markers))


def build_archive(pins: Sequence[str], target: Target) -> bytes:
    """The pinned distributions installed for `target` into one folder, packed."""
    with tempfile.TemporaryDirectory(prefix="batchfutures-env-") as folder:
        site = os.path.join(folder, "site")
        _run_pip(["install", "--no-deps", "--quiet", "--no-compile", "--target", site,
                  *target.pip_options(), *pins], target, "install the requirements")
        return envarchive.pack(site)


# -- prepared once ------------------------------------------------------------------------------
_prepared: Dict[Tuple[Any, ...], Tuple[Optional[str], FrozenSet[str]]] = {}
_prepared_lock = threading.Lock()


def _setting_key(setting: requirements.RequirementsSetting, target: Target,
                 modules: Optional[FrozenSet[str]]) -> Tuple[Any, ...]:
    """What a setting's pins depend on: for "auto", the modules the pickles name."""
    if setting == requirements.AUTO:
        return ("auto", modules, target)
    if isinstance(setting, str):
        with open(setting, "rb") as handle:
            return ("file", setting, hashlib.sha256(handle.read()).hexdigest(), target)
    return ("specs", tuple(setting or ()), target)


def prepare(env: "Environment", storage: "Storage", setting: requirements.RequirementsSetting,
            functions: Iterable[bytes] = (), arguments: Iterable[bytes] = ()) -> Optional[str]:
    """The URL of the job's environment archive in `storage`, built and stored if missing;
    None when there is nothing to ship beyond the image."""
    return prepare_pinned(env, storage, setting, functions, arguments)[0]


def prepare_pinned(env: "Environment", storage: "Storage",
                   setting: requirements.RequirementsSetting, functions: Iterable[bytes] = (),
                   arguments: Iterable[bytes] = ()) -> Tuple[Optional[str], FrozenSet[str]]:
    """`prepare`'s URL and the pins it holds."""
    target = _target_of(env)
    modules = (frozenset(requirements.modules_of(functions, arguments))
               if setting == requirements.AUTO else None)
    key = (storage.root_url,) + _setting_key(setting, target, modules)
    with _prepared_lock:
        if key in _prepared:
            return _prepared[key]
    pins = resolve(setting, target, modules=modules)
    url: Optional[str] = None
    if pins:
        url = store(storage, pins, target, environment_digest(pins, target))
    else:
        logger.info("batchfutures: requirements=: nothing to ship beyond the image")
    with _prepared_lock:
        _prepared[key] = (url, frozenset(pins))
    return url, frozenset(pins)


class PoolEnvironment:
    """`requirements=` of a warm pool: one environment for all of its calls, as its workers
    start once. Built (or found) at the pool's first call, before anything of it is stored;
    its pointer goes in the pool's config. A list or a file says the whole set then. "auto"
    is worked out from that first call's pickles (its function, pickled with the executor's
    initializer, its arguments and the initializer's): a later call whose pickles name a
    module of a distribution outside that set fails at submit (EnvironmentBuildError naming
    it), as a worker started with that environment could not import it."""

    def __init__(self, env: "Environment", storage: "Storage",
                 setting: requirements.RequirementsSetting, initargs: Optional[bytes]) -> None:
        self._env, self._storage, self._setting = env, storage, setting
        self._initargs = initargs
        self._lock = threading.Lock()
        self.pins: Optional[FrozenSet[str]] = None  # None: not prepared yet
        self.pointer: Optional[str] = None
        self._admitted: Set[FrozenSet[str]] = set()  # "auto": module sets already checked

    def admit(self, function_pickle: bytes, arguments: Sequence[bytes],
              on_first: Callable[[], None]) -> None:
        """Ready for a call of `function_pickle` with `arguments`: the first one prepares the
        environment and runs `on_first` (the pool writes its config) before any other call
        goes on; EnvironmentBuildError when it cannot be, or ("auto") the call needs more."""
        with self._lock:
            if self.pins is None:
                extra = [self._initargs] if self._initargs is not None else []
                url, pins = prepare_pinned(self._env, self._storage, self._setting,
                                           [function_pickle], [*extra, *arguments])
                self.pointer, self.pins = url, pins
                on_first()
                return
            if self._setting != requirements.AUTO:
                return
            modules = frozenset(requirements.modules_of([function_pickle], arguments))
            if modules in self._admitted:
                return
            needed = _prepare_auto_pins(_target_of(self._env), modules)
            missing = needed - self.pins
            if missing:
                raise EnvironmentBuildError(pool_missing_message(sorted(missing),
                                                                 sorted(self.pins | needed)))
            self._admitted.add(modules)


def pool_missing_message(missing: Sequence[str], everything: Sequence[str]) -> str:
    """The error of a warm call that needs distributions its pool's "auto" environment lacks."""
    return (f"requirements=\"auto\" on warm workers (keepalive=): the pool's environment was "
            f"worked out from its first call and this call also needs {', '.join(missing)}; "
            f"nothing of it was sent. List what the pool's calls need instead, e.g. "
            f"requirements={list(everything)!r}")


_auto_pins: Dict[Tuple[Target, FrozenSet[str]], FrozenSet[str]] = {}


def _prepare_auto_pins(target: Target, modules: FrozenSet[str]) -> FrozenSet[str]:
    """"auto"'s pins for `modules`, once per set (reading the installed distributions ~0.3 s)."""
    with _prepared_lock:
        known = _auto_pins.get((target, modules))
    if known is None:
        known = frozenset(resolve(requirements.AUTO, target, modules=modules))
        with _prepared_lock:
            _auto_pins[(target, modules)] = known
    return known


_env_targets: "weakref.WeakKeyDictionary[Any, Target]" = weakref.WeakKeyDictionary()


def _target_of(env: "Environment") -> Target:
    """`target_for(env)`, once per environment object (on AWS it reads the job definition)."""
    with _prepared_lock:
        known = _env_targets.get(env)
    if known is None:
        known = target_for(env)
        with _prepared_lock:
            _env_targets[env] = known
    return known


_stored: Dict[Tuple[str, str], str] = {}


def store(storage: "Storage", pins: Sequence[str], target: Target, digest: str) -> str:
    """R/envs/<digest>.zip: reused when there, else built and written once."""
    url = storage.url(envarchive.FOLDER, envarchive.archive_name(digest))
    with _prepared_lock:
        if (storage.root_url, digest) in _stored:
            return url
    if storage.object_exists(url):
        logger.info("batchfutures: environment %s (%d distributions) reused", digest[:12], len(pins))
    else:
        data = build_archive(pins, target)
        sealed = storage.signer.seal(envarchive.SEAL_KIND, storage.name_of(url), data,
                                     root=storage.mac_root)
        wrote = storage.put_bytes(url, sealed, exclusive=True)
        logger.info("batchfutures: environment %s (%d distributions, %.1f MiB) %s", digest[:12],
                    len(pins), len(sealed) / 2 ** 20, "stored" if wrote else
                    "stored by another client meanwhile")
    with _prepared_lock:
        _stored[(storage.root_url, digest)] = url
    return url
