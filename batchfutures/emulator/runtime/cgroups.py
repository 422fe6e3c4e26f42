"""Control groups for attempts: the job's MEMORY as a hard limit and its vCPUs as CPU weight.

    detect() -> Cgroups | None          v2 (memory.max) where its memory controller can be
                                        delegated, else v1 (/sys/fs/cgroup/memory and cpu), when
                                        this process may create groups (root); None otherwise
    Cgroups.create(memory_mib, vcpus)   one group per attempt, a child of this process's own
        -> AttemptCgroup                  group: .procs (files a new process writes its pid to),
                                          .oom_killed(), .pids(), .remove()
    Cgroups.sweep()                     remove the groups of emulator processes that are gone

As Docker on Batch: `memory.limit_in_bytes` / `memory.max` at MEMORY MiB with swap off, so the
kernel kills a process of the attempt that goes over it (exit status 137) and counts the kill in
the group (`oom_kill` of memory.oom_control / memory.events): that count, not the exit status,
says the attempt was killed for memory. vCPUs become `cpu.shares` = 1024 per vCPU (v1) or the
equivalent `cpu.weight` (v2, Docker's conversion).

A group is named `batchfutures-<pid namespace>-<pid>-<start ticks>-<n>` after the emulator
process that made it, so a later start (in the same pid namespace) can tell its dead
predecessors' leftovers from the live groups of other processes and remove them.
"""

from __future__ import annotations

import itertools
import logging
import os
import signal
import threading
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

logger = logging.getLogger("batchfutures")

PREFIX = "batchfutures-"
_MiB = 1024 * 1024


def _read(path: Path) -> Optional[str]:
    try:
        return path.read_text()
    except OSError:
        return None


def _write(path: Path, value: str) -> None:
    with open(path, "w") as handle:
        handle.write(value)


def _namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid").split("[", 1)[1].rstrip("]")
    except (OSError, IndexError):
        return "0"


def _start_ticks(pid: int) -> Optional[str]:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            fields = handle.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if fields and fields[0] in (b"Z", b"X"):
        return None
    return fields[19].decode() if len(fields) > 19 else None


def _mounts() -> List[Tuple[str, str, str, List[str]]]:
    """(fstype, mount point, root, super options) of each cgroup mount of this process."""
    found: List[Tuple[str, str, str, List[str]]] = []
    try:
        with open("/proc/self/mountinfo") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return found
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3 or tail[0] not in ("cgroup", "cgroup2"):
            continue
        found.append((tail[0], fields[4], fields[3], tail[2].split(",")))
    return found


def _own_groups() -> Dict[str, str]:
    """This process's group path per v1 controller (and "" for v2), from /proc/self/cgroup."""
    groups: Dict[str, str] = {}
    try:
        with open("/proc/self/cgroup") as handle:
            for line in handle:
                _, controllers, path = line.rstrip("\n").split(":", 2)
                for name in (controllers.split(",") if controllers else [""]):
                    groups[name] = path
    except (OSError, ValueError):
        pass
    return groups


def _folder(mount_point: str, root: str, path: str) -> Path:
    if root != "/" and path.startswith(root):
        path = path[len(root):]
    return Path(mount_point) / path.lstrip("/")


def shares_to_weight(shares: int) -> int:
    """cgroup v2 cpu.weight for v1 cpu.shares, as Docker (runc) converts it."""
    return 1 + ((max(2, min(shares, 262144)) - 2) * 9999) // 262142


class AttemptCgroup:
    """One attempt's group(s): one folder per hierarchy (v1: memory and cpu; v2: one)."""

    def __init__(self, version: int, folders: List[Path], memory_folder: Path) -> None:
        self.version = version
        self.folders = folders
        self.memory_folder = memory_folder

    @property
    def name(self) -> str:
        return self.memory_folder.name

    @property
    def procs(self) -> List[str]:
        """The files a process writes its own pid to, to join every folder of the group."""
        return [str(folder / "cgroup.procs") for folder in self.folders]

    def oom_killed(self) -> bool:
        """Whether the kernel killed a process of the group for going over the limit."""
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        text = _read(self.memory_folder / name) or ""
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill" and value.strip().isdigit():
                return int(value) > 0
        if self.version == 1:  # kernels before 4.13 have no oom_kill line: the limit was hit
            return (_read(self.memory_folder / "memory.failcnt") or "0").strip() not in ("", "0")
        return False

    def pids(self) -> List[int]:
        pids: List[int] = []
        for folder in self.folders:
            for line in (_read(folder / "cgroup.procs") or "").split():
                if line.isdigit() and int(line) not in pids:
                    pids.append(int(line))
        return pids

    def kill(self) -> None:
        for pid in self.pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass

    def remove(self, timeout: float = 2.0) -> bool:
        """Kill what is left in the group and remove its folders; False if one stays."""
        deadline = time.monotonic() + timeout
        remaining = list(self.folders)
        killed = False
        while True:
            for folder in list(remaining):
                try:
                    folder.rmdir()
                    remaining.remove(folder)
                except FileNotFoundError:
                    remaining.remove(folder)
                except OSError:
                    pass  # busy: a process is left, or still dying
            if not remaining:
                return True
            if time.monotonic() > deadline:
                logger.warning("batchfutures emulator: could not remove cgroup %s", remaining)
                return False
            if killed:
                time.sleep(0.005)
            # only now: the attempt's end usually killed every process already, and reading
            # who is left costs two reads per attempt
            self.kill()
            killed = True


