"""A preloaded fork server, so an attempt of the worker starts in milliseconds.

A fresh interpreter importing fsspec and cloudpickle takes ~200 ms; Batch's own containers pay
that too, but a local emulator need not. The server is one single-threaded process that has
imported the worker once; for each attempt it forks, and the child becomes the attempt:

    emulator ── {"id", "url", "args", "env", "cwd", "log", "memory_mib", "cgroup"} ──> server
             <── {"id", "pid"} ─────────────────────────────── fork(): child runs the worker
             <── {"pid", "returncode"} ────────────────────── SIGCHLD: the child ended
                                       server <── "statistics json ..." ── the child, at its end:
                                                  the library modules it imported (the server
                                                  imports them for the next attempts)

Every attempt is still its own process, and indistinguishable from `python -m batchfutures.worker
<url>` exec'd with the request's environment in the request's directory: it joins its cgroup
first (or sets RLIMIT_DATA, in the fallback), then has its own session (killed as a group), its
log file on stdout/stderr, exactly the request's environment and working directory, the
`sys.path` `-m` would build there, `sys.argv`/`sys.orig_argv` of that command, and a fresh
`__main__` running the worker's code through runpy as `-m` does. The server dies when the emulator
closes its stdin (or dies), killing the attempts it started. A warm pool's worker
(`python -m batchfutures.worker --warm <pool_url>`, is_warm_worker_command) forks the same way,
its arguments in the request's "args"; the first one makes the server import WARM_IMPORTS.

What the server holds is what no attempt should pay for again, and nothing that runs:
- the worker and everything it imports on a file:// attempt (WORKER_IMPORTS: pool.py and
  multiprocessing too; cloudpickle, fsspec, and what fsspec imports on its first URL), and the
  worker's code compiled once (WorkerCode: -m would compile it per attempt where no .pyc may be
  written), so an attempt imports and compiles nothing of batchfutures;
  s3fs (~0.5 s) once the first s3:// attempt comes, so file:// attempts fork from a smaller
  process (~30 MiB resident instead of ~48: faster fork and exit);
- the standard-library modules attempts imported: each attempt tells the server, as it ends,
  which modules of the interpreter's own library it imported that the server had not (noted by
  a finder first on `sys.meta_path` that finds nothing: the one trace an attempt shows), and the
  server imports them for the attempts that follow (`statistics`: ~5 ms per attempt). Learned
  from the attempts, not taken from the client: the client's own libraries (botocore, s3fs)
  import ~250 library modules no job needs, and a server holding them made each fork, its
  copy-on-write faults and its exit ~1 ms dearer. Never site-packages or user code (their
  imports may start threads or have side effects), and not the few library modules with side
  effects at import (`this`, `antigravity`, `readline`, GUI toolkits...). A module whose state
  would be shared by every attempt is reseeded at fork by Python itself (`random`);
- no finder's directory listing: invalidated after every import, here rather than in each attempt;
- `gc.freeze()` after every import, so a collection in an attempt does not write to (and copy)
  every page of the server's objects.
"""

from __future__ import annotations

import atexit
import gc
import importlib
import importlib.util
import json
import os
import resource
import runpy
import select
import signal
import subprocess
import sys
import sysconfig
import threading
import traceback
import types
from typing import IO, Any, Callable, Dict, Iterable, List, Optional, Tuple

from ...workdir import ATTEMPT_UMASK, open_private
from .attempts import AttemptHandle, LaunchRequest

WORKER_MODULE = "batchfutures.worker"  # the package `-m` names
WORKER_MAIN = WORKER_MODULE + ".__main__"  # what `-m` runs as __main__, never imported here
# What the worker imports, at its top or inside its functions, on every attempt of a file:// job
# (pool.py brings multiprocessing.connection): all of it without side effects at import.
WORKER_IMPORTS = (
    "batchfutures.serialization", "batchfutures.wire", "batchfutures.storage", "batchfutures.signing",
    "batchfutures.batchlimits",
    "batchfutures.awsclients", "batchfutures.dependencies", "batchfutures.worker.nodes",
    "batchfutures.worker.calls", "batchfutures.worker.pool", "batchfutures.worker.storagelib",
    "batchfutures.worker.main", "batchfutures.worker.warm",
)
# What a warm worker (`--warm <pool_url>`) imports besides, on the emulator: LocalSQS, and so
# botocore's models. Imported by the server when the first warm worker comes (as s3fs on the
# first s3:// attempt), so the one-child attempts of a program without warm pools fork from a
# smaller process.
WARM_IMPORTS = ("batchfutures.emulator.sqs",)
WARM_FLAG = "--warm"

