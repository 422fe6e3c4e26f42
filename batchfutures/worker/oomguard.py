"""The container's worker runs the attempt in one forked child, so a kernel OOM kill is typed.

On AL2023 (cgroup v2) ECS gives a container the kernel killed for memory exit status 137 and no
``OutOfMemoryError`` reason: the client would see an untyped failure that retry_on_oom never
acts on. So ``python -m batchfutures.worker <url>`` (__main__.py) forks once per attempt:

    worker process (the container's main process): reads the cgroup's oom_kill count, forks
      └─ child: the whole attempt, exactly as before (main.main: inputs, items, the result or,
         on MemoryError, the out-of-memory marker and exit 137), then exit_process
    the worker waits, forwarding SIGTERM/SIGINT/SIGHUP/SIGUSR1/SIGUSR2 (docker stop's SIGTERM
    reaches the calls as before), then ends as the child ended (``verdict``, pure):
      exited with status N                   -> exits N (every ordinary failure unchanged)
      killed by SIGKILL, the cgroup's oom_kill count risen (or unreadable), no result written
                                             -> the out-of-memory marker (main's), exit 137
      killed by any other signal (a SIGKILL the count says was no OOM kill, a crash)
                                             -> dies of the same signal (exit 128 + N)

The child raises its ``oom_score_adj`` so the kernel picks it, not the small worker process that
records the marker. A result the child wrote stays (the worker never writes a result), and no
marker is written beside it. The count: the ``oom_kill`` line of the process's own cgroup,
``memory.events`` (v2) or ``memory.oom_control`` (v1, kernel 4.13+), found through
/proc/self/cgroup, else at the cgroup mount's top (a container's own group).

Where it forks: ``BATCHFUTURES_OOM_GUARD`` 1 always, 0 never; unset, only in an ECS container
(ECS_CONTAINER_METADATA_URI_V4 set, as the ECS agent and Fargate set it in every container). The
emulator needs no fork: it counts OOM kills in the attempt's own cgroup and gives Batch's reason
itself, and a second fork per attempt there measured ~+7 ms of a ~11 ms call (a 2-CPU VM).
No fork either (the attempt runs in this process, as before): not Linux or no os.fork; another
thread already running (forking a threaded process is unsafe; nothing starts one before the fork,
so this is a guard); the usage error (no single job URL). A kill of the whole cgroup
(``memory.oom.group``) kills the worker too: a plain exit 137, as before.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import traceback
from typing import Callable, Iterator, List, Mapping, Optional, Tuple

from ..batchlimits import OOM_EXIT_STATUS

__all__ = ["GUARD_VARIABLE", "FORWARDED", "verdict", "wanted", "parse_oom_kills", "oom_kill_count",
           "fork_available", "supervise"]

GUARD_VARIABLE = "BATCHFUTURES_OOM_GUARD"
ECS_VARIABLES = ("ECS_CONTAINER_METADATA_URI_V4", "ECS_CONTAINER_METADATA_URI")
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
CHILD_OOM_SCORE_ADJ = b"1000"  # raising it needs no privilege; the worker's stays as it was
CGROUP_ROOT = "/sys/fs/cgroup"
_OOM_LINE = (b"batchfutures.worker: the process running the calls was killed for memory (the "
             b"cgroup's oom_kill count rose); recording it and exiting with status 137\n")

# what the worker does once its child ended: ("exit", status), ("oom", 137), ("signal", N)
Verdict = Tuple[str, int]


def verdict(exit_status: Optional[int], signal_number: Optional[int], kills_before: Optional[int],
            kills_after: Optional[int], result_written: Callable[[], bool]) -> Verdict:
    """How the worker ends after its child ended with ``exit_status`` or of ``signal_number``.

    A SIGKILL is an OOM kill when the cgroup's oom_kill count rose, or when the count cannot be
    read (on Batch nothing else sends a lone process SIGKILL: a stop kills the container);
    ``result_written()`` is asked only then (a result written is kept, and needs no marker)."""
    if signal_number is None:
        return ("exit", int(exit_status or 0))
    if signal_number == signal.SIGKILL:
        counted = kills_before is None or kills_after is None or kills_after > kills_before
        if counted and not result_written():
            return ("oom", OOM_EXIT_STATUS)
    return ("signal", signal_number)


def parse_oom_kills(text: str) -> Optional[int]:
    """The ``oom_kill N`` line of memory.events / memory.oom_control; None without one."""
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill" and value.strip().isdigit():
            return int(value)
    return None


def _event_files(cgroup_text: str, root: str = CGROUP_ROOT) -> Iterator[str]:
    """Where this process's cgroup counts OOM kills, most specific first."""
    for line in cgroup_text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, controllers, path = parts
        path = path.strip().rstrip("/")
        if hierarchy == "0" and controllers == "":  # v2 (the unified hierarchy)
            yield f"{root}{path}/memory.events"
            yield f"{root}/memory.events"
        elif "memory" in controllers.split(","):  # v1
            yield f"{root}/memory{path}/memory.oom_control"
            yield f"{root}/memory/memory.oom_control"


