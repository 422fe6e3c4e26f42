"""Starting one attempt's process, as a container runtime would.

    ProcessLauncher(cgroups).start(LaunchRequest, on_exit) -> AttemptHandle (attempts.py)

Each attempt is a fresh process in its own session (so its process group can be killed as a
whole), stdin from /dev/null, stdout and stderr appended to the attempt's log file, its working
directory and environment those of the request (the container's, see scheduler.py), and
PR_SET_PDEATHSIG=SIGKILL, so it dies with the thread that launched it: the emulator's scheduler
thread, which lives as long as the emulator.

Memory, as Docker: where the emulator may create cgroups (cgroups.py) the attempt joins its own
group before its command's first instruction (a `sh -c` prologue writes its pid to the group's
`cgroup.procs`, then execs the command: one pid throughout), and the kernel enforces the limit.
Elsewhere it gets RLIMIT_DATA (soft and hard) at the job's MEMORY, so an allocation over the
limit fails at once inside the process (the worker turns that MemoryError into exit status
137), and the sampling monitor (monitor.py) kills what grows past the limit otherwise.

No Python code runs between fork and exec, so subprocess takes its vfork path and a launch costs
a few ms whatever the client's size (a preexec_fn forces a real fork, which copies the client's
page tables: ~30 ms in a test process, ~200 ms in a 1 GiB one, all on the scheduler thread).
util-linux's `setpriv --pdeathsig KILL` sets the death signal and execs (util-linux's `prlimit
--data=N:N` and then) the command, so the limits are in force before the command's own exec.
Without the `prlimit` command, RLIMIT_DATA is set with prlimit(2) from outside right after the
spawn; without setpriv the emulator falls back to the preexec_fn.

The worker command (`python -m batchfutures.worker <url>`) is forked from a preloaded fork
server instead (forkserver.py): still one fresh process per attempt, started in milliseconds.
Not on another interpreter (`LocalEnvironment(image=PYTHON)`): the server is this one, preloaded
with this interpreter's packages, so such an attempt is exec'd like any command.
"""

from __future__ import annotations

import ctypes
import os
import resource
import shutil
import signal
import subprocess
import sys
import threading
from types import EllipsisType
from typing import Any, Callable, Dict, List, Optional, Union

from ...batchlimits import SIGKILL_EXIT_STATUS
from ...workdir import ATTEMPT_UMASK, make_private_dirs, open_private
from .attempts import AttemptHandle, LaunchRequest
from .forkserver import ForkServer, is_forkable

_PR_SET_PDEATHSIG = 1


def _load_prctl() -> Optional[Callable[..., int]]:
    if not sys.platform.startswith("linux"):
        return None
    try:
        # this process's own symbols (libc's among them): find_library would run ldconfig
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl
    except (OSError, AttributeError):
        return None


# Resolved once here: the code between fork and exec must not load libraries or import.
_prctl = _load_prctl()


_python_path_cache: Dict[Any, str] = {}


def client_python_path() -> str:
    """PYTHONPATH that lets a child import what this client imports (its local code included).

    Only for `inherit_client_path=True`: a container has none of the client's folders.
    """
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


_setpriv_path: Union[str, None, EllipsisType] = ...  # found on the first launch (...: not yet)
_prlimit_path: Union[str, None, EllipsisType] = ...
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


def _child_setup(memory_mib: Optional[int], parent: int, procs: List[str]) -> Callable[[], None]:
    limit = int(memory_mib) * 1024 * 1024 if memory_mib else None
    own_pid = str  # bound here: nothing is looked up between fork and exec

    def setup() -> None:  # runs in the child between fork and exec: no imports, no locks
        if _prctl is not None:
            _prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
            if os.getppid() != parent:  # the emulator died before the line above
                os._exit(SIGKILL_EXIT_STATUS)  # as the death signal would have ended it
        for path in procs:  # join the attempt's cgroup
            fd = os.open(path, os.O_WRONLY)
            try:
                os.write(fd, own_pid(os.getpid()).encode())
            finally:
                os.close(fd)
        if limit is not None:
            hard = resource.getrlimit(resource.RLIMIT_DATA)[1]
            cap = limit if hard == resource.RLIM_INFINITY else min(limit, hard)
            resource.setrlimit(resource.RLIMIT_DATA, (cap, cap))

    return setup


# Writes its own pid into each of the first $1 files (the cgroup's), then execs the rest; the
# shell's own PWD is not left behind (a container's environment has none).
_JOIN_CGROUP = ('n=$1; shift; while [ "$n" -gt 0 ]; do echo $$ > "$1" || exit 125; shift; '
                'n=$((n - 1)); done; {unset}exec "$@"')


