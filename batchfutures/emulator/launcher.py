"""Starting one attempt's process, as a container runtime would, and the handle to it.

    ProcessLauncher().start(argv, env, log_path, memory_mib, on_exit) -> ProcessHandle

Each attempt is a fresh process in its own session (so its process group can be killed as a
whole), stdin from /dev/null, stdout and stderr appended to the attempt's log file. It gets
RLIMIT_DATA (soft and hard) at the job's MEMORY, so an allocation over the limit fails at once
inside the process (the worker turns that MemoryError into exit status 137, as the kernel's OOM
killer would), and PR_SET_PDEATHSIG=SIGKILL, so it dies with the thread that launched it: the
emulator's scheduler thread, which lives as long as the emulator.

No Python code runs between fork and exec, so subprocess takes its vfork path and a launch costs
a few ms whatever the client's size (a preexec_fn forces a real fork, which copies the client's
page tables: ~30 ms in a test process, ~200 ms in a 1 GiB one, all on the scheduler thread).
util-linux's `setpriv --pdeathsig KILL` sets the death signal and execs util-linux's `prlimit
--data=N:N`, which sets RLIMIT_DATA and execs the command (one pid throughout), so the limit is
in force before the command's own exec. Without the `prlimit` command, RLIMIT_DATA is set with
prlimit(2) from outside right after the spawn (before the command has run for more than a
moment); without setpriv the emulator falls back to the preexec_fn.

A handle (this one, or the fork server's `ForkedAttempt`) has `pid` (also its session and group
id), `returncode` (None while running, negative for death by signal), `running`, `kill_reason`
(set by the first `kill(reason)`), `exit_code()` (Docker's: 128+N for signal N) and
`resident_mib()`. `on_exit(handle)` is called from a waiter thread once the process has ended.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import threading
from typing import Any, Callable, Dict, List, Optional

from .monitor import PAGE, process_tree, resident_bytes, session_members

_PAGE = PAGE  # the fork server imports these two names
_PR_SET_PDEATHSIG = 1
_PYTHON = re.compile(r"^python(\d+(\.\d+)?)?$")


def _load_prctl() -> Optional[Callable[..., int]]:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        return libc.prctl
    except (OSError, AttributeError):
        return None


# Resolved once here: the code between fork and exec must not load libraries or import.
_prctl = _load_prctl()


_python_path_cache: Dict[Any, str] = {}


def python_path_for_children() -> str:
    """PYTHONPATH that lets a child import what this process imports (local code included)."""
    key = (tuple(sys.path), os.environ.get("PYTHONPATH"), os.getcwd())
    cached = _python_path_cache.get(key)
    if cached is None:
        cached = _python_path_cache[key] = _python_path()
        if len(_python_path_cache) > 16:
            _python_path_cache.clear()
    return cached


def _python_path() -> str:
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
    """The job's command, a leading `python`, `python3` or `python3.X` meaning this interpreter."""
    if command and _PYTHON.fullmatch(command[0]):
        return [sys.executable] + list(command[1:])
    return list(command)


def _data_cap(memory_mib: int) -> int:
    """The RLIMIT_DATA for a limit, never above the hard limit children inherit from us."""
    limit = int(memory_mib) * 1024 * 1024
    hard = resource.getrlimit(resource.RLIMIT_DATA)[1]
    return limit if hard == resource.RLIM_INFINITY else min(limit, hard)