# Standard-library modules never preloaded: side effects at import (printing, a browser, the
# terminal, a GUI toolkit, files written) or test and tooling packages no job needs warm.
_NOT_PRELOADED = frozenset({
    "__main__", "this", "antigravity", "__hello__", "__phello__", "idlelib", "tkinter",
    "_tkinter", "turtle", "turtledemo", "readline", "rlcompleter", "curses", "_curses",
    "webbrowser", "test", "lib2to3", "ensurepip", "venv", "pydoc", "pydoc_data", "site",
    "sitecustomize", "usercustomize",
})
PIPE_LINE = 4000  # bytes of one child's report: under PIPE_BUF (4096), so written at once
_STDLIB_NAMES = frozenset(getattr(sys, "stdlib_module_names", ()))  # Python >= 3.10


def preloadable(name: str) -> bool:
    """Whether the server may import module `name` (by name: the server checks where it is)."""
    top = name.partition(".")[0]
    return top in _STDLIB_NAMES and top not in _NOT_PRELOADED


def _library_folders() -> Tuple[List[str], List[str]]:
    paths = sysconfig.get_paths()
    library = {os.path.realpath(paths[k]) for k in ("stdlib", "platstdlib") if paths.get(k)}
    packages = {os.path.realpath(paths[k]) for k in ("purelib", "platlib") if paths.get(k)}
    return sorted(library), sorted(packages)


def _in_standard_library(top: str, folders: Tuple[List[str], List[str]]) -> bool:
    """Whether top-level module `top` resolves to the interpreter's own library here."""
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return False
    if spec is None:
        return False
    if spec.origin in ("built-in", "frozen"):
        return True
    if not spec.origin:
        return False
    origin = os.path.realpath(spec.origin)
    if {"site-packages", "dist-packages"} & set(origin.split(os.sep)):
        return False
    library, packages = folders
    inside = lambda folder: origin.startswith(folder + os.sep)  # noqa: E731
    return any(map(inside, library)) and not any(map(inside, packages))


def _preload(names: Iterable[str], folders: Tuple[List[str], List[str]]) -> bool:
    """Import the standard-library modules among `names` (in the server); True if any was new."""
    imported = False
    for name in names:
        if name in sys.modules or not preloadable(name):
            continue
        if not _in_standard_library(name.partition(".")[0], folders):
            continue
        try:
            importlib.import_module(name)
            imported = True
        except (Exception, SystemExit):  # the attempt will import it, or fail to, itself
            pass
    return imported


def is_worker_command(argv: List[str]) -> bool:
    """`python -m batchfutures.worker <url>`: one attempt of a job (what launcher="threads"
    runs too)."""
    return (len(argv) == 4 and os.path.basename(argv[0]).startswith("python")
            and argv[1] == "-m" and argv[2] == WORKER_MODULE and argv[3] != WARM_FLAG)


def is_warm_worker_command(argv: List[str]) -> bool:
    """`python -m batchfutures.worker --warm <pool_url>`: a warm pool's worker (worker/main.py)."""
    return (len(argv) == 5 and os.path.basename(argv[0]).startswith("python")
            and argv[1] == "-m" and argv[2] == WORKER_MODULE and argv[3] == WARM_FLAG)


def is_forkable(argv: List[str]) -> bool:
    """The commands the server runs: the worker's, one-attempt or warm."""
    return is_worker_command(argv) or is_warm_worker_command(argv)


# -- the server process -------------------------------------------------------------------------
def _fresh_sys_path(cwd: str, python_path: str, base: List[str]) -> List[str]:
    """sys.path of `python -m ...` started in `cwd` with PYTHONPATH `python_path`.

    The interpreter puts the working directory first, then the PYTHONPATH entries (made
    absolute), then its own library and site folders (`base`), duplicates after the first
    removed except the leading directory (as site.removeduppaths leaves it).
    """
    rest: List[str] = []
    for entry in [e for e in python_path.split(os.pathsep) if e] + base:
        entry = os.path.abspath(os.path.join(cwd, entry))
        if entry not in rest:
            rest.append(entry)
    return [cwd] + rest


