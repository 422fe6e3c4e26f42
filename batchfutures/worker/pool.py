"""A child of a job with N vCPUs runs its items on N processes inside its container.

    worker.run_items: every seal checked (calls.Prefetched: the initializer's or initargs' and each
      function's pickle, one GET each, a failed check is the job's IntegrityError, raised here
      before anything is unpickled, forked or run), items unpacked,
      processes_for(len(items)) = N > 1 ──> run_items(...)
      this process (the container's worker):
        flush stdout/stderr; fork N sub-processes: they inherit the items, header and pickles
          sub-process k: initializer(*initargs) once ───> ("ready", None | failure, printed)
            (header "initargs": the functions are loaded first, each with its initializer copy,
             calls.load_bundles, so the initializer and the calls share one namespace)
        all N ready; one failed?  every item's outcome is that failure (as sequentially)
        hand out ranges of item positions, shrinking (guided self-scheduling) ──> (start, stop)
          sub-process k: each function loaded once, the items run, each measured (calls.Meter,
          opened in the sub-process: its own /proc/self), each under its own checkpoint key
          (checkpoints.at_item(position))
                                                   ──> [(position, outcome, printed, usage,
                                                         retry)...]
          retry: (delay, reason) when the item's Retries(on=...) asked for one
          (checkpoints.take_retry); the worker asks for it again (checkpoints.request_retry), so
          worker.main ends the attempt with the retry status, as on the sequential path
        SIGTERM meanwhile (a Spot notice): forwarded to the live sub-processes (_SigtermForwarding),
          each decides there as the sequential worker does (checkpoints.on_sigterm); the worker
          keeps waiting for them, until their end or the kill. One whose call used no checkpoint
          ends of it (status 143): the others go on (one that checkpoints saves its work until
          the kill), no range is handed out any more, and once they ended the container ends
          with 143, no result written, as the sequential worker ends of SIGTERM
          (sub_process_ending: Ending.AFTER_THE_OTHERS)
        outcomes back in item order; None ("stop") to every sub-process; reap them
      printed: with echo_output (``output`` given), what the item printed in its sub-process
      (calls.Capture there: tee'd to the container's log as before) or None
      a sub-process that ends unasked (the OOM killer's SIGKILL, a MemoryError, os._exit in the
      function, a crash; not SIGTERM's end above) ends the container: the other sub-processes
      are killed, then (sub_process_ending: Ending.MEMORY or Ending.NOW)
        status 137, or SIGKILL with the cgroup's oom_kill count risen (or unreadable:
        oomguard.verdict) -> MemoryError (the worker exits 137, as for the sequential path)
        any other status (a SIGKILL the count says was no OOM kill: 137 with no marker)
                          -> the container ends with that status, no result written

N: ``BATCHFUTURES_VCPUS`` (the client sets it in containerOverrides from the job's vCPUs; a
fraction rounds down), never more than the CPUs this process may use (its affinity mask and
the cgroup's CPU quota) nor than the items. N = 1 is worker.run_items's sequential path.

Each outcome is encoded exactly as the sequential path encodes it, by the same code
(calls.ItemRunner, calls.initialize): a failing item fails only itself, SystemExit from an item
is that item's outcome, an argument that is another call's result was read (and its seal
checked) before the fork.

Why fork (and not spawn or forkserver): the items are already unpickled here and the pickles
fetched, so a forked sub-process has everything without pickling an item again or starting an
interpreter and its imports (~0.2 s per process with spawn). It is safe because this process
has run no user code but the arguments' unpickling, and the sub-processes do no storage I/O
(the pickles are fetched before the fork), so no lock or connection (s3fs's event-loop thread)
is used across it. Only results travel back, through one pipe per sub-process. Fork is used on
Linux only (Batch containers run Linux); elsewhere the items run sequentially.
"""

from __future__ import annotations

