"""Starting and supervising one attempt's process, as a container runtime would.

Each attempt is a fresh process in its own session (process group), its stdout and stderr in
the attempt's log file. Memory is enforced twice: RLIMIT_DATA at the job's MEMORY setting, so an
over-limit allocation fails at once inside the process (the worker turns that MemoryError into
exit status 137, like the OOM killer), and `resident_mib` samples the resident memory of the
process tree so the scheduler can kill a tree that grew past the limit by other means.
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import threading
from typing import Callable, Dict, List, Optional

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def python_path_for_children() -> str:
    """PYTHONPATH that lets a child import what this process imports (local code included)."""
    prefixes = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    entries: List[str] = []
    for entry in sys.path:
        path = os.path.realpath(entry or os.getcwd())
        if any(path == p or path.startswith(p + os.sep) for p in prefixes):
            continue  # the interpreter finds its own library folders
        if os.path.isdir(path) and path not in entries:
            entries.append(path)
    existing = os.environ.get("PYTHONPATH")
    if existing:
        entries.extend(e for e in existing.split(os.pathsep) if e and e not in entries)
    return os.pathsep.join(entries)


def container_argv(command: List[str]) -> List[str]:
    """The job's command, with a leading `python` meaning this interpreter."""
    if command and os.path.basename(command[0]).startswith("python") and "/" not in command[0]:
        return [sys.executable] + list(command[1:])
    return list(command)


class AttemptProcess:
    """One running attempt: its process, its log file, and how it ended."""

    def __init__(self, argv: List[str], env: Dict[str, str], log_path: str,
                 memory_mib: Optional[int], on_exit: Callable[["AttemptProcess"], None]) -> None:
        self.memory_mib = memory_mib
        self.kill_reason: Optional[str] = None  # set when the emulator itself killed it
        self.returncode: Optional[int] = None
        os.makedirs(os.path.dirname(log_path), exist_ok=True)
        with open(log_path, "ab", buffering=0) as log:
            self.popen = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, start_new_session=True,
                                          close_fds=True)
        self.pid = self.popen.pid
        if memory_mib:
            limit = int(memory_mib) * 1024 * 1024
            try:  # set from outside: no Python code runs between fork and exec
                resource.prlimit(self.pid, resource.RLIMIT_DATA, (limit, limit))
            except (OSError, ValueError, AttributeError):
                pass
        self._on_exit = on_exit
        self._waiter = threading.Thread(target=self._wait, name=f"bf-emulator-wait-{self.pid}",
                                        daemon=True)
        self._waiter.start()

    def _wait(self) -> None:
        self.returncode = self.popen.wait()
        self._on_exit(self)

    @property
    def running(self) -> bool:
        return self.returncode is None

    def kill(self, reason: str) -> None:
        if self.returncode is not None:
            return
        if self.kill_reason is None:
            self.kill_reason = reason
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            try:
                self.popen.kill()
            except ProcessLookupError:
                pass

    def exit_code(self) -> int:
        """The code Docker would report: 128+N for death by signal N."""
        code = self.returncode if self.returncode is not None else -signal.SIGKILL
        return 128 - code if code < 0 else code

    def resident_mib(self) -> float:
        """Resident memory of the process and its descendants, in MiB (0 when gone)."""
        total = 0
        for pid in _tree(self.pid):
            try:
                with open(f"/proc/{pid}/statm", "rb") as handle:
                    total += int(handle.read().split()[1]) * _PAGE
            except (OSError, IndexError, ValueError):
                continue
        return total / (1024 * 1024)


def _tree(root: int) -> List[int]:
    pids, queue = [], [root]
    while queue:
        pid = queue.pop()
        pids.append(pid)
        try:
            with open(f"/proc/{pid}/task/{pid}/children", "rb") as handle:
                queue.extend(int(child) for child in handle.read().split())
        except (OSError, ValueError):
            continue
    return pids
