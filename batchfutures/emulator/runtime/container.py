"""The container's world: an attempt's command, environment, import path, directory and log.

On Batch a job's container has the image's interpreter and packages, Batch's variables, the job
definition's and the overrides' `environment`, and nothing of the machine that submitted it.
The emulator's "image" is this interpreter with its own site-packages (batchfutures included),
or, when the definition's `image` is the absolute path of an executable
(`LocalEnvironment(image=PYTHON)`, `image_interpreter`), that interpreter with its own, so a
library the client has and that image lacks is missing there as on AWS. An attempt gets:

    command      the job's, a leading `python`/`python3`/`python3.X` meaning the image's interpreter;
                 for a definition with none, what its image runs: the entry point of the first
                 `images` pattern (fnmatch) matching the definition's `image` (`entry_point`;
                 `BatchEmulator(images=)`, `--image PATTERN=COMMAND`), as a container runs its
                 image's ENTRYPOINT; with no match the attempt cannot start
    environment  PATH, HOME, locale and temp-dir variables (what an image defines), the AWS
                 endpoint, region and credential variables and proxy/CA settings (what reaching
                 storage needs), BATCHFUTURES_SIGNING_KEY (the local stand-in for the secret
                 a job definition would inject), then the definition's and overrides'
                 `environment`, then Batch's
                 AWS_BATCH_* variables; nothing else of the client's environment
    import path  the interpreter's own (plus the folder holding batchfutures when this
                 interpreter cannot import it by itself, e.g. a checkout run in place): never
                 the client's sys.path or working directory
    directory    a fresh scratch folder per attempt, <folder>/scratch/<owner>/<task id>, removed
                 when the attempt ends (as a container's writable layer is discarded); one
                 left empty is kept (renamed) for a later attempt once the attempt's cgroup
                 says none of its processes is left, as making and removing a folder costs
                 an inode each time (~0.25 ms on a busy ext4), a rename nothing

    log          <logs folder>/<definition>/default/<task id>, the attempt's log stream,
                 ended with a newline when the attempt ends (its last line is an event)

`attempt_record` names a new attempt's task and stream, `launch_request` gathers the above for
the launcher, `prepare` makes its folder and cgroup (outside the emulator's lock), `discard`
undoes that for an attempt that could not start.

`inherit_client_path=True` (of `BatchEmulator` and `LocalEnvironment`) is the explicit way back
to the client's world for quick local iteration: the client's sys.path on PYTHONPATH and its
working directory as the attempt's, so functions of modules that exist only on this machine
import by reference. It hides what a container on AWS would lack; the default does not.
"""

from __future__ import annotations

import fnmatch
import itertools
import logging
import math
import os
import re
import shutil
import stat
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from ...errors import ConfigurationError
from ...workdir import make_private_dirs, owned_folder, secure_folder
from ..model import task_arn
from .attempts import LaunchRequest
from .launcher import client_python_path

if TYPE_CHECKING:  # pragma: no cover
    from ..jobstate import Unit
    from .cgroups import Cgroups

logger = logging.getLogger("batchfutures")

_PYTHON = re.compile(r"^python(\d+(\.\d+)?)?$")
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
# What an image defines, or the host passes to every container.
_IMAGE_VARIABLES = frozenset({"PATH", "HOME", "LANG", "LANGUAGE", "TZ", "TMPDIR"})
# The signing key, when the user keeps it in the environment: the local stand-in for the secret a
# job definition would hand the container on AWS (signing.py's "env" source).
_SECRET_VARIABLES = frozenset({"BATCHFUTURES_SIGNING_KEY"})
# What reaching storage needs (besides AWS_*).
_NETWORK_VARIABLES = frozenset({
    "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY", "http_proxy", "https_proxy",
    "no_proxy", "all_proxy", "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
})


def image_interpreter(image: Optional[str]) -> str:
    """The interpreter an image stands for: the definition's `image` when it is the absolute path
    of an executable file (`LocalEnvironment(image=PYTHON)`: a venv's bin/python, kept as given,
    never resolved, so the venv stays its own), else this interpreter."""
    if (image and os.path.isabs(image) and os.path.isfile(image)
            and os.access(image, os.X_OK)):
        return image
    return sys.executable