import atexit
import enum
import gc
import logging
import math
import os
import signal
import sys
import threading
import time
import traceback
import warnings
from multiprocessing.connection import Connection, Pipe, wait
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from .. import checkpoints
from ..batchlimits import OOM_EXIT_STATUS
from ..dependencies import Resolver
from . import calls, oomguard
from .calls import Item

if TYPE_CHECKING:
    from ..storage import Storage

__all__ = ["VCPUS_VARIABLE", "SubProcessEnded", "Ending", "sub_process_ending", "processes_for",
           "requested_processes", "usable_cpus", "parse_cpu_max", "parse_cfs_quota", "run_items",
           "run_pool"]

logger = logging.getLogger("batchfutures")

VCPUS_VARIABLE = "BATCHFUTURES_VCPUS"
FORK_AVAILABLE = sys.platform.startswith("linux") and hasattr(os, "fork")
# a range handed out is the remaining items / (BATCH_SHARES x N): big ranges first (few
# messages for many short items), single items at the end (no sub-process idles long)
BATCH_SHARES = 4
_EXIT_GRACE = 5.0  # seconds a sub-process whose pipe closed has to exit before it is killed
_PR_SET_PDEATHSIG = 1
SIGTERM_EXIT_STATUS = 128 + signal.SIGTERM  # a death by SIGTERM, as Docker reports it


class SubProcessEnded(Exception):
    """A sub-process ended without being told to; ``exit_status`` is the container's to be,
    ``killed``: it died of SIGKILL (an OOM kill, or another), not of its own exit; ``sigterm``:
    it ended of the SIGTERM the worker forwarded (Ending.AFTER_THE_OTHERS), raised once the
    other sub-processes ended."""

    def __init__(self, pid: int, exit_status: int, killed: bool = False,
                 sigterm: bool = False, ending: "Optional[Ending]" = None) -> None:
        super().__init__(f"a worker sub-process (pid {pid}) ended with status {exit_status} "
                         f"while running items" + (" (of SIGTERM: its call did not checkpoint)"
                                                   if sigterm else ""))
        self.pid = pid
        self.exit_status = exit_status
        self.killed = killed
        self.sigterm = sigterm
        self.ending = ending  # sub_process_ending's, once run_pool decided it


class Ending(enum.Enum):
    """What a sub-process's end unasked means for the container (sub_process_ending)."""

    MEMORY = "memory"  # worker.main's MemoryError: the out-of-memory marker, exit 137
    NOW = "now"  # the other sub-processes are killed, the container ends with its status
    # SIGTERM ended a call that did not checkpoint: the others go on (a call that checkpoints
    # saves its work until the kill), no item is handed out any more, and the container ends
    # with this status once they end, no result written (as the sequential worker ends)
    AFTER_THE_OTHERS = "after the others"


def sub_process_ending(exit_status: int, killed: bool, sigterm_forwarded: bool,
                       oom_counted: bool) -> Ending:
    """How the container ends after a sub-process ended unasked with ``exit_status``.

    ``killed``: it died of SIGKILL; ``sigterm_forwarded``: the worker got SIGTERM (a Spot notice,
    TerminateJob) and forwarded it; ``oom_counted``: the cgroup's oom_kill count rose meanwhile
    (or cannot be read: oomguard.verdict's rule), asked only of a SIGKILL.
    """
    if exit_status == OOM_EXIT_STATUS and (not killed or oom_counted):
        return Ending.MEMORY  # its MemoryError, or the OOM killer's SIGKILL
    if sigterm_forwarded and exit_status == SIGTERM_EXIT_STATUS and not killed:
        return Ending.AFTER_THE_OTHERS  # checkpoints.on_sigterm: its call never asked
    return Ending.NOW


# -- how many processes --------------------------------------------------------------------------
def requested_processes(environ: Mapping[str, str]) -> int:
    """The job's vCPUs as the client passed them (``BATCHFUTURES_VCPUS``), rounded down; 1 if unset."""
    raw = (environ.get(VCPUS_VARIABLE) or "").strip()
    if not raw:
        return 1
    try:
        value = float(raw)
    except ValueError:
        logger.warning("%s=%r is not a number; running the items in one process", VCPUS_VARIABLE, raw)
        return 1
    if not math.isfinite(value) or value < 1:
        return 1
    return int(value)


