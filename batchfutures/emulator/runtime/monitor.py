"""The fallback's memory limit: a thread sampling each attempt's memory from /proc (procfs.py).

Used where attempts cannot have a cgroup (cgroups.py). Each sample walks the
attempt's process tree (/proc/<pid>/task/<tid>/children, a few reads); once a second a full pass
over /proc/<pid>/stat finds the session's processes that left the tree (re-parented daemons).
The cheap measure is their resident set (statm); only when that is over the
limit is the proportional set size (smaps_rollup: anonymous plus shared memory, so copy-on-write
pages of forked children count once) read to confirm, as the cgroup that AWS uses would count.
"""

from __future__ import annotations

import logging
import threading
from typing import Dict, Protocol

from .attempts import KillReason
from .procfs import (
    HAS_CHILDREN_LISTS,
    process_tree,
    proportional_bytes,
    resident_bytes,
    session_members,
)

logger = logging.getLogger("batchfutures")


class Watched(Protocol):
    """What the monitor needs of an attempt (an attempts.AttemptHandle has it)."""

    pid: int  # its session id

    @property
    def running(self) -> bool: ...

    def kill(self, reason: KillReason) -> None: ...

SAMPLE_EVERY = 0.05
FULL_SCAN_EVERY = 20  # samples

class MemoryMonitor:
    """Samples every watched attempt's memory and kills (KillReason.MEMORY) one over its limit.

    A handle needs `pid` (its session id), `running` and `kill(reason)`.
    """

    def __init__(self, interval: float = SAMPLE_EVERY) -> None:
        self.interval = interval
        self._watched: Dict[Watched, int] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = False
        self._samples = 0
        self._thread = threading.Thread(target=self._run, name="bf-emulator-memory", daemon=True)
        self._thread.start()

    def watch(self, handle: Watched, memory_mib: int) -> None:
        with self._lock:
            self._watched[handle] = int(memory_mib) * 1024 * 1024
        self._wake.set()

    def unwatch(self, handle: Watched) -> None:
        with self._lock:
            self._watched.pop(handle, None)

    def sample(self) -> None:
        with self._lock:
            watched = [(h, limit) for h, limit in self._watched.items() if h.running]
        if not watched:
            return
        self._samples += 1
        if not HAS_CHILDREN_LISTS or self._samples % FULL_SCAN_EVERY == 0:
            members = session_members(h.pid for h, _ in watched)
        else:
            members = {h.pid: process_tree(h.pid) for h, _ in watched}
        for handle, limit in watched:
            pids = members.get(handle.pid) or []
            if pids and resident_bytes(pids) > limit and proportional_bytes(pids) > limit:
                handle.kill(KillReason.MEMORY)

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