def oom_kill_count(root: str = CGROUP_ROOT) -> Optional[int]:
    """The kernel's OOM kills counted in this process's memory cgroup; None where unreadable."""
    try:
        with open("/proc/self/cgroup") as handle:
            cgroup_text = handle.read()
    except OSError:
        return None
    for path in _event_files(cgroup_text, root):
        try:
            with open(path) as handle:
                found = parse_oom_kills(handle.read())
        except OSError:
            continue
        if found is not None:
            return found
    return None


def wanted(environ: Mapping[str, str]) -> bool:
    """BATCHFUTURES_OOM_GUARD: 1 forks, 0 does not; unset ("auto"): only in an ECS container
    (its ECS_CONTAINER_METADATA_URI[_V4], which the ECS agent and Fargate set in every one)."""
    setting = environ.get(GUARD_VARIABLE, "auto").strip().lower()
    if setting in ("1", "true", "yes", "on"):
        return True
    if setting in ("0", "false", "no", "off"):
        return False
    return any(environ.get(name) for name in ECS_VARIABLES)


def fork_available(argv: List[str], environ: Mapping[str, str],
                   threads: Optional[int] = None) -> bool:
    """Whether this attempt runs in a forked child (see the module docstring); ``threads``:
    how many run in this process (threading.active_count())."""
    threads = threading.active_count() if threads is None else threads
    return (sys.platform.startswith("linux") and hasattr(os, "fork") and len(argv) == 1
            and wanted(environ) and threads == 1)


def _in_child() -> None:
    """The child (its signal handlers are the worker's before the fork: Python's own): the
    kernel's first choice when memory runs out, never the worker."""
    try:
        with open("/proc/self/oom_score_adj", "wb", buffering=0) as handle:
            handle.write(CHILD_OOM_SCORE_ADJ)
    except OSError:
        pass


def _wait(pid: int) -> Tuple[Optional[int], Optional[int]]:
    """(exit status, None) or (None, signal number) of child ``pid``, once it ended."""
    while True:
        ended, status = os.waitpid(pid, 0)  # EINTR is retried (PEP 475), after the forwarding
        if ended != pid:
            continue
        if os.WIFSIGNALED(status):
            return None, os.WTERMSIG(status)
        if os.WIFEXITED(status):
            return os.WEXITSTATUS(status), None


def supervise(main: Callable[[], int], args: List[str], *, record_oom: Callable[[str], None],
              result_written: Callable[[str], bool], finish: Callable[[int], None]) -> int:
    """Run ``main()`` in a forked child and return the status the worker ends with (see the
    module docstring); without a fork, ``main()`` here. ``args``: the command's arguments.

    ``record_oom(url)``: writes the out-of-memory marker; ``result_written(url)``: whether the
    attempt's result is in storage; ``finish(status)``: how the child ends (never returns)."""
    if not fork_available(args, os.environ):
        return main()
    job_url = args[0]
    kills_before = oom_kill_count()
    for stream in (sys.stdout, sys.stderr):  # nothing buffered may be written twice
        stream.flush()
    # a signal sent before the forwarding is set waits (blocked), then is forwarded
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)
    try:
        pid = os.fork()
    except OSError as error:  # no memory or process left for it: the attempt runs here
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        os.write(2, f"batchfutures.worker: cannot fork ({error}); running here\n".encode())
        return main()
    if pid == 0:
        status = 1
        try:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            _in_child()
            status = main()
        except SystemExit as exit_:  # as the interpreter ends on one
            status = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
        except BaseException:  # noqa: B036 - as the interpreter ends on an uncaught one
            traceback.print_exc()
        finally:
            finish(status)  # never returns: the atexit handlers, then os._exit
    for forwarded in FORWARDED:
        signal.signal(forwarded, lambda number, _frame: _forward(pid, number))
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    exit_status, signal_number = _wait(pid)
    for forwarded in FORWARDED:
        signal.signal(forwarded, signal.SIG_DFL)
    kind, value = verdict(exit_status, signal_number, kills_before, oom_kill_count(),
                          lambda: _written(result_written, job_url))
    if kind == "oom":
        os.write(2, _OOM_LINE)
        record_oom(job_url)
        return OOM_EXIT_STATUS
    if kind == "signal":
        _die_of(value)
    return value


def _forward(pid: int, number: int) -> None:
    try:
        os.kill(pid, number)
    except OSError:
        pass


def _written(result_written: Callable[[str], bool], job_url: str) -> bool:
    try:
        return result_written(job_url)
    except Exception:  # storage unreachable: no result known, the kill was still for memory
        return False


def _die_of(number: int) -> None:
    """End as the child did: of the same signal (exit 128 + N where it cannot kill us: PID 1)."""
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        signal.signal(number, signal.SIG_DFL)
    except (OSError, ValueError):  # SIGKILL's cannot be set (nor caught)
        pass
    try:
        os.kill(os.getpid(), number)
    except OSError:
        pass
    os._exit(128 + number)