def parse_cpu_max(text: str) -> Optional[float]:
    """cgroup v2 ``cpu.max`` ("quota period", or "max period"): CPUs allowed, None if unlimited."""
    fields = text.split()
    if len(fields) != 2 or fields[0] == "max":
        return None
    try:
        quota, period = int(fields[0]), int(fields[1])
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def parse_cfs_quota(quota_text: str, period_text: str) -> Optional[float]:
    """cgroup v1 ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``: CPUs allowed, None if unlimited."""
    try:
        quota, period = int(quota_text.strip()), int(period_text.strip())
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def _read(path: str) -> Optional[str]:
    try:
        with open(path) as handle:
            return handle.read()
    except OSError:
        return None


def _cgroup_cpus(root: str = "/sys/fs/cgroup") -> Optional[float]:
    text = _read(os.path.join(root, "cpu.max"))
    if text is not None:
        return parse_cpu_max(text)
    quota = _read(os.path.join(root, "cpu", "cpu.cfs_quota_us"))
    period = _read(os.path.join(root, "cpu", "cpu.cfs_period_us"))
    if quota is None or period is None:
        return None
    return parse_cfs_quota(quota, period)


def usable_cpus() -> int:
    """CPUs this process may run on: its affinity mask, within the cgroup's CPU quota."""
    try:
        count = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        count = os.cpu_count() or 1
    quota = _cgroup_cpus()
    if quota is not None:
        count = min(count, int(quota))  # a fraction of a CPU more is not another process
    return max(1, count)


def processes_for(item_count: int, environ: Optional[Mapping[str, str]] = None) -> int:
    """How many processes run a child's ``item_count`` items; 1 means the sequential path."""
    if item_count < 2 or not FORK_AVAILABLE:
        return 1
    requested = requested_processes(os.environ if environ is None else environ)
    if requested < 2:
        return 1
    return max(1, min(requested, usable_cpus(), item_count))


# -- in a sub-process ---------------------------------------------------------------------------
def _serve_items(connection: Connection, items: Sequence[Item], header: Dict[str, Any],
                 index: int, prefetched: calls.Prefetched, resolver: Resolver,
                 capture_output: bool = False, measure: bool = False) -> None:
    """A sub-process's life: the initializer, then the ranges of items it is handed.

    ``capture_output``: what each item prints is sent back with its outcome (calls.Capture).
    """
    capture = calls.Capture(capture_output)
    functions, failed, failure = calls.initialize(prefetched, header, items, index)
    connection.send(("ready", failure, capture.take() if failure is not None else None))
    if failure is not None:
        return
    meter = calls.Meter() if measure else None  # here: /proc/self is this sub-process
    runner = calls.ItemRunner(prefetched, header, index, resolver, functions, failed, meter)

    def run(position: int) -> Tuple[int, bytes, Any, Any, Any]:
        checkpoints.at_item(position)  # checkpoint()/restored() of this item: its own key
        outcome = runner.run(items[position])
        # what it printed (and the initializer before), what it used, the retry it asked for
        # (Retries(on=...): the worker's attempt ends for it, so the worker must know)
        return position, outcome, capture.take(), runner.usage, checkpoints.take_retry()

    try:
        while True:
            task = connection.recv()
            if task is None:
                return
            start, stop = task
            connection.send([run(position) for position in range(start, stop)])
    finally:
        if meter is not None:
            meter.close()


def _libc_prctl() -> Any:
    """libc's prctl, looked up before the fork (ctypes' import is not free); None without it."""
    try:
        # start-up: ctypes adds ~1.5 ms to each worker's start; only an inner pool needs it
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl
    except Exception:
        return None


def _die_with(parent: int, prctl: Any) -> None:
    """SIGKILL this sub-process when the worker dies (Batch's terminate, the OOM killer)."""
    if prctl is not None:  # without it, the closed pipe still ends it between items
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the worker died before the line above
        os._exit(1)