class WorkerCode:
    """The code of the worker's ``__main__.py``, compiled once in the server for every attempt
    (`-m` would read it again each time, and compile it where no .pyc may be written), while
    its file is unchanged (size and mtime, as a .pyc is checked)."""

    def __init__(self) -> None:
        self.spec: Any = None
        self.code: Any = None
        self.stamp: Optional[Tuple[int, int]] = None

    @staticmethod
    def _stamp(path: str) -> Optional[Tuple[int, int]]:
        try:
            info = os.stat(path)
        except OSError:
            return None
        return info.st_size, info.st_mtime_ns

    def refresh(self) -> None:
        """In the server: (re)compile when the file changed since."""
        try:
            spec = importlib.util.find_spec(WORKER_MAIN)
            stamp = self._stamp(spec.origin) if spec is not None and spec.origin else None
            if stamp is None or spec is None or spec.loader is None:
                self.code = None
            elif stamp != self.stamp or self.code is None:
                self.code = spec.loader.get_code(WORKER_MAIN)  # type: ignore[attr-defined]
            self.spec, self.stamp = spec, stamp
        except Exception:  # the child then runs the module as -m does, and meets the error there
            self.code = None

    def current(self) -> Tuple[Any, Any]:
        """In the child: (code, spec), or (None, None) when the file changed since."""
        if self.code is None or self._stamp(self.spec.origin) != self.stamp:
            return None, None
        return self.code, self.spec


def _join_cgroup(procs: List[str]) -> None:
    for path in procs:
        fd = os.open(path, os.O_WRONLY)
        try:
            os.write(fd, str(os.getpid()).encode())
        finally:
            os.close(fd)


def _child(request: Dict[str, Any], server_fds: Tuple[int, ...], base_path: List[str],
           worker: Optional[WorkerCode] = None, learned: Optional[int] = None) -> None:
    """In the forked child: become `python -m batchfutures.worker <url>`, exit with its status.

    ``learned``: where to tell the server, at the end, which library modules it imported."""
    code = 1
    if learned is not None:  # at exit: the worker ends with os._exit after the atexit handlers
        recorder = ImportRecorder()
        sys.meta_path.insert(0, recorder)
        atexit.register(_report_imports, learned, recorder)
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        try:
            _join_cgroup(request.get("cgroup") or [])  # before the attempt allocates anything
        except OSError as error:
            os.write(2, f"batchfutures emulator: cannot join the attempt's cgroup: {error}\n".encode())
            os._exit(125)
        for fd in server_fds:
            os.close(fd)
        os.setsid()
        os.umask(ATTEMPT_UMASK)  # what the attempt writes is its user's alone (CONTRACT 9)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        log = open_private(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND)  # CONTRACT 9
        os.dup2(log, 1)
        os.dup2(log, 2)
        for fd in (null, log):
            if fd > 2:
                os.close(fd)
        sys.stdin = open(0, "r", closefd=False)
        sys.stdout = open(1, "w", buffering=1, closefd=False)
        sys.stderr = open(2, "w", buffering=1, closefd=False)
        environment = request["env"]
        for name in [n for n in os.environ if n not in environment]:
            del os.environ[name]
        for name, value in environment.items():  # the server's is nearly the same: set the rest
            if os.environ.get(name) != value:
                os.environ[name] = value
        cwd = os.path.abspath(request["cwd"])
        os.chdir(cwd)
        # (the finders' directory caches were invalidated in the server: see _forget_listings)
        sys.path[:] = _fresh_sys_path(cwd, environment.get("PYTHONPATH", ""), base_path)
        memory = request.get("memory_mib")
        if memory:
            limit = int(memory) * 1024 * 1024
            resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
        # As `python -m`: a fresh __main__ runs the package's __main__.py, which the server
        # never imported (it would have run); the package and what it imports are preloaded.
        sys.modules["__main__"] = types.ModuleType("__main__")
        arguments = [str(a) for a in request.get("args") or [request["url"]]]
        sys.argv = ["-m", *arguments]  # runpy puts the module's file in argv[0]
        sys.orig_argv = [sys.executable, "-m", WORKER_MODULE, *arguments]
        compiled: Any = None
        spec: Any = None
        if worker is not None:
            compiled, spec = worker.current()
        if compiled is None:  # what -m itself calls
            runpy._run_module_as_main(WORKER_MODULE, alter_argv=True)  # type: ignore[attr-defined]
        else:  # what _run_module_as_main does with the code it finds
            sys.argv[0] = spec.origin
            runpy._run_code(compiled, sys.modules["__main__"].__dict__,  # type: ignore[attr-defined]
                            None, "__main__", spec)
        code = 0
    except SystemExit as exit_:
        if exit_.code is None or isinstance(exit_.code, int):
            code = exit_.code or 0
        else:
            print(exit_.code, file=sys.stderr)
            code = 1
    except BaseException:  # an uncaught exception: the interpreter prints it and exits 1
        traceback.print_exc()
        code = 1
    finally:
        try:
            _finalize()
        finally:
            os._exit(code)