class Cgroups:
    """Where this process makes attempt groups: the parent folder of each hierarchy."""

    def __init__(self, version: int, parents: Dict[str, Path]) -> None:
        self.version = version
        self.parents = parents  # "memory" and, when usable, "cpu" (v2: both the same folder)
        self._owner = f"{PREFIX}{_namespace()}-{os.getpid()}-{_start_ticks(os.getpid())}-"
        self._count = itertools.count(1)
        self._lock = threading.Lock()

    def create(self, memory_mib: Optional[int], vcpus: float) -> AttemptCgroup:
        """A new group limited to `memory_mib` (None: unlimited) with `vcpus` worth of CPU."""
        with self._lock:
            name = f"{self._owner}{next(self._count)}"
        memory_parent = self.parents["memory"]
        folders: List[Path] = []
        group = AttemptCgroup(self.version, folders, memory_parent / name)
        try:
            group.memory_folder.mkdir()
            folders.append(group.memory_folder)
            shares = max(2, int(round(vcpus * 1024)))
            if self.version == 2:
                if memory_mib:
                    _write(group.memory_folder / "memory.max", str(int(memory_mib) * _MiB))
                    swap = group.memory_folder / "memory.swap.max"
                    if swap.exists():
                        _write(swap, "0")
                if "cpu" in self.parents:
                    _write(group.memory_folder / "cpu.weight", str(shares_to_weight(shares)))
            else:
                if memory_mib:
                    limit = str(int(memory_mib) * _MiB)
                    _write(group.memory_folder / "memory.limit_in_bytes", limit)
                    swap = group.memory_folder / "memory.memsw.limit_in_bytes"
                    try:  # swap accounting may be off: then there is nothing to limit
                        _write(swap, limit)
                    except OSError:
                        pass
                cpu_parent = self.parents.get("cpu")
                if cpu_parent is not None and cpu_parent != memory_parent:
                    cpu = cpu_parent / name
                    cpu.mkdir()
                    folders.append(cpu)
                    _write(cpu / "cpu.shares", str(shares))
        except OSError:
            group.remove(timeout=0.5)
            raise
        return group

    def sweep(self) -> int:
        """Remove the groups of dead emulator processes of this pid namespace; how many."""
        namespace = _namespace()
        removed = 0
        for parent in set(self.parents.values()):
            try:
                names = [n for n in os.listdir(parent) if n.startswith(PREFIX)]
            except OSError:
                continue
            for name in names:
                parts = name[len(PREFIX):].split("-")
                if len(parts) != 4 or parts[0] != namespace or not parts[1].isdigit():
                    continue
                if _start_ticks(int(parts[1])) == parts[2]:
                    continue  # its emulator still runs
                if AttemptCgroup(self.version, [parent / name], parent / name).remove(timeout=1):
                    removed += 1
        return removed

    def __repr__(self) -> str:
        return f"Cgroups(v{self.version}, {', '.join(f'{k}={v}' for k, v in self.parents.items())})"


def _probe(parent: Path) -> bool:
    """Whether a group can be made (and removed) under `parent`."""
    probe = parent / f"{PREFIX}probe-{os.getpid()}-{threading.get_ident()}"
    try:
        probe.mkdir()
    except FileExistsError:
        pass
    except OSError:
        return False
    try:
        probe.rmdir()
    except OSError:
        return False
    return True


def _detect_v2(mounts: List[Tuple[str, str, str, List[str]]], groups: Dict[str, str]
               ) -> Optional[Cgroups]:
    if "" not in groups:
        return None
    for fstype, point, root, _ in mounts:
        if fstype != "cgroup2":
            continue
        parent = _folder(point, root, groups[""])
        available = (_read(parent / "cgroup.controllers") or "").split()
        if "memory" not in available:
            continue
        enabled = (_read(parent / "cgroup.subtree_control") or "").split()
        wanted = [c for c in ("memory", "cpu") if c in available and c not in enabled]
        if wanted:  # fails (EBUSY) when this group itself holds processes, as it usually does
            try:
                _write(parent / "cgroup.subtree_control", " ".join(f"+{c}" for c in wanted))
            except OSError:
                if "memory" in wanted:
                    continue
        enabled = (_read(parent / "cgroup.subtree_control") or "").split()
        if "memory" in enabled and _probe(parent):
            parents = {"memory": parent}
            if "cpu" in enabled:
                parents["cpu"] = parent
            return Cgroups(2, parents)
    return None


def _detect_v1(mounts: List[Tuple[str, str, str, List[str]]], groups: Dict[str, str]
               ) -> Optional[Cgroups]:
    parents: Dict[str, Path] = {}
    for controller in ("memory", "cpu"):
        for fstype, point, root, options in mounts:
            if fstype == "cgroup" and controller in options and controller in groups:
                folder = _folder(point, root, groups[controller])
                if folder.is_dir() and _probe(folder):
                    parents[controller] = folder
                    break
    if "memory" not in parents:
        return None
    return Cgroups(1, parents)


_detected: Dict[str, Optional[Cgroups]] = {}
_detect_lock = threading.Lock()


def detect() -> Optional[Cgroups]:
    """This process's cgroups for attempts (looked for once), or None where it may make none."""
    with _detect_lock:
        if "found" not in _detected:
            found = None
            if os.name == "posix" and os.path.isdir("/sys/fs/cgroup"):
                try:
                    mounts, groups = _mounts(), _own_groups()
                    found = _detect_v2(mounts, groups) or _detect_v1(mounts, groups)
                except Exception:  # an odd /proc: run without cgroups
                    logger.exception("batchfutures emulator: looking for cgroups failed")
                    found = None
            _detected["found"] = found
            if found is None:
                logger.debug("batchfutures emulator: no usable cgroups; RLIMIT_DATA and sampling")
        return _detected["found"]