# -- in the worker ------------------------------------------------------------------------------
class _SubProcess:
    def __init__(self, pid: int, connection: Connection) -> None:
        self.pid, self.connection = pid, connection
        self.status: Optional[int] = None  # the exit status, once reaped
        self.killed = False  # it died of SIGKILL


def _exit_status(wait_status: int) -> int:
    code = os.waitstatus_to_exitcode(wait_status)
    return 128 - code if code < 0 else code  # as Docker reports a death by signal


def _reap(process: _SubProcess, grace: float) -> int:
    """Wait for a sub-process to end (SIGKILL after ``grace`` seconds); its exit status."""
    deadline = time.monotonic() + grace
    while process.status is None:
        pid, wait_status = os.waitpid(process.pid, os.WNOHANG)
        if not pid and time.monotonic() >= deadline:
            _kill(process)
            pid, wait_status = os.waitpid(process.pid, 0)
        if pid:
            process.status = _exit_status(wait_status)
            process.killed = (os.WIFSIGNALED(wait_status)
                              and os.WTERMSIG(wait_status) == signal.SIGKILL)
        else:
            time.sleep(0.005)
    return process.status


def _kill(process: _SubProcess) -> None:
    try:
        os.kill(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


class _SigtermForwarding:
    """While the worker waits for its sub-processes, SIGTERM (a Spot notice, a terminated job)
    goes on to them: there each item's process decides (checkpoints.on_sigterm: a call that used
    checkpoint/restored/interrupted goes on, interrupted() now true; any other ends of it, and so
    the container) and the worker keeps waiting, until their end or the kill."""

    def __init__(self) -> None:
        self.owner = os.getpid()
        self.processes: List[_SubProcess] = []
        self.received = False
        self.previous: Any = None
        self.installed = False

    def __enter__(self) -> "_SigtermForwarding":
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGTERM, self._on_sigterm)
            self.installed = True
        return self

    def __exit__(self, *_: Any) -> None:
        self.restore()

    def restore(self) -> None:
        """The handler before (in a sub-process: its own, inherited, checkpoints.on_sigterm)."""
        if self.installed:
            signal.signal(signal.SIGTERM, self.previous)
            self.installed = False

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        if os.getpid() != self.owner:  # a sub-process before it restored the handler before
            self.restore()
            os.kill(os.getpid(), signal.SIGTERM)
            return
        self.received = True
        self.forward()

    def forward(self) -> None:
        for process in self.processes:
            if process.status is None:
                try:
                    os.kill(process.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass


def _start(count: int, items: Sequence[Item], header: Dict[str, Any], index: int,
           prefetched: calls.Prefetched, resolver: Resolver,
           capture_output: bool = False, measure: bool = False,
           in_sub_process: Optional[Callable[[], None]] = None) -> List[_SubProcess]:
    calls.flush_output()  # what is buffered now must not be written once by every sub-process
    parent, prctl = os.getpid(), _libc_prctl()
    started: List[_SubProcess] = []
    gc.freeze()  # a collection in a sub-process then leaves the inherited objects' pages shared
    try:
        for _ in range(count):
            ours, theirs = Pipe()
            with warnings.catch_warnings():
                # Python 3.12+ warns when other threads exist (s3fs's event loop): safe here,
                # the sub-processes never use them (see the module docstring)
                warnings.simplefilter("ignore", DeprecationWarning)
                pid = os.fork()
            if pid == 0:  # the sub-process: never returns
                status = 1
                try:
                    if in_sub_process is not None:
                        in_sub_process()
                    atexit._clear()  # the worker's handlers are the worker's; the items' run here
                    ours.close()
                    for other in started:
                        other.connection.close()
                    _die_with(parent, prctl)
                    _serve_items(theirs, items, header, index, prefetched, resolver, capture_output,
                                 measure)
                    status = 0
                    atexit._run_exitfuncs()  # as the worker's own exit: handlers, not threads
                except MemoryError:
                    status = OOM_EXIT_STATUS  # the worker says so, once, and exits 137
                except (EOFError, OSError):  # the worker is gone
                    pass
                except BaseException:
                    traceback.print_exc()
                finally:
                    calls.flush_output()
                    os._exit(status)
            theirs.close()
            started.append(_SubProcess(pid, ours))
    except BaseException:
        _stop(started, kill=True)
        raise
    finally:
        gc.unfreeze()
    return started


def _stop(processes: Sequence[_SubProcess], *, kill: bool) -> None:
    for process in processes:
        if process.status is not None:
            continue
        if kill:
            _kill(process)
        else:
            try:
                process.connection.send(None)
            except OSError:
                pass
    for process in processes:
        if process.status is None:
            _reap(process, 0.0 if kill else _EXIT_GRACE)
        process.connection.close()


def _receive(process: _SubProcess) -> Any:
    try:
        return process.connection.recv()
    except (EOFError, OSError):
        status = _reap(process, _EXIT_GRACE)
        raise SubProcessEnded(process.pid, status, process.killed) from None


def run_pool(items: Sequence[Item], header: Dict[str, Any], index: int,
             prefetched: calls.Prefetched, processes: int,
             output: Optional[Dict[int, Any]] = None,
             resolver: Optional[Resolver] = None,
             usage: Optional[List[Any]] = None) -> List[bytes]:
    """The items' outcomes, in order, run on ``processes`` forked sub-processes.

    ``output``: filled with what each item printed (worker.run_items's ``output``).
    ``usage``: extended with each item's usage, in item order (worker.run_items's ``usage``).
    ``resolver``: the upstream results the items' arguments name, read already (no storage I/O
    after the fork); None when they name none.
    Raises SubProcessEnded when one of them ends unasked, its ``ending`` decided
    (sub_process_ending): the others killed first, or, for Ending.AFTER_THE_OTHERS (SIGTERM
    ended a call that did not checkpoint), once they ended of themselves or of the kill.
    """
    kills_before = oomguard.oom_kill_count()  # before any item: an OOM kill later raises it
    with _SigtermForwarding() as forwarding:
        return _run_pool(items, header, index, prefetched, processes, output, resolver, usage,
                         forwarding, kills_before)


def _ending(ended: SubProcessEnded, sigterm_forwarded: bool,
            kills_before: Optional[int]) -> Ending:
    oom_counted = ended.killed and oomguard.verdict(
        None, signal.SIGKILL, kills_before, oomguard.oom_kill_count(), lambda: False)[0] == "oom"
    return sub_process_ending(ended.exit_status, ended.killed, sigterm_forwarded, oom_counted)


def _run_pool(items: Sequence[Item], header: Dict[str, Any], index: int,
              prefetched: calls.Prefetched, processes: int, output: Optional[Dict[int, Any]],
              resolver: Optional[Resolver], usage: Optional[List[Any]],
              forwarding: _SigtermForwarding, kills_before: Optional[int]) -> List[bytes]:
    count = len(items)
    if resolver is None:
        resolver = Resolver(None)
    started = _start(processes, items, header, index, prefetched, resolver, output is not None,
                     usage is not None, forwarding.restore)
    forwarding.processes = started
    if forwarding.received:  # SIGTERM came while they were forked: each of them gets it
        forwarding.forward()
    used: List[Any] = [None] * count
    by_connection: Dict[Any, _SubProcess] = {process.connection: process for process in started}
    outcomes: List[Optional[bytes]] = [None] * count
    ended_of_sigterm: Optional[SubProcessEnded] = None

    def receive(connection: Any) -> Any:
        """What the sub-process sent; None when SIGTERM ended its call (which did not
        checkpoint): the others go on, each until its end or the kill."""
        nonlocal ended_of_sigterm
        try:
            return _receive(by_connection[connection])
        except SubProcessEnded as ended:
            ended.ending = _ending(ended, forwarding.received, kills_before)
            if ended.ending is not Ending.AFTER_THE_OTHERS:
                raise
            if ended_of_sigterm is None:
                logger.warning("child %d: a sub-process's call ended of SIGTERM (it used no "
                               "checkpoint); the others go on until they end or the kill, then "
                               "the container ends with status %d, no result written", index,
                               ended.exit_status)
                ended_of_sigterm = ended
            return None

    try:
        failure: Optional[bytes] = None
        not_ready = set(by_connection)
        while not_ready:  # every initializer first: one that fails fails the whole child
            for connection in wait(list(not_ready)):
                ready = receive(connection)
                not_ready.discard(connection)
                if ready is None:
                    continue
                _, initializer_failure, printed = ready
                if failure is None and initializer_failure is not None:
                    failure = initializer_failure
                    if printed is not None and output is not None:  # the initializer's output
                        output[0] = printed
        if failure is not None:
            _stop(started, kill=False)
            return [failure] * count
        handed = 0

        def hand_out(connection: Any) -> bool:
            nonlocal handed
            if handed >= count or ended_of_sigterm is not None:  # then no result is written
                return False
            size = max(1, math.ceil((count - handed) / (BATCH_SHARES * processes)))
            try:
                connection.send((handed, min(count, handed + size)))
            except OSError:
                pass  # it ended meanwhile: its next receive says how
            handed += size
            return True

        busy = {connection for connection in by_connection
                if by_connection[connection].status is None and hand_out(connection)}
        while busy:
            for connection in wait(list(busy)):
                done = receive(connection)
                if done is None:
                    busy.discard(connection)
                    continue
                for position, outcome, printed, item_usage, retry in done:
                    outcomes[position] = outcome
                    used[position] = item_usage
                    if retry is not None:  # worker.main ends the attempt for Batch's retry
                        delay, reason = retry
                        checkpoints.request_retry(delay, reason=reason)
                    if printed is not None and output is not None:
                        output[position] = printed
                if not hand_out(connection):
                    busy.discard(connection)
        _stop(started, kill=False)
    except BaseException:
        _stop(started, kill=True)
        raise
    if ended_of_sigterm is not None:  # the others ended: now the container, as SIGTERM meant
        raise SubProcessEnded(ended_of_sigterm.pid, ended_of_sigterm.exit_status,
                              sigterm=True, ending=Ending.AFTER_THE_OTHERS)
    if usage is not None:
        usage.extend(used)
    return outcomes  # type: ignore[return-value]  # every position was sent back


def run_items(storage: "Storage", header: Dict[str, Any], items: Sequence[Item], index: int,
              processes: int, output: Optional[Dict[int, Any]] = None,
              prefetched: Optional[calls.Prefetched] = None,
              usage: Optional[List[Any]] = None) -> List[bytes]:
    """worker.run_items on ``processes`` processes: one encoded outcome per item, in order.

    ``prefetched``: the payloads worker.run_items checked already; None fetches (and checks)
    them here, before the fork (IntegrityError: nothing ran).
    A MemoryError (in a sub-process too) propagates, so the worker exits 137; a sub-process that
    died otherwise ends this process with the same status, writing no result, as the function
    would have ended the sequential worker.
    """
    if prefetched is None:
        prefetched = calls.Prefetched(storage, calls.payload_urls(
            header, [function_index for function_index, _, _ in items]))
    resolver = Resolver(storage, header.get("redirects"))
    resolver.preload(items)  # here, before the fork: the sub-processes read no storage
    logger.debug("child %d: running %d items on %d processes", index, len(items), processes)
    try:
        return run_pool(items, header, index, prefetched, processes, output, resolver, usage)
    except SubProcessEnded as ended:
        # its MemoryError (exit 137), or a SIGKILL (128 + 9) the cgroup counts as an OOM kill
        # (or that nothing can tell from another: oomguard.verdict's rule)
        if ended.ending is Ending.MEMORY:
            raise MemoryError from None
        logger.error("child %d: %s; ending the container with it", index, ended)
        calls.flush_output()
        os._exit(ended.exit_status)