class ImportRecorder:
    """A finder that finds nothing and notes what it is asked for: the import system asks the
    finders only for a module not yet in sys.modules, so these are the modules the attempt
    imported itself. Walking sys.modules instead would write to the reference count of each of
    its ~1,000 keys, so copying the server's pages that hold them: ~0.4 ms per attempt."""

    def __init__(self) -> None:
        self.names: List[str] = []

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> None:
        if preloadable(fullname):
            self.names.append(fullname)
        return None


def _report_imports(fd: int, recorder: ImportRecorder) -> None:
    """Write the library modules this attempt imported as one line, shorter than PIPE_BUF so it
    reaches the server whole even when attempts end together."""
    line = ""
    for name in sorted(set(n for n in recorder.names if n in sys.modules)):
        if len(line) + len(name) + 2 > PIPE_LINE:
            break
        line += name + " "
    if line:
        try:
            os.write(fd, (line.rstrip() + "\n").encode())
        except OSError:  # the server is gone or its pipe full: it learns from another attempt
            pass


def _forget_listings() -> None:
    """In the server, after any import or module lookup: no finder keeps a directory listing,
    so an attempt lists a folder afresh, as a new interpreter would (each attempt doing this
    itself writes to, and copies, every finder's page)."""
    importlib.invalidate_caches()


def _finalize() -> None:
    """What the interpreter does at exit: wait for non-daemon threads, atexit, flush."""
    try:
        threading._shutdown()  # type: ignore[attr-defined]
    except BaseException:
        pass
    try:
        atexit._run_exitfuncs()
    except BaseException:
        pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            pass