class ProcessHandle(AttemptHandle):
    """One attempt's exec'd process: a waiter thread reports its end."""

    def __init__(self, popen: subprocess.Popen, request: LaunchRequest,
                 on_exit: Optional[Callable[[AttemptHandle], None]]) -> None:
        super().__init__(popen.pid, request, on_exit)
        self._popen = popen
        self._waiter = threading.Thread(target=self._wait, name=f"bf-emulator-wait-{self.pid}",
                                        daemon=True)
        self._waiter.start()

    def _wait(self) -> None:
        try:  # wait without reaping, so the group id cannot be reused while we kill the rest
            os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOWAIT)
        except (ChildProcessError, OSError, AttributeError):
            pass
        try:  # the container's other processes end with its main process
            os.killpg(self.pid, signal.SIGKILL)
        except OSError:
            pass
        self.finish(self._popen.wait())


class ProcessLauncher:
    """Starts attempts as fresh processes (the worker's from the fork server)."""

    in_processes = True

    def __init__(self, *, use_forkserver: Optional[bool] = None) -> None:
        if use_forkserver is None:
            use_forkserver = os.environ.get("BATCHFUTURES_EMULATOR_FORKSERVER", "1") != "0"
        self.use_forkserver = use_forkserver
        self._forkserver: Optional[ForkServer] = None
        self._lock = threading.Lock()

    def _fork_server(self) -> Optional[ForkServer]:
        if not self.use_forkserver:
            return None
        with self._lock:
            if self._forkserver is None:
                self._forkserver = ForkServer()
            return None if self._forkserver.broken else self._forkserver

    def start(self, request: LaunchRequest,
              on_exit: Optional[Callable[[AttemptHandle], None]] = None) -> AttemptHandle:
        """Start the attempt; OSError when the command cannot be run at all."""
        argv, env = list(request.argv), request.env
        make_private_dirs(os.path.dirname(request.log_path))  # 0700 whatever the umask
        if is_forkable(argv) and argv[0] == sys.executable:  # the worker's, on this interpreter
            server = self._fork_server()
            if server is not None:
                try:
                    return server.spawn(request, on_exit or (lambda _handle: None))
                except OSError:  # the server is gone: fall back to a plain start
                    pass
        if not argv or shutil.which(argv[0], path=env.get("PATH")) is None:
            # what exec would have said (rather than setpriv's or sh's exit status 127)
            raise FileNotFoundError(f"{argv[0] if argv else ''!r}: no such executable")
        cgroup = request.cgroup
        memory_mib = request.memory_mib if cgroup is None else None  # cgroup: no RLIMIT_DATA
        setpriv = _setpriv()
        with open(open_private(request.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND),
                  "ab", buffering=0) as log:  # the user's alone (CONTRACT 9)
            if setpriv is not None:  # vfork + exec: see the module doc
                prefix = [setpriv, "--pdeathsig", "KILL", "--"]
                if cgroup is not None:
                    script = _JOIN_CGROUP.format(unset="" if "PWD" in env else "unset PWD; ")
                    prefix += ["/bin/sh", "-c", script, "sh", str(len(cgroup.procs)),
                               *cgroup.procs]
                prlimit = None
                if memory_mib:
                    prlimit = _prlimit()
                    if prlimit is not None:  # the limit holds from the command's first instruction
                        cap = _data_cap(memory_mib)
                        prefix += [prlimit, f"--data={cap}:{cap}", "--"]
                popen = subprocess.Popen(
                    prefix + argv, env=env, cwd=request.cwd,
                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    close_fds=True, start_new_session=True, umask=ATTEMPT_UMASK)
                if memory_mib and prlimit is None:
                    _limit_data(popen.pid, memory_mib)
            else:  # a real fork, to run _child_setup between fork and exec
                popen = subprocess.Popen(
                    argv, env=env, cwd=request.cwd, stdin=subprocess.DEVNULL, stdout=log,
                    stderr=subprocess.STDOUT, close_fds=True, start_new_session=True,
                    umask=ATTEMPT_UMASK, preexec_fn=_child_setup(memory_mib, os.getpid(),
                                            cgroup.procs if cgroup is not None else []))
        return ProcessHandle(popen, request, on_exit)

    def close(self) -> None:
        """Stop the fork server (and with it any attempt it still runs)."""
        with self._lock:
            server, self._forkserver = self._forkserver, None
        if server is not None:
            server.close()
