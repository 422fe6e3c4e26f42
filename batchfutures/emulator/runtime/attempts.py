"""What the scheduler holds for a running attempt, whichever launcher started it.

    LaunchRequest ──> ProcessLauncher.start (launcher.py) ──> ProcessHandle   (exec'd command)
                                  └─> ForkServer.spawn (forkserver.py) ──> ForkedAttempt  (worker)
                                                       both are an AttemptHandle (this module)

An `AttemptHandle` has `pid` (also its session and process group id), `returncode` (None while
running, negative for death by signal), `running`, `kill_reason` (a `KillReason`, set by the
first `kill`), `exit_code()` (Docker's: 128+N for signal N), `memory_exceeded` (known once it
ended: the attempt was killed for its memory limit) and `wait()`. It kills the
whole container: its process group, its session, and its cgroup when it has one. When the main
process has ended, `finish(returncode)` kills what is left, reads the cgroup's OOM count and
calls `on_exit(handle)`. The emptied cgroup's folders are removed by a background thread, off the
path from one attempt's end to the next one's start; once they are gone (the kernel's word that
no process of the attempt is left) its scratch folder is recycled (container.Scratch) or removed.
`cleanup_done()` waits for that thread (the emulator's shutdown).
"""

from __future__ import annotations

import enum
import logging
import os
import queue
import shutil
import signal
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Dict, List, Optional, Protocol, Tuple

from ...batchlimits import OOM_EXIT_STATUS  # the worker's exit on MemoryError (the RLIMIT world)
from .procfs import session_members

if TYPE_CHECKING:  # pragma: no cover
    from .cgroups import AttemptCgroup

# TerminateJob stops a container as `docker stop` does: SIGTERM to its main process, SIGKILL to
# all of it this many seconds later if it is still there. ECS waits 30 s by default
# (ECS_CONTAINER_STOP_TIMEOUT); the emulator gives less time, never more.
STOP_GRACE = 2.0


class KillReason(enum.Enum):
    """Why the emulator itself killed an attempt."""

    TERMINATE = "terminate"    # TerminateJob
    TIMEOUT = "timeout"        # attemptDurationSeconds
    SHUTDOWN = "shutdown"      # the emulator closes
    MEMORY = "memory"          # the sampling monitor saw it over its limit (no cgroup)
    HOST_LOST = "host-lost"    # a fault: the instance it ran on went away
    SPOT_RECLAIM = "spot-reclaim"  # a fault: Spot takes its capacity back, after a notice


@dataclass
class LaunchRequest:
    """Everything one attempt's process needs."""

    argv: List[str]
    env: Dict[str, str]
    cwd: str
    log_path: str
    memory_mib: Optional[int] = None
    vcpus: float = 1.0
    cgroup: Optional[AttemptCgroup] = None  # None: RLIMIT_DATA and sampling instead
    scratch: Optional[str] = None  # a working directory removed when the attempt ends
    # keeps the emptied scratch folder for a later attempt, once the cgroup says none is left
    recycle: Optional[Callable[[str], None]] = None
    unrunnable: Optional[str] = None  # why it cannot start: no command, no known entry point


def docker_exit_code(returncode: Optional[int]) -> int:
    """The code Docker reports for a process: 128+N for death by signal N."""
    code = returncode if returncode is not None else -signal.SIGKILL
    return 128 - code if code < 0 else code


_cleanup_queue: "queue.Queue[Tuple[AttemptCgroup, Optional[str], Optional[Callable[[str], None]]]]" = (
    queue.Queue())
_cleanup_lock = threading.Lock()
_cleanup_thread: Optional[threading.Thread] = None


def _clean() -> None:
    while True:
        group, scratch, recycle = _cleanup_queue.get()
        try:
            removed = group.remove()
            if scratch and removed and recycle is not None:
                recycle(scratch)
            elif scratch:
                shutil.rmtree(scratch, ignore_errors=True)
        except Exception:  # one odd folder must not stop the others' removal
            logging.getLogger("batchfutures").exception("batchfutures emulator: cleanup failed")
        finally:
            _cleanup_queue.task_done()


def _clean_later(group: AttemptCgroup, scratch: Optional[str],
                 recycle: Optional[Callable[[str], None]]) -> None:
    global _cleanup_thread
    with _cleanup_lock:
        if _cleanup_thread is None:
            _cleanup_thread = threading.Thread(target=_clean, name="bf-emulator-cleanup",
                                               daemon=True)
            _cleanup_thread.start()
    _cleanup_queue.put((group, scratch, recycle))