def container_argv(command: List[str], python: Optional[str] = None) -> List[str]:
    """The job's command, a leading `python`, `python3` or `python3.X` meaning the image's
    interpreter (`python`, default this one)."""
    if command and _PYTHON.fullmatch(command[0]):
        return [python or sys.executable] + list(command[1:])
    return list(command)


# An image's entry point as the emulator knows it: fnmatch pattern of a definition's `image` ->
# the argv its container runs when neither the definition nor the overrides give a command.
ImageEntryPoints = Mapping[str, Sequence[str]]


def image_entry_points(images: Optional[ImageEntryPoints]) -> Dict[str, Tuple[str, ...]]:
    """`images` checked (ValueError: a pattern or an entry point that is not text, or empty)."""
    checked: Dict[str, Tuple[str, ...]] = {}
    for pattern, argv in (images or {}).items():
        if not isinstance(pattern, str) or not pattern:
            raise ValueError(f"images: the pattern {pattern!r} is not a non-empty string")
        if isinstance(argv, str) or not argv or not all(isinstance(a, str) for a in argv):
            raise ValueError(f"images[{pattern!r}] = {argv!r}: give the entry point as a "
                             "non-empty list of strings (argv)")
        checked[pattern] = tuple(argv)
    return checked


def entry_point(image: Optional[str], images: ImageEntryPoints) -> Optional[List[str]]:
    """What `image` runs when its job gives no command: the argv of the first pattern of
    `images` (in order; fnmatch, case-sensitive) matching it; None when none does."""
    for pattern, argv in images.items():
        if image is not None and fnmatch.fnmatchcase(image, pattern):
            return list(argv)
    return None


class NoEntryPoint(OSError):
    """A job with no command whose image has no entry point the emulator knows."""


def no_entry_point(image: Optional[str]) -> str:
    return (f"the job definition gives no command and the emulator knows no entry point for "
            f"its image {image!r}: pass --image 'PATTERN=COMMAND' to python -m "
            "batchfutures.emulator (BatchEmulator(images={PATTERN: [argv]})), or give the "
            "definition a command")


def passed_from_host(name: str) -> bool:
    """Whether the client's variable `name` reaches the container."""
    if name.startswith("AWS_"):
        return not name.startswith("AWS_BATCH_")
    return (name in _IMAGE_VARIABLES or name in _NETWORK_VARIABLES or name in _SECRET_VARIABLES
            or name.startswith("LC_"))


def environment(host: Mapping[str, str], job: Iterable[Mapping[str, Any]],
                batch: Mapping[str, str], *, vcpus: float,
                python_path: Iterable[str] = ()) -> Dict[str, str]:
    """An attempt's environment (see the module doc); `python_path` goes before the job's."""
    # names first: os.environ decodes a value on each read, and most are never passed
    env = {name: host[name] for name in host if passed_from_host(name)}
    env["PYTHONUNBUFFERED"] = "1"  # a killed attempt's output is still in its log
    threads = str(max(1, math.ceil(vcpus)))
    for name in THREAD_VARIABLES:  # no 64 thread pools (and their memory) on a 1-vCPU job
        env[name] = threads
    for item in job:
        env[item["name"]] = item.get("value", "")
    entries = [e for e in python_path if e]
    if entries:
        job_path = env.get("PYTHONPATH")
        env["PYTHONPATH"] = os.pathsep.join(entries + ([job_path] if job_path else []))
    env.update(batch)
    return env


_package_path: List[Optional[str]] = []
_package_lock = threading.Lock()


def image_python_path() -> List[str]:
    """What the "image" adds to the interpreter's path: the folder holding batchfutures, when
    a fresh interpreter (no PYTHONPATH, neutral directory) cannot import it by itself."""
    with _package_lock:
        if not _package_path:
            folder = str(Path(__file__).resolve().parents[3])
            env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
            try:
                done = subprocess.run([sys.executable, "-c", "import batchfutures.worker.main"],
                                      env=env, cwd=os.path.abspath(os.sep), capture_output=True,
                                      timeout=60)
                found = done.returncode == 0
            except (OSError, subprocess.SubprocessError):
                found = False
            _package_path.append(None if found else folder)
        return [_package_path[0]] if _package_path[0] else []


