"""Process-free attempts: the worker's code run in a thread of the emulator's own process.

    BatchEmulator(folder, launcher="threads") ──> Scheduler (unchanged lifecycle and records)
      ThreadLauncher.start(LaunchRequest, on_exit) ──> ThreadAttempt (an attempts.AttemptHandle)
        `python -m batchfutures.worker <url>` on this interpreter only (`attempt_refusal`); any
        other command, another interpreter (`LocalEnvironment(image=PYTHON)`) or an environment
        archive (`requirements=`) cannot start (OSError: the attempt fails with
        CannotStartContainerError, as a missing executable does): a thread runs this process's
        interpreter with its imports, so neither could apply. A LocalEnvironment whose emulator
        runs threads refuses them sooner, when the settings are given (`threads_refusal`,
        ConfigurationError: environments.LocalEnvironment.validate_settings).
        the log file opened (appended to) ──> the attempt's log stream, as a process's stdout
        _Threads: a pool grown on demand, idle threads reused (and gone after IDLE_EXIT s)
          thread: worker.run(url, request.env, fork=False, cancelled=attempt.cancelled)
                    the attempt's own environment as a mapping (os.environ is shared)
                    items run in this thread (no forked pool), no os._exit
                    its records of the "batchfutures" logger ──> its log file only
                  the status it returns (MemoryError: 137) ──> attempt.finish ──> on_exit
      kill(reason) (TerminateJob, timeout, lost host, shutdown): a thread cannot be stopped, so
        the attempt ends at once as SIGKILLed (exit code 137) and its cancelled flag is set: the
        thread runs no further item and writes no result (worker.Context.check)

Threads at once: the attempts running (the scheduler's vCPU accounting bounds them), plus killed
attempts whose item is still running. Memory limits are not enforced, and what the user's code
prints goes to this process's stdout (docs/emulator.md, "Process-free attempts").
"""

from __future__ import annotations

import logging
import os
import queue
import signal
import sys
import threading
from typing import IO, Callable, Dict, List, Mapping, Optional

from ...batchlimits import OOM_EXIT_STATUS
from ...workdir import make_private_dirs, open_private
from .attempts import AttemptHandle, LaunchRequest
from .forkserver import is_worker_command

logger = logging.getLogger("batchfutures")

IDLE_EXIT = 5.0  # seconds an idle thread waits for another attempt before it ends
# requirements=' pointer to the job's environment archive (envarchive.POINTER_VARIABLE: the
# runtime may not import the core's envarchive; tests/test_threads_launcher_settings.py holds
# the two equal)
ARCHIVE_VARIABLE = "BATCHFUTURES_ENVIRONMENT"
_OOM_LINE = b"batchfutures.worker: MemoryError: out of memory; exiting with status 137 like the OOM killer\n"


def threads_refusal(interpreter: Optional[str], environment_archive: bool,
                    this_python: str) -> Optional[str]:
    """Why a job cannot run in a thread of this process (launcher="threads"), None when it can
    (pure): a thread runs ``this_python`` with this process's imports, so an ``image=``
    interpreter other than it, or a ``requirements=`` environment archive, would be ignored."""
    reasons = []
    if interpreter is not None and interpreter != this_python:
        reasons.append(f"image={interpreter!r} (an interpreter other than this process's, "
                       f"{this_python!r})")
    if environment_archive:
        reasons.append("requirements= (an environment archive put on the worker's import path)")
    if not reasons:
        return None
    return (f"launcher='threads' runs each attempt in a thread of this process, so "
            f"{' and '.join(reasons)} cannot apply: use the emulator's default "
            f"launcher='process' (a LocalEnvironment's own emulator) to run them as AWS would, "
            f"or leave them out to run on this interpreter and its installed packages")


def attempt_refusal(argv: List[str], env: Mapping[str, str],
                    this_python: str) -> Optional[str]:
    """Why an attempt cannot start as a thread (ThreadLauncher.start's OSError), None when it
    can (pure): only the worker's command runs, on this interpreter, with no archive."""
    if not is_worker_command(argv):
        return (f"{argv[0] if argv else ''!r}: launcher='threads' runs only the worker's "
                "command, python -m batchfutures.worker <job_url>")
    return threads_refusal(argv[0], bool(env.get(ARCHIVE_VARIABLE)), this_python)


class ThreadAttempt(AttemptHandle):
    """One attempt run by a thread; `pid` is this process's (nothing of the attempt's to signal)."""

    def __init__(self, request: LaunchRequest,
                 on_exit: Optional[Callable[[AttemptHandle], None]]) -> None:
        super().__init__(os.getpid(), request, on_exit)
        self._cancel = threading.Event()
        self._ended = False

    graceful = False  # nothing to send SIGTERM to: a kill ends the attempt at once

    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def _signal_all(self) -> None:  # kill(): the attempt ends now; its thread stops on its own
        self._cancel.set()
        self.end(-signal.SIGKILL)

    def end(self, returncode: int) -> None:
        """The attempt ended (its thread returned, or it was killed): the first end counts."""
        with self._lock:
            if self._ended:
                return
            self._ended = True
        self.finish(returncode)