def serve() -> None:
    """The server's loop: single-threaded, so forking is safe."""
    for name in WORKER_IMPORTS:  # preload what every attempt needs
        importlib.import_module(name)
    worker = WorkerCode()
    worker.refresh()

    try:  # fsspec imports what resolving a URL needs on the first call: here, not per attempt
        # start-up: fsspec costs ~20 ms, which the processes that import this module for
        # is_worker_command (a standalone emulator's) never need; WORKER_IMPORTS loaded it here
        import fsspec

        fsspec.core.url_to_fs(os.path.abspath(os.sep))
    except Exception:
        pass

    # The replies go to a copy of stdout; whatever an import prints goes to /dev/null.
    out = os.dup(1)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.close(null)
    folders = _library_folders()
    # the interpreter's own folders: what follows the directory and PYTHONPATH entries
    own = {os.path.abspath(e) for e in os.environ.get("PYTHONPATH", "").split(os.pathsep) if e}
    base_path = [e for e in sys.path[1:] if os.path.abspath(e) not in own]
    s3_loaded = warm_loaded = False
    _forget_listings()
    gc.freeze()

    learned_read, learned_write = os.pipe()  # the children write, the server reads
    os.set_blocking(learned_read, False)
    os.set_blocking(learned_write, False)
    wakeup_read, wakeup_write = os.pipe()
    os.set_blocking(wakeup_write, False)
    signal.set_wakeup_fd(wakeup_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    server_fds = (wakeup_read, wakeup_write, learned_read, 0, out)
    learned_buffer = b""
    children: Dict[int, int] = {}
    buffer = b""

    def send(message: Dict[str, Any]) -> None:
        os.write(out, (json.dumps(message) + "\n").encode())

    def reap() -> None:
        while children:
            try:  # look without reaping: the group id stays ours while its stragglers are killed
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return
            if info is None:
                return
            try:  # the container's other processes end with its main process
                os.killpg(info.si_pid, signal.SIGKILL)
            except OSError:
                pass
            pid, status = os.waitpid(info.si_pid, 0)
            children.pop(pid, None)
            send({"pid": pid, "returncode": os.waitstatus_to_exitcode(status)})

    while True:
        try:
            ready, _, _ = select.select([0, wakeup_read, learned_read], [], [])
        except InterruptedError:
            continue
        if wakeup_read in ready:
            os.read(wakeup_read, 4096)
            reap()
        if learned_read in ready:
            try:
                learned_buffer += os.read(learned_read, 65536)
            except BlockingIOError:
                pass
            lines, _, learned_buffer = learned_buffer.rpartition(b"\n")
            names = lines.decode(errors="replace").split()
            if names and _preload(names, folders):
                _forget_listings()
                gc.freeze()
        if 0 in ready:
            chunk = os.read(0, 65536)
            if not chunk:  # the emulator is gone: so are its attempts
                for pid in list(children):
                    try:
                        os.killpg(pid, signal.SIGKILL)
                    except OSError:
                        pass
                return
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                request = json.loads(line)
                imported = False
                if not warm_loaded and (request.get("args") or [""])[0] == WARM_FLAG:
                    warm_loaded = imported = True
                    for name in WARM_IMPORTS:
                        try:
                            importlib.import_module(name)
                        except Exception:  # the worker will import it, or fail to, itself
                            pass
                if not s3_loaded and str(request.get("url", "")).startswith("s3://"):
                    s3_loaded = imported = True
                    try:  # S3 payloads: imported once here, for every s3:// attempt after
                        # start-up: s3fs and aiobotocore cost ~0.5 s; file:// attempts fork
                        # from a smaller server without them
                        import s3fs  # noqa: F401
                    except ImportError:
                        pass
                worker.refresh()
                if imported:
                    _forget_listings()
                    gc.freeze()
                pid = os.fork()
                if pid == 0:
                    _child(request, server_fds, base_path, worker, learned_write)
                children[pid] = request["id"]
                send({"id": request["id"], "pid": pid})
        reap()


# -- the emulator's side ------------------------------------------------------------------------
class ForkedAttempt(AttemptHandle):
    """An attempt started by the fork server; the server reports its end."""

    def _exited(self, returncode: int) -> None:
        self.finish(returncode)


class ForkServer:
    """Starts the server lazily and turns its messages into ForkedAttempt events."""

    def __init__(self, python_path: str = "") -> None:
        self._python_path = python_path  # the server's own: where batchfutures itself is found
        self._process: Optional[subprocess.Popen[bytes]] = None
        self._stdin: IO[bytes]  # the running server's requests pipe (set by _ensure)
        self._lock = threading.Lock()
        self._next_id = 0
        self._pids: Dict[int, threading.Event] = {}
        self._started: Dict[int, int] = {}
        self._attempts: Dict[int, ForkedAttempt] = {}
        self._early_exits: Dict[int, int] = {}
        self.broken = False

    def _ensure(self) -> IO[bytes]:
        """The running server's stdin: the server is (re)started when it is not running."""
        if self._process is None or self._process.poll() is not None:
            env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
            if self._python_path:
                env["PYTHONPATH"] = self._python_path
            self._process = subprocess.Popen(
                [sys.executable, "-m", "batchfutures.emulator.runtime.forkserver"], env=env,
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                start_new_session=True)
            assert self._process.stdin is not None  # stdin=PIPE
            self._stdin = self._process.stdin
            threading.Thread(target=self._read, args=(self._process,), daemon=True,
                             name="bf-forkserver-reader").start()
        return self._stdin

    def _read(self, process: subprocess.Popen[bytes]) -> None:
        assert process.stdout is not None  # stdout=PIPE
        for line in process.stdout:
            message = json.loads(line)
            if "id" in message:
                with self._lock:
                    self._started[message["id"]] = message["pid"]
                    event = self._pids.pop(message["id"], None)
                if event is not None:
                    event.set()
            else:
                with self._lock:
                    attempt = self._attempts.pop(message["pid"], None)
                    if attempt is None:  # ended before its handle was registered
                        self._early_exits[message["pid"]] = message["returncode"]
                if attempt is not None:
                    attempt._exited(message["returncode"])
        self.broken = True
        with self._lock:
            orphans, self._attempts = list(self._attempts.values()), {}
        for attempt in orphans:  # the server died: so did its children's reports
            attempt._exited(-signal.SIGKILL)

    def spawn(self, launch: LaunchRequest, on_exit: Callable[[AttemptHandle], None]) -> ForkedAttempt:
        with self._lock:
            requests = self._ensure()
            self._next_id += 1
            request_id = self._next_id
            event = self._pids[request_id] = threading.Event()
            cgroup = launch.cgroup
            request = {"id": request_id, "url": launch.argv[-1],
                       "args": list(launch.argv[3:]), "env": launch.env,
                       "cwd": launch.cwd, "log": launch.log_path,
                       "memory_mib": launch.memory_mib if cgroup is None else None,
                       "cgroup": cgroup.procs if cgroup is not None else []}
            requests.write((json.dumps(request) + "\n").encode())
            requests.flush()
        if not event.wait(10):
            self.broken = True
            raise OSError("the emulator's fork server did not answer")
        with self._lock:
            pid = self._started.pop(request_id)
            attempt = ForkedAttempt(pid, launch, on_exit)
            early = self._early_exits.pop(pid, None)
            if early is None:
                self._attempts[pid] = attempt
        if early is not None:
            attempt._exited(early)
        return attempt

    def close(self) -> None:
        process, self._process = self._process, None
        if process is not None:
            try:
                if process.stdin is not None:
                    process.stdin.close()
            except OSError:
                pass
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()


if __name__ == "__main__":
    serve()