SPARE_FOLDERS = 8  # emptied scratch folders kept for later attempts
_OWNER_FOLDER = re.compile(r"^(\d+)-(\d+|None)$")  # f"{pid}-{start ticks}", as make names it


class Scratch:
    """Per-attempt working directories under <folder>/scratch/<owner pid>-<start ticks>/."""

    def __init__(self, folder: Path, owner: List[Any]) -> None:
        self.root = Path(folder) / "scratch"
        self.mine = self.root / f"{owner[0]}-{owner[1]}"
        self._spares: List[Path] = []
        self._mode: Optional[int] = None  # st_mode of a folder as made here
        self._count = itertools.count(1)
        self._lock = threading.Lock()

    def make(self, task_id: str) -> str:
        path = self.mine / task_id
        with self._lock:
            spare = self._spares.pop() if self._spares else None
        if spare is not None:
            try:
                os.rename(spare, path)
                if not os.listdir(path):
                    return str(path)
            except OSError:
                pass
            shutil.rmtree(path, ignore_errors=True)  # not empty after all: never handed out
        make_private_dirs(path, root=self.root)  # 0700, no planted link followed (CONTRACT 9)
        if self._mode is None:
            self._mode = os.lstat(path).st_mode
        return str(path)

    def recycle(self, path: str) -> None:
        """An attempt's folder once no process of it is left: kept if as made and empty."""
        try:
            info = os.lstat(path)
            fresh = (stat.S_ISDIR(info.st_mode) and info.st_mode == self._mode
                     and info.st_uid == os.getuid() and not os.listdir(path))
            if fresh:
                with self._lock:
                    if len(self._spares) < SPARE_FOLDERS:
                        spare = self.mine / f".spare-{next(self._count)}"
                        os.rename(path, spare)
                        self._spares.append(spare)
                        return
        except OSError:
            pass
        self.remove(path)

    def close(self) -> None:
        """Remove the spare folders (the emulator closes)."""
        with self._lock:
            spares, self._spares = self._spares, []
        for spare in spares:
            shutil.rmtree(spare, ignore_errors=True)

    @staticmethod
    def remove(path: Optional[str]) -> None:
        if path:
            shutil.rmtree(path, ignore_errors=True)

    def sweep(self, alive: Callable[[List[Any]], bool]) -> None:
        """Remove the folders of owners that are gone (`alive([pid, ticks])` says): only what
        this emulator can prove it made, a `<pid>-<ticks>` folder of this user (lstat'ed, never
        a link) in a `scratch` that is itself a real folder of this user, private to them."""
        try:
            secure_folder(self.root, "emulator scratch folder", create=False)
            names = os.listdir(self.root)
        except ConfigurationError as error:
            logger.warning("batchfutures emulator: not sweeping scratch folders: %s", error)
            return
        except OSError:
            return
        for name in names:
            match = _OWNER_FOLDER.fullmatch(name)
            path = self.root / name
            if match is None or path == self.mine or not owned_folder(path):
                continue
            if not alive([int(match.group(1)), match.group(2)]):
                shutil.rmtree(path, ignore_errors=True)


# -- one attempt's request -------------------------------------------------------------------
def attempt_record(definition_name: Optional[str], compute_environment: str) -> Dict[str, Any]:
    """A new attempt's record: its log stream, named for its task, and the task's ARN."""
    task_id = uuid.uuid4().hex
    return {"container": {"logStreamName": f"{definition_name}/default/{task_id}",
                          "taskArn": task_arn(compute_environment, task_id)}}