class _AttemptLogs(logging.Filter):
    """On the "batchfutures" logger: a record made on an attempt's thread goes to that attempt's
    log file and nowhere else, as a process's stderr would; others pass untouched."""

    def __init__(self) -> None:
        super().__init__()
        self._files: Dict[int, IO[bytes]] = {}
        self._format = logging.Formatter("batchfutures.worker: %(message)s")

    def attach(self, log: IO[bytes]) -> None:
        self._files[threading.get_ident()] = log

    def detach(self) -> None:
        self._files.pop(threading.get_ident(), None)

    def filter(self, record: logging.LogRecord) -> bool:
        log = self._files.get(record.thread) if record.thread is not None else None
        if log is None:
            return True
        try:
            log.write((self._format.format(record) + "\n").encode("utf-8", "replace"))
        except (OSError, ValueError):
            pass
        return False


_Call = Callable[[], Callable[[], None]]  # does the work, returns what reports it


class _Threads:
    """Daemon threads running submitted calls: a new thread only when none is idle.

    Daemon threads, so a killed attempt's function that never returns cannot keep the
    interpreter from exiting. An idle thread holds one `_idle` token; a submit that takes a
    token hands its call to a waiting thread, else starts one. A call returns its report, run
    once the thread is idle again: the attempt's end frees its vCPUs, and the scheduler's next
    attempt then finds this thread idle rather than starting another.
    """

    def __init__(self) -> None:
        self._calls: "queue.SimpleQueue[Optional[_Call]]" = queue.SimpleQueue()
        self._idle = threading.Semaphore(0)
        self._lock = threading.Lock()
        self._count = 0
        self.busy = 0  # threads running a call: attempts, killed ones whose code still runs too
        self._closed = False

    def submit(self, call: _Call) -> None:
        with self._lock:
            if self._closed:
                raise OSError("the emulator's attempt threads are closed")
            self._calls.put(call)
            if self._idle.acquire(blocking=False):
                return
            self._count += 1
            name = f"bf-emulator-attempt-{self._count}"
        threading.Thread(target=self._serve, name=name, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                call = self._calls.get(timeout=IDLE_EXIT)
            except queue.Empty:
                if self._idle.acquire(blocking=False):  # no call is on its way to this thread
                    return
                continue
            if call is None:
                return
            with self._lock:
                self.busy += 1
            report: Callable[[], None] = _nothing
            try:
                report = call()
            finally:
                with self._lock:
                    self.busy -= 1
                self._idle.release()
                report()

    def close(self) -> None:
        """Idle threads end; busy ones end after their call."""
        with self._lock:
            self._closed = True
            count = self._count
        for _ in range(count):
            self._calls.put(None)


def _nothing() -> None:
    pass


class NullMonitor:
    """The scheduler's memory monitor when attempts are threads: nothing to sample or kill."""

    def watch(self, handle: AttemptHandle, memory_mib: int) -> None:
        pass

    def unwatch(self, handle: AttemptHandle) -> None:
        pass

    def close(self) -> None:
        pass


class ThreadLauncher:
    """Starts worker attempts as threads of this process (see the module doc)."""

    in_processes = False

    def __init__(self) -> None:
        self._threads = _Threads()
        self._logs = _AttemptLogs()
        logging.getLogger("batchfutures").addFilter(self._logs)

    def start(self, request: LaunchRequest,
              on_exit: Optional[Callable[[AttemptHandle], None]] = None) -> AttemptHandle:
        """Start the attempt; OSError when it cannot run as a thread (`attempt_refusal`)."""
        argv = list(request.argv)
        refusal = attempt_refusal(argv, request.env, sys.executable)
        if refusal is not None:
            raise OSError(refusal)
        make_private_dirs(os.path.dirname(request.log_path))  # 0700 whatever the umask
        log = open(open_private(request.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND),
                   "ab", buffering=0)  # the user's alone (CONTRACT 9)
        attempt = ThreadAttempt(request, on_exit)
        try:
            self._threads.submit(lambda: self._run(attempt, argv[3], dict(request.env), log))
        except BaseException:
            _close(log)
            raise
        return attempt

    def _run(self, attempt: ThreadAttempt, job_url: str, env: Dict[str, str],
             log: IO[bytes]) -> Callable[[], None]:
        """The attempt's work in this thread; returns its report (`attempt.end(status)`)."""
        # start-up: the worker's code costs ~58 ms after the service's imports (a standalone
        # emulator's start); only launcher="threads" runs it
        from ...worker import main as worker

        status = 1
        self._logs.attach(log)
        try:
            if not attempt.cancelled():  # killed while it waited for a thread
                status = worker.run(job_url, env, fork=False, cancelled=attempt.cancelled)
        except MemoryError:
            _write(log, _OOM_LINE)
            status = OOM_EXIT_STATUS
        except BaseException:  # what would have ended the process: its traceback, status 1
            logger.exception("the worker failed")
        finally:
            self._logs.detach()
            _close(log)
        return lambda: attempt.end(status)

    @property
    def busy_threads(self) -> int:
        """Threads running an attempt's code now, killed attempts' included (benchmarks, tests)."""
        return self._threads.busy

    def close(self) -> None:
        self._threads.close()
        logging.getLogger("batchfutures").removeFilter(self._logs)


def _write(log: IO[bytes], data: bytes) -> None:
    try:
        log.write(data)
    except (OSError, ValueError):
        pass


def _close(log: IO[bytes]) -> None:
    try:
        log.close()
    except OSError:
        pass