def _find_prlimit() -> Optional[str]:
    """util-linux's prlimit command, if it can set RLIMIT_DATA and exec."""
    path = shutil.which("prlimit")
    if path is None:
        return None
    try:
        done = subprocess.run([path, f"--data={_data_cap(4096)}:{_data_cap(4096)}", "--", "true"],
                              capture_output=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return path if done.returncode == 0 else None


def _find_setpriv() -> Optional[str]:
    """util-linux's setpriv, if it can set the parent-death signal (Linux only)."""
    if _prctl is None:
        return None
    path = shutil.which("setpriv")
    if path is None:
        return None
    try:
        done = subprocess.run([path, "--pdeathsig", "KILL", "--", "true"], capture_output=True,
                              timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return path if done.returncode == 0 else None


_setpriv_path: Any = ...  # found on the first launch (Ellipsis: not looked for yet)
_prlimit_path: Any = ...
_setpriv_lock = threading.Lock()


def _setpriv() -> Optional[str]:
    global _setpriv_path
    with _setpriv_lock:
        if _setpriv_path is ...:
            _setpriv_path = _find_setpriv()
        return _setpriv_path


def _prlimit() -> Optional[str]:
    global _prlimit_path
    with _setpriv_lock:
        if _prlimit_path is ...:
            _prlimit_path = _find_prlimit()
        return _prlimit_path


def _limit_data(pid: int, memory_mib: int) -> None:
    """RLIMIT_DATA (soft and hard) of a running process, never above its hard limit."""
    limit = int(memory_mib) * 1024 * 1024
    try:
        hard = resource.prlimit(pid, resource.RLIMIT_DATA)[1]
        cap = limit if hard == resource.RLIM_INFINITY else min(limit, hard)
        resource.prlimit(pid, resource.RLIMIT_DATA, (cap, cap))
    except (OSError, ValueError):
        pass  # already gone


def _child_setup(memory_mib: Optional[int], parent: int) -> Callable[[], None]:
    limit = int(memory_mib) * 1024 * 1024 if memory_mib else None

    def setup() -> None:  # runs in the child between fork and exec: no imports, no locks
        if _prctl is not None:
            _prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
            if os.getppid() != parent:  # the emulator died before the line above
                os._exit(137)
        if limit is not None:
            hard = resource.getrlimit(resource.RLIMIT_DATA)[1]
            cap = limit if hard == resource.RLIM_INFINITY else min(limit, hard)
            resource.setrlimit(resource.RLIMIT_DATA, (cap, cap))

    return setup


def docker_exit_code(returncode: Optional[int]) -> int:
    """The code Docker reports for a process: 128+N for death by signal N."""
    code = returncode if returncode is not None else -signal.SIGKILL
    return 128 - code if code < 0 else code


class ProcessHandle:
    """One attempt's process."""

    def __init__(self, popen: subprocess.Popen, memory_mib: Optional[int],
                 on_exit: Optional[Callable[["ProcessHandle"], None]]) -> None:
        self._popen = popen
        self.pid = popen.pid
        self.memory_mib = memory_mib
        self.kill_reason: Optional[str] = None
        self.returncode: Optional[int] = None
        self._on_exit = on_exit
        self._lock = threading.Lock()
        self._waiter = threading.Thread(target=self._wait, name=f"bf-emulator-wait-{self.pid}",
                                        daemon=True)
        self._waiter.start()

    def _wait(self) -> None:
        try:  # wait without reaping, so the group id cannot be reused while we kill the rest
            os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOWAIT)
        except (ChildProcessError, OSError, AttributeError):
            pass
        self._kill_group()  # the container's other processes end with its main process
        code = self._popen.wait()
        with self._lock:
            self.returncode = code
        if self._on_exit is not None:
            self._on_exit(self)

    @property
    def running(self) -> bool:
        return self.returncode is None

    def _kill_group(self) -> None:
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except OSError:
            pass

    def kill(self, reason: str) -> None:
        """SIGKILL every process of the attempt; the first reason given is kept."""
        with self._lock:
            if self.returncode is not None:
                return
            if self.kill_reason is None:
                self.kill_reason = reason
        self._kill_group()
        # processes that moved to another group but stayed in the session go too
        for pid in session_members([self.pid]).get(self.pid, []):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass

    def wait(self, timeout: Optional[float] = None) -> Optional[int]:
        self._waiter.join(timeout)
        return self.returncode

    def exit_code(self) -> int:
        return docker_exit_code(self.returncode)

    def resident_mib(self) -> float:
        """Resident memory of every process of the attempt, in MiB (0 once gone)."""
        pids = session_members([self.pid]).get(self.pid, [])
        return resident_bytes(pids) / (1024 * 1024)


AttemptProcess = ProcessHandle  # the name the fork server's docstring uses


class ProcessLauncher:
    """Starts attempts as fresh processes.

    The worker command (`python -m batchfutures.worker <url>`) is forked from a preloaded fork
    server (forkserver.py): still one fresh process per attempt, but started in milliseconds.
    Any other command, or every command when BATCHFUTURES_EMULATOR_FORKSERVER=0, is exec'd.
    """

    def __init__(self) -> None:
        self._forkserver: Any = None
        self._lock = threading.Lock()

    def _fork_server(self) -> Any:
        if os.environ.get("BATCHFUTURES_EMULATOR_FORKSERVER", "1") == "0":
            return None
        with self._lock:
            if self._forkserver is None:
                from .forkserver import ForkServer

                self._forkserver = ForkServer(python_path_for_children())
            return None if self._forkserver.broken else self._forkserver

    def start(self, argv: List[str], env: Dict[str, str], log_path: str,
              memory_mib: Optional[int],
              on_exit: Optional[Callable[[ProcessHandle], None]] = None) -> Any:
        """Start the attempt; OSError when the command cannot be run at all."""
        from .forkserver import is_worker_command

        if is_worker_command(argv):
            server = self._fork_server()
            if server is not None:
                try:
                    return server.spawn(argv[3], env, log_path, memory_mib,
                                        on_exit or (lambda _handle: None))
                except OSError:  # the server is gone: fall back to a plain start
                    pass
        os.makedirs(os.path.dirname(log_path), exist_ok=True)
        setpriv = _setpriv()
        with open(log_path, "ab", buffering=0) as log:
            if setpriv is not None:  # vfork + exec: see the module doc
                if not argv or shutil.which(argv[0], path=env.get("PATH")) is None:
                    # what exec would have said, rather than setpriv's exit status 127
                    raise FileNotFoundError(f"{argv[0] if argv else ''!r}: no such executable")
                prefix = [setpriv, "--pdeathsig", "KILL", "--"]
                prlimit = _prlimit() if memory_mib else None
                if prlimit is not None:  # the limit holds from the command's first instruction
                    cap = _data_cap(memory_mib)
                    prefix += [prlimit, f"--data={cap}:{cap}", "--"]
                popen = subprocess.Popen(
                    prefix + list(argv), env=env,
                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    close_fds=True, start_new_session=True)
                if memory_mib and prlimit is None:
                    _limit_data(popen.pid, memory_mib)
            else:  # a real fork, to run _child_setup between fork and exec
                popen = subprocess.Popen(
                    argv, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    close_fds=True, start_new_session=True,
                    preexec_fn=_child_setup(memory_mib, os.getpid()))
        return ProcessHandle(popen, memory_mib, on_exit)

    def close(self) -> None:
        """Stop the fork server (and with it any attempt it still runs)."""
        with self._lock:
            server, self._forkserver = self._forkserver, None
        if server is not None:
            server.close()


_tree = process_tree  # the fork server's handles use this name
