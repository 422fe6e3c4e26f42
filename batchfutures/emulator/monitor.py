"""Memory of each attempt's processes, read from /proc, and the thread that enforces the limit.

An attempt runs in its own session (its leader's pid is the session id and the process group),
so "the container's processes" are the live processes of that session. Each sample walks the
attempt's process tree (/proc/<pid>/task/<tid>/children, a few reads); once a second a full pass
over /proc/<pid>/stat finds the session's processes that left the tree (re-parented daemons).
The cheap measure is their resident set (statm); only when that is over the
limit is the proportional set size (smaps_rollup: anonymous plus shared memory, so copy-on-write
pages of forked children count once) read to confirm, as the cgroup that AWS uses would count.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any, Dict, Iterable, List

logger = logging.getLogger("batchfutures")

PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
SAMPLE_EVERY = 0.05
FULL_SCAN_EVERY = 20  # samples


def session_members(sessions: Iterable[int]) -> Dict[int, List[int]]:
    """The live pids of each session (or process group) id in `sessions`."""
    members: Dict[int, List[int]] = {sid: [] for sid in sessions}
    if not members:
        return members
    try:
        names = os.listdir("/proc")
    except OSError:
        return members
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as handle:
                fields = handle.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) < 4 or fields[0] == b"Z":
            continue
        group, session = int(fields[2]), int(fields[3])
        key = session if session in members else group if group in members else None
        if key is not None:
            members[key].append(int(name))
    return members


def process_tree(root: int) -> List[int]:
    """The live pid `root` and its descendants (children of every thread), or [] when gone."""
    pids: List[int] = []
    queue = [root]
    while queue:
        pid = queue.pop()
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        pids.append(pid)
        for task in tasks:
            try:
                with open(f"/proc/{pid}/task/{task}/children", "rb") as handle:
                    queue.extend(int(child) for child in handle.read().split())
            except (OSError, ValueError):
                continue
    return pids


_HAS_CHILDREN_LISTS = os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children")


def resident_bytes(pids: Iterable[int]) -> int:
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/statm", "rb") as handle:
                total += int(handle.read().split()[1]) * PAGE
        except (OSError, IndexError, ValueError):
            continue
    return total


def proportional_bytes(pids: Iterable[int]) -> int:
    """Anonymous and shared memory, shared pages divided among their users."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps_rollup", "rb") as handle:
                text = handle.read()
        except OSError:
            continue
        values: Dict[bytes, int] = {}
        for line in text.splitlines():
            key, _, rest = line.partition(b":")
            parts = rest.split()
            if parts and parts[0].isdigit():
                values[key] = int(parts[0]) * 1024
        if b"Pss_Anon" in values:
            total += values[b"Pss_Anon"] + values.get(b"Pss_Shmem", 0)
        else:
            total += values.get(b"Pss", 0)
    return total


class MemoryMonitor:
    """Samples every watched attempt's memory and kills (reason "memory") one over its limit.

    A handle needs `pid` (its session id), `running` and `kill(reason)`.
    """

    def __init__(self, interval: float = SAMPLE_EVERY) -> None:
        self.interval = interval
        self._watched: Dict[Any, int] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = False
        self._samples = 0
        self._thread = threading.Thread(target=self._run, name="bf-emulator-memory", daemon=True)
        self._thread.start()

    def watch(self, handle: Any, memory_mib: int) -> None:
        with self._lock:
            self._watched[handle] = int(memory_mib) * 1024 * 1024
        self._wake.set()

    def unwatch(self, handle: Any) -> None:
        with self._lock:
            self._watched.pop(handle, None)

    def sample(self) -> None:
        with self._lock:
            watched = [(h, limit) for h, limit in self._watched.items() if h.running]
        if not watched:
            return
        self._samples += 1
        if not _HAS_CHILDREN_LISTS or self._samples % FULL_SCAN_EVERY == 0:
            members = session_members(h.pid for h, _ in watched)
        else:
            members = {h.pid: process_tree(h.pid) for h, _ in watched}
        for handle, limit in watched:
            pids = members.get(handle.pid) or []
            if pids and resident_bytes(pids) > limit and proportional_bytes(pids) > limit:
                handle.kill("memory")

    def _run(self) -> None:
        while not self._stop:
            with self._lock:
                idle = not self._watched
            if idle:
                self._wake.wait(1.0)
                self._wake.clear()
                continue
            if self._wake.wait(self.interval):
                self._wake.clear()  # a new watch: sample now, then every interval
            try:
                self.sample()
            except Exception:  # /proc oddities must not end the monitor
                logger.exception("batchfutures emulator: memory sampling failed")

    def close(self) -> None:
        self._stop = True
        self._wake.set()
        self._thread.join(timeout=2)