def batch_variables(unit: Unit, compute_environment: str) -> Dict[str, str]:
    """Batch's AWS_BATCH_* variables for an attempt of `unit` (they override the job's)."""
    spec = unit.job.spec
    batch = dict(AWS_BATCH_JOB_ID=unit.job_id, AWS_BATCH_JOB_ATTEMPT=str(unit.attempt_number),
                 AWS_BATCH_JQ_NAME=spec.queue, AWS_BATCH_CE_NAME=compute_environment)
    if unit.job.is_array:
        batch["AWS_BATCH_JOB_ARRAY_INDEX"] = str(unit.index)
        batch["AWS_BATCH_JOB_ARRAY_SIZE"] = str(spec.array_size)
    if unit.job.is_multinode:  # every node on this machine: the main node is 127.0.0.1
        batch.update(AWS_BATCH_JOB_NODE_INDEX=str(unit.index),
                     AWS_BATCH_JOB_NUM_NODES=str(spec.num_nodes),
                     AWS_BATCH_JOB_MAIN_NODE_INDEX=str(spec.main_node))
        if not unit.is_main_node:  # as Batch: only the other nodes are told its address
            batch["AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS"] = "127.0.0.1"
    return batch


def import_path_and_directory(inherit_client_path: bool, in_processes: bool) -> Tuple[List[str], str]:
    """What an attempt adds to its import path, and its working directory ("": a scratch
    folder, made by `prepare`)."""
    if inherit_client_path:  # the explicit way back to the client's world
        return [client_python_path()], os.getcwd()
    return (image_python_path() if in_processes else []), ""


def log_file(logs_folder: Path, stream: str) -> Path:
    return Path(logs_folder).joinpath(*stream.split("/"))


def launch_request(unit: Unit, stream: str, *, compute_environment: str, logs_folder: Path,
                   python_path: List[str], cwd: str,
                   host: Optional[Mapping[str, str]] = None,
                   images: Optional[ImageEntryPoints] = None) -> LaunchRequest:
    """What an attempt of `unit` gets, `host` being the client's environment (os.environ);
    a job with no command runs its image's entry point (`images`), or cannot start."""
    node = unit.job.spec.node(unit.index if unit.job.is_multinode else None)
    vcpus = float(node["vcpus"] or 1)
    env = environment(os.environ if host is None else host, node["environment"] or [],
                      batch_variables(unit, compute_environment), vcpus=vcpus,
                      python_path=python_path)
    image = node.get("image")
    command = list(node["command"] or []) or entry_point(image, images or {}) or []
    return LaunchRequest(argv=container_argv(command, image_interpreter(image)), env=env, cwd=cwd,
                         log_path=str(log_file(logs_folder, stream)), memory_mib=node["memory"],
                         vcpus=vcpus, unrunnable=None if command else no_entry_point(image))


def prepare(request: LaunchRequest, scratch: Optional[Scratch], cgroups: Optional[Cgroups]) -> None:
    """Outside the lock: the attempt's scratch folder (named for its task) and cgroup;
    NoEntryPoint (the attempt cannot start) for a request with nothing to run."""
    if request.unrunnable is not None:
        raise NoEntryPoint(request.unrunnable)
    if not request.cwd:
        if scratch is not None:
            request.cwd = request.scratch = scratch.make(os.path.basename(request.log_path))
            request.recycle = scratch.recycle
        else:
            request.cwd = os.path.abspath(os.sep)
    if cgroups is not None:
        try:
            request.cgroup = cgroups.create(request.memory_mib, request.vcpus)
        except OSError as error:  # e.g. the cgroup folder went away: this attempt falls back
            logger.warning("batchfutures emulator: cannot create a cgroup (%s); this attempt "
                           "runs with RLIMIT_DATA and sampling", error)


def discard(request: LaunchRequest) -> None:
    """Undo `prepare` for an attempt that could not start."""
    if request.cgroup is not None:
        request.cgroup.remove(timeout=0.5)
    Scratch.remove(request.scratch)


def close_log(path: Path) -> None:
    """End an attempt's log with a newline, so its last line counts as a complete event."""
    try:
        with open(path, "rb+") as handle:
            if handle.seek(0, os.SEEK_END) > 0:
                handle.seek(-1, os.SEEK_END)
                if handle.read(1) != b"\n":
                    handle.write(b"\n")
    except OSError:
        pass