def cleanup_done() -> None:
    """Wait until the cgroups and scratch folders of the attempts that ended are gone."""
    if _cleanup_thread is not None:
        _cleanup_queue.join()


class AttemptHandle:
    """One attempt's processes (see the module doc); launchers subclass it."""

    def __init__(self, pid: int, request: LaunchRequest,
                 on_exit: Optional[Callable[["AttemptHandle"], None]]) -> None:
        self.pid = pid
        self.memory_mib = request.memory_mib
        self.cgroup = request.cgroup
        self.scratch = request.scratch
        self._recycle = request.recycle
        self.kill_reason: Optional[KillReason] = None
        self.returncode: Optional[int] = None
        self.memory_exceeded = False
        self._on_exit = on_exit
        self._lock = threading.Lock()
        self._done = threading.Event()

    @property
    def running(self) -> bool:
        return self.returncode is None

    def _signal_all(self) -> None:
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except OSError:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except OSError:
                pass
        # processes that moved to another group but stayed in the session, or in the cgroup
        for pid in session_members([self.pid]).get(self.pid, []):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        if self.cgroup is not None:
            self.cgroup.kill()

    graceful = True  # TerminateJob sends SIGTERM first (a thread cannot be signalled)

    def kill(self, reason: KillReason, grace: Optional[float] = None) -> None:
        """End the attempt; the first reason given is kept. TerminateJob: SIGTERM to the main
        process, then SIGKILL to every process after STOP_GRACE; a Spot reclaim: the same after
        `grace` seconds (its interruption notice); any other reason: SIGKILL now."""
        with self._lock:
            if self.returncode is not None:
                return
            first = self.kill_reason is None
            if first:
                self.kill_reason = reason
        notice = reason in (KillReason.TERMINATE, KillReason.SPOT_RECLAIM)
        if notice and first and self.graceful:
            try:
                os.kill(self.pid, signal.SIGTERM)
            except OSError:
                pass
            seconds = STOP_GRACE if reason is KillReason.TERMINATE or grace is None else grace
            timer = threading.Timer(seconds, self._kill_if_running)
            timer.daemon = True
            timer.start()
            return
        self._signal_all()

    def _kill_if_running(self) -> None:
        if self.returncode is None:
            self._signal_all()

    def finish(self, returncode: int) -> None:
        """The main process ended (`returncode`): end the rest, judge memory, report."""
        if self.cgroup is not None:
            self.memory_exceeded = self.cgroup.oom_killed()
            self.cgroup.kill()  # the container ends now; its empty folders go in the background
            _clean_later(self.cgroup, self.scratch, self._recycle)
        else:
            if self.memory_mib:  # RLIMIT world: the monitor's kill, or the worker's MemoryError
                self.memory_exceeded = (self.kill_reason is KillReason.MEMORY
                                        or returncode == OOM_EXIT_STATUS)
            if self.scratch:  # no cgroup to say the attempt's processes are all gone: no reuse
                shutil.rmtree(self.scratch, ignore_errors=True)
        with self._lock:
            self.returncode = returncode
        self._done.set()
        if self._on_exit is not None:
            self._on_exit(self)

    def wait(self, timeout: Optional[float] = None) -> Optional[int]:
        self._done.wait(timeout)
        return self.returncode

    def exit_code(self) -> int:
        return docker_exit_code(self.returncode)


class AttemptLauncher(Protocol):
    """What the scheduler launches attempts with: ProcessLauncher (launcher.py) or, chosen
    explicitly, ThreadLauncher (threads.py)."""

    # whether an attempt is a process of its own (False: a thread here, which needs no import
    # path built for it, and must start no process to build one)
    in_processes: bool

    def start(self, request: LaunchRequest,
              on_exit: Optional[Callable[[AttemptHandle], None]] = None) -> AttemptHandle: ...

    def close(self) -> None: ...


class AttemptMonitor(Protocol):
    """What watches the memory of attempts without a cgroup: MemoryMonitor (monitor.py), or
    NullMonitor (threads.py) when attempts are threads."""

    def watch(self, handle: AttemptHandle, memory_mib: int) -> None: ...

    def unwatch(self, handle: AttemptHandle) -> None: ...

    def close(self) -> None: ...
