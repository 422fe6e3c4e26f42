"""The one polling thread that resolves every future of an executor (and its views).

    owner.track(job) ─> Poller._jobs            user threads: request_cancel / request_abort
                            │                     only queue; the thread sends and commits
                            v
    every interval (or when the emulator says a job changed), on the poller thread:
      owner.flush_due()                          send coalesced calls whose window closed
      queued CancelJob / TerminateJob calls
      children waiting for a retried upstream    TrackedJob.ready_reruns ─> job.rerun (reruns.py)
      DescribeJobs, 100 ids per call, jobs with open children only
      per job:  TrackedJob.view ─> reconcile(view, reads) ─┬─ needs: ListJobs / DescribeJobs of
                   ^                                       │  children or nodes / LIST results
                   └──────── reads ────────────────────────┘  (a failed read: this job waits
                                                               for the next poll, nothing
                            actions ─> CancelJob (unplaceable)  committed)
                                    ─> TerminateJob (a multi-node job's node failed)
                                    ─> log tails of failed children
                                    ─> TrackedJob.apply: futures settled, facts committed
                                    ─> ResultReader.request(children that finished)
    whenever a result arrives (results.py's threads wake this one; no Batch round for it):
      ResultReader.take ─> reconcile.arrived ─> TrackedJob.apply: their futures settled

Batch rounds come every interval (the minimum after a change, doubling while nothing changes)
or when woken by `wake()`; results are settled as they arrive, between rounds.

The decisions are `reconcile.reconcile` (pure, table-tested); this module only reads, sends and
applies. Nothing one job or one result does stops the thread: each job's examination and each
child's settlement is guarded (BaseException included). A thread that ends anyway fails every
future it still tracked with `PollerStoppedError`, so nobody waits forever.

The Poller holds its owner (the Session) by weak reference only, as CPython's
ProcessPoolExecutor's manager thread does: its collaborators (Batch client getter, storage, log
reader) are given to it, and a collaborator that is a method of the owner is held weakly too.
"""

from __future__ import annotations

import functools
import itertools
import logging
import math
import threading
import time
import weakref
from dataclasses import dataclass
from typing import (
    TYPE_CHECKING,
    Any,
    Callable,
    Dict,
    Iterable,
    List,
    Mapping,
    Optional,
    Protocol,
    Sequence,
    Set,
    Tuple,
    TypeVar,
)

from . import batchapi
from .batchapi import BatchAPI, Stop
from .batchlimits import MAX_DESCRIBE_JOBS
from .childstops import is_child, parent_of, refused_alone, stop_calls
from .errors import (
    ABORT_REASON_PREFIX,
    DependencyFailedError,
    JobAbortedError,
    JobMetadataExpired,
    JobUnplaceableError,
    PollerStoppedError,
    RemoteError,
    classify_failure,
    cut_log_tail,
)
from .futures import BatchFuture
from .jobs import Actions, TrackedJob, settle
from .reconcile import LISTING_LIMIT, Needs, Reads, arrived, reconcile
from .results import ReadFailed, ResultReader
from .statuses import JobStatus
from .waiting import WaitWatcher

if TYPE_CHECKING:
    from .storage import Storage

logger = logging.getLogger("batchfutures")

# Failed children whose log tail is fetched for the error message, per poll (the rest go without).
LOG_TAILS_PER_POLL = 20
LOG_TAIL_LINES = 20  # and at most errors.LOG_TAIL_BYTES of them (the last), saying so
# seconds between the periodic ListJobs of a job: RUNNABLE children of an array none of whose
# children runs (for their reasons), FAILED nodes of a running multi-node job
CHECK_INTERVAL = 30.0
MAX_STEPS = 12  # reads rounds per job per poll; reconcile asks for each read once, so never reached
# What AWS documents (User Guide, "Job states"): SUCCEEDED and FAILED jobs are kept at least 7 days.
BATCH_RETENTION = ("AWS Batch keeps a finished job's state for at least 7 days, the local "
                   "emulator for its metadata_ttl")


class PollerOwner(Protocol):
    """What owns a poller (a Session): the coalescing buffers its thread flushes."""

    def flush_due(self) -> None:
        """Send the buffered calls whose coalescing window closed."""

    def next_flush_delay(self) -> float:
        """Seconds until the next buffer is due (inf: none is buffered)."""

    def has_pending(self) -> bool:
        """Whether calls are still buffered (the thread must not end before they are sent)."""


@dataclass(frozen=True)
class StopRequest:
    """A child to stop, queued by any thread and sent by the poller's (in bulk)."""

    how: Stop
    job: TrackedJob
    index: int
    reason: str


_Answer = TypeVar("_Answer")


class Poller:
    """Resolves the futures of every tracked job from Batch and from storage."""

    def __init__(self, owner: PollerOwner, *, batch: Callable[[], BatchAPI], storage: Storage,
                 log_tail: Optional[Callable[[Mapping[str, Any]], Optional[str]]] = None,
                 min_interval: float, max_interval: float, grace: float,
                 check_interval: float = CHECK_INTERVAL) -> None:
        """``owner``: held by weak reference; the thread ends once the owner is gone and nothing
        is outstanding."""
        self._wake = threading.Event()
        self._round_due = True  # a Batch round at the next wake (not for results that arrived)
        wake = self._wake
        self._owner = weakref.ref(owner, lambda _ref: wake.set())
        self._batch_getter = _hold(batch, owner)
        self._storage = storage
        # results are read on the reader's threads; each arrival wakes this thread to settle it
        self._reader = ResultReader(storage, self._results_arrived)
        self._log_tail = _hold(log_tail, owner) if log_tail is not None else None
        self._min_interval = min_interval
        self._max_interval = max_interval
        self._grace = grace
        self.check_interval = check_interval
        self._jobs: Dict[str, TrackedJob] = {}
        self._requests: List[StopRequest] = []
        self._lock = threading.Lock()
        self._thread: Optional[threading.Thread] = None
        self._stopping = False
        self._tails_left = LOG_TAILS_PER_POLL
        self.polls = 0  # rounds that described at least one job (for tests and benchmarks)
        self._described: Dict[str, int] = {}  # job id -> the round that last described it
        # jobs a stop of one child of was refused (childstops.refused_alone): no more child stops
        self._alone_refused: Set[str] = set()
        # why jobs wait (waiting.py): a queue's snapshot at most once a round, only for jobs
        # RUNNABLE longer than its threshold; read by the progress bar
        self.waits = WaitWatcher()

    # -- control (any thread) ------------------------------------------------------------------
    def start(self) -> None:
        """Start the thread unless it runs. After stop() a new thread still drains new work
        (attach after shutdown), then ends."""
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="batchfutures-poller",
                                                daemon=True)
                self._thread.start()

    def track(self, job: TrackedJob) -> None:
        with self._lock:
            self._jobs[job.job_id] = job
        self.start()
        self.wake()

    def wake(self) -> None:
        """Poll Batch now (a job was tracked or changed, a request was queued)."""
        self._round_due = True
        self._wake.set()

    def _results_arrived(self) -> None:
        self._wake.set()  # settle them; no Batch round for this

    def stop(self, wait: bool = True) -> None:
        """Stop once no job is outstanding (the thread drains what it tracks first)."""
        self._stopping = True
        self.wake()
        thread = self._thread
        if wait and thread is not None and thread is not threading.current_thread():
            thread.join()

    @property
    def alive(self) -> bool:
        thread = self._thread
        return thread is not None and thread.is_alive()

    @property
    def outstanding(self) -> List[TrackedJob]:
        with self._lock:
            return list(self._jobs.values())

    def request_cancel(self, future: BatchFuture) -> None:
        """A future was cancelled: its remote child is cancelled once none of its items is wanted.

        The CancelJob calls are made on the poller thread, in bulk: when every unfinished child
        of a job is cancelled, one call on the job itself replaces one per child.
        """
        job, index = future._bound() or (None, 0)
        if not isinstance(job, TrackedJob):
            return  # still buffered (or a warm call): the flush skips it
        if all(f.cancelled() for f in job.children[index]):
            self._queue(StopRequest(Stop.CANCEL, job, index,
                                    f"{ABORT_REASON_PREFIX} cancelled by the client"))

    def request_abort(self, future: BatchFuture, reason: str) -> bool:
        """Fail the future's child as aborted now; TerminateJob is sent by the poller thread.

        Returns False when the future had already finished.
        """
        if future.done():
            return False
        text = f"{ABORT_REASON_PREFIX} {reason}"
        job, index = future._bound() or (None, 0)
        if not isinstance(job, TrackedJob):
            return settle(future, False, JobAbortedError(
                f"the call was aborted before it was submitted: {reason}", status_reason=text))
        child_id = job.child_id(index)
        aborted = False
        for sibling in job.children[index]:
            aborted |= settle(sibling, False, JobAbortedError(
                f"Batch job {child_id} was terminated on request: {reason}",
                job_id=child_id, status_reason=text))
        self._queue(StopRequest(Stop.TERMINATE, job, index, text))
        return aborted

    def _queue(self, request: "StopRequest") -> None:
        with self._lock:
            self._requests.append(request)
        self.start()
        self.wake()

    # -- the thread ------------------------------------------------------------------------------
    def _run(self) -> None:
        error: Optional[BaseException] = None
        try:
            self._loop()
        except BaseException as stopped:  # noqa: B036 - reported to every waiting future below
            error = stopped
        finally:
            self._ended(error)

    def _loop(self) -> None:
        interval = self._min_interval
        next_round = time.monotonic()
        last_round = -math.inf
        while True:
            self._wake.clear()
            try:
                self._ask_owner(lambda owner: owner.flush_due(), None)
                self._send_requests()
                self.apply_arrivals()
                now = time.monotonic()
                if self._round_due:
                    # woken: a round now, but never two within min_interval (an emulator wakes
                    # this thread at every change: a round per change cost ~1 ms per call)
                    next_round = min(next_round, last_round + self._min_interval)
                if now >= next_round:
                    self._round_due = False
                    last_round = now
                    changed = self.poll_once()
                    interval = (self._min_interval if changed
                                else min(interval * 2, self._max_interval))
                    next_round = time.monotonic() + interval
            except BaseException:  # never let one bad poll strand every future
                logger.exception("batchfutures poller: poll failed; trying again")
                next_round = time.monotonic() + interval
            if self._finished():
                return
            delay = min(next_round - time.monotonic(),
                        self._ask_owner(lambda owner: owner.next_flush_delay(), math.inf))
            self._wake.wait(max(delay, 0.0))

    def _finished(self) -> bool:
        if not (self._stopping or self._owner() is None):
            return False
        with self._lock:
            idle = not self._jobs and not self._requests
        return idle and not self._ask_owner(lambda owner: owner.has_pending(), False)

    def _ended(self, error: Optional[BaseException]) -> None:
        """The thread is ending: if it was not asked to, fail every future it still tracks."""
        with self._lock:
            if self._thread is threading.current_thread():
                self._thread = None
            leftover = bool(self._jobs or self._requests)
            if error is not None:
                jobs, self._jobs = list(self._jobs.values()), {}
        if not leftover or error is not None:
            self._reader.close()  # its threads end; a new request makes new ones
        if error is None:
            if leftover:  # tracked between the last idle check and now: a new thread takes it
                self.start()
            return
        try:
            logger.error("batchfutures poller stopped (%r); failing the futures of %d job(s)",
                         error, len(jobs))
        except BaseException:  # noqa: B036 - a broken logger must not keep futures waiting
            pass
        for job in jobs:
            try:
                message = (f"the batchfutures polling thread stopped ({error!r}) while Batch job "
                           f"{job.job_id} was outstanding; the job may still run: "
                           f"executor.attach({job.job_id!r}) from a new executor collects it")
                job.fail_all(functools.partial(PollerStoppedError, message, job_id=job.job_id))
            except BaseException:  # noqa: B036 - the next job's futures still fail
                pass
        self._restart_for_unsent()

    def _restart_for_unsent(self) -> None:
        """After a crash, work tracked since, requests and buffered calls get a new thread.

        Calls still in the coalescing buffer were never sent: failing them would be wrong, and
        leaving them would strand their futures (only this thread flushes the buffer).
        """
        try:
            with self._lock:
                leftover = bool(self._jobs or self._requests)
            if leftover or self._ask_owner(lambda owner: owner.has_pending(), False):
                self.start()
        except BaseException:  # noqa: B036 - a later submit or result() starts one anyway
            pass

    def _batch(self) -> BatchAPI:
        getter = self._batch_getter()
        if getter is None:
            raise PollerStoppedError("the executor that owned this poller is gone")
        return getter()

    def _ask_owner(self, question: Callable[[PollerOwner], _Answer], default: _Answer) -> _Answer:
        """``question(owner)``, or ``default`` once the owner is gone or when it raised."""
        owner = self._owner()
        if owner is None:
            return default
        try:
            return question(owner)
        except Exception:
            logger.exception("batchfutures poller: asking its owner failed")
            return default

    # -- queued cancel / abort -------------------------------------------------------------------
    def _send_requests(self) -> None:
        with self._lock:
            pending, self._requests = self._requests, []
        if not pending:
            return
        batch = self._batch()
        # per job: {child: reason} to terminate, {child: reason} to cancel (the first reason)
        asked: Dict[str, Tuple[TrackedJob, Dict[int, str], Dict[int, str]]] = {}
        for request in pending:
            job, index = request.job, request.index
            job.drop_settled((index,))
            terminate, cancel = asked.setdefault(job.job_id, (job, {}, {}))[1:]
            (terminate if request.how is Stop.TERMINATE else cancel).setdefault(index,
                                                                                request.reason)
        calls: List[Tuple[Stop, str, str]] = []  # (how, job id, reason)
        for job, terminate, cancel in asked.values():
            # a stop of the whole job must not reach a child still wanted: any child outside
            # these whose futures are not all done (a TerminateJob kills it), or one of those
            # not started (a CancelJob stops it)
            others = [job.children[i] for i in range(job.size)
                      if i not in terminate and i not in cancel] if job.array else []
            calls += stop_calls(
                job.job_id, array=job.array, terminate=terminate, cancel=cancel,
                others_wanted=any(not f.done() for futures in others for f in futures),
                others_waiting=any(not f.done() and not f.running()
                                   for futures in others for f in futures),
                alone_refused=job.job_id in self._alone_refused)
        self._stop(batch, calls)

    def _stop(self, batch: BatchAPI, calls: List[Tuple[Stop, str, str]]) -> None:
        """CancelJob/TerminateJob of each (how, job id, reason): one CancelJobs or
        TerminateJobs per 50 jobs of one reason where Batch has them, not one call each.

        Children and whole jobs go in separate calls (a call refused as a whole then leaves the
        whole jobs' stops unharmed). A child the caller may not stop alone (`refused_alone`: the
        client policy's tag condition, see childstops.py) is logged once per job at INFO and
        not sent again: its futures are settled already, it runs on and its result is ignored.
        """
        grouped: Dict[Tuple[Stop, str, bool], List[str]] = {}
        for how, target, reason in calls:
            grouped.setdefault((how, reason, is_child(target)), []).append(target)
        for (how, reason, _), targets in grouped.items():
            for target, why in batchapi.stop_jobs(batch, how, targets, reason).items():
                code, message = getattr(why, "code", ""), getattr(why, "message", str(why))
                if not refused_alone(target, code, message):
                    logger.warning("batchfutures: could not %s Batch job %s: %s", how.verb,
                                   target, why)
                    continue
                parent = parent_of(target)
                if parent in self._alone_refused:
                    continue
                self._alone_refused.add(parent)
                logger.info(
                    "batchfutures: Batch refused to %s child %s alone (%s): a child of an array "
                    "job has no tags, and the stack's client policy stops only jobs tagged "
                    "batchfutures:stack. Its calls already ended here; it runs on and its result "
                    "is ignored. Other children of job %s are stopped only with the whole job "
                    "(when none of them is still wanted).", how.verb, target, code, parent)

    # -- one poll --------------------------------------------------------------------------------
    def poll_once(self) -> bool:
        """One round over every outstanding job; True when anything changed."""
        jobs = self.outstanding
        rerun = False
        for job in jobs:
            if job.waiting:
                rerun |= self._rerun_ready(job)
        self._forget([job for job in jobs if job.done])
        active = [job for job in jobs if job.unresolved]  # waiting children need no DescribeJobs
        if not active:
            return rerun
        self.polls += 1
        self._tails_left = LOG_TAILS_PER_POLL
        batch = self._batch()
        found: Dict[str, Mapping[str, Any]] = {}
        described: Set[str] = set()
        # a short request budget: this round describes the jobs described longest ago, as many
        # pages as it holds tokens for (one at least); the others wait for the next rounds
        budget = getattr(batch, "request_budget", None)
        pages = pages_this_round(math.ceil(len(active) / MAX_DESCRIBE_JOBS),
                                 math.inf if budget is None else budget.tokens())
        for job in active:
            self._described.setdefault(job.job_id, self.polls)  # new: as old as this round
        chosen = set(jobs_to_describe([job.job_id for job in active], self._described, pages))
        left_out = len(active) - len(chosen)
        active = [job for job in active if job.job_id in chosen]
        for start in range(0, len(active), MAX_DESCRIBE_JOBS):
            ids = [job.job_id for job in active[start:start + MAX_DESCRIBE_JOBS]]
            try:
                found.update((d["jobId"], d) for d in batchapi.describe_jobs(batch, ids,
                                                                     budget=batchapi.POLL_BUDGET))
            except Exception as error:  # these jobs wait for the next poll; the others go on
                logger.warning("batchfutures poller: DescribeJobs failed (%s); trying again", error)
                continue
            described.update(ids)
            self._described.update((job_id, self.polls) for job_id in ids)
        changed = bool(left_out)  # jobs still to describe: the next round comes soon
        for job in active:
            if job.job_id not in described:
                continue
            try:
                changed |= self.examine(job, found.get(job.job_id), batch)
            except BaseException as error:  # noqa: B036 - nothing is committed; next poll
                logger.warning("batchfutures poller: job %s not updated this poll: %r",
                               job.job_id, error)
        try:
            self.waits.observe(batch, {job_id: found[job_id] for job_id in described
                                       if job_id in found},
                               {job.job_id for job in jobs}, time.monotonic())
        except Exception:  # never into a future: the bar shows no reason instead
            logger.debug("batchfutures poller: why jobs wait not read", exc_info=True)
        self._forget([job for job in active if job.done])
        return changed or rerun

    @staticmethod
    def _rerun_ready(job: TrackedJob) -> bool:
        """Send again the children that waited for a retried upstream, now done (reruns.py)."""
        try:
            ready = job.ready_reruns()
        except BaseException as error:  # noqa: B036 - the poller survives anything
            logger.warning("batchfutures: job %s: could not check its waiting children: %r",
                           job.job_id, error)
            return False
        if not ready:
            return False
        assert job.rerun is not None  # only a job with a rerun hook has waiting children
        try:
            new = job.rerun(job, ready)
        except Exception as error:  # their futures fail with it; nothing waits in vain
            logger.warning("batchfutures: could not run %d child(ren) of %s again: %s",
                           len(ready), job.job_id, error)
            job.rerun_sent(ready, error)
            return True
        logger.info("batchfutures: %d child(ren) of %s failed for a dependency that was retried; "
                    "running them again as Batch job %s", len(ready), job.job_id, new.job_id)
        job.rerun_sent(ready)
        return True

    def examine(self, job: TrackedJob, description: Optional[Mapping[str, Any]], batch: BatchAPI, *,
                now: Optional[float] = None) -> bool:
        """Reconcile one job with Batch and storage, reading what reconcile asks for.

        A read that fails raises out of here before anything is committed, so the next poll
        sees the same change again. ``now``: a time.monotonic() value (tests pass their own).
        """
        now = time.monotonic() if now is None else now
        view = job.view(now, grace=self._grace,
                        check_interval=self.check_interval)
        reads = Reads(description)
        for _ in range(MAX_STEPS):
            step = reconcile(view, reads)
            if not step.needs:
                break
            self._read(job, step.needs, reads, batch)
        else:  # pragma: no cover - reconcile asks for each read once
            raise RuntimeError(f"reconcile of job {job.job_id} asked for reads without end")
        actions = step.actions
        self._stop(batch, [(Stop.CANCEL, target, reason) for target, reason in actions.cancel]
                   + [(Stop.TERMINATE, target, reason) for target, reason in actions.terminate])
        self._apply(job, actions)
        return actions.changed

    def _read(self, job: TrackedJob, needs: Needs, reads: Reads, batch: BatchAPI) -> None:
        for status in needs.listings:
            listed = batchapi.list_children(batch, job.job_id, status.value,
                                            budget=batchapi.POLL_BUDGET)
            reads.listings[status] = list(itertools.islice(listed, LISTING_LIMIT.get(status)))
        if needs.children:
            ids = [job.child_id(i) for i in needs.children]
            by_id = {d.get("jobId"): d
                     for d in batchapi.describe_jobs(batch, ids, budget=batchapi.POLL_BUDGET)}
            for index, child_id in zip(needs.children, ids):
                reads.children[index] = by_id.get(child_id) or {}  # {}: type it from its listing
        if needs.failed_nodes:
            reads.failed_nodes = list(batchapi.list_children(
                batch, job.job_id, JobStatus.FAILED.value, multinode=True,
                budget=batchapi.POLL_BUDGET))
        if needs.nodes:
            ids = [batchapi.node_id(job.job_id, i) for i in needs.nodes]
            by_id = {d.get("jobId"): d
                     for d in batchapi.describe_jobs(batch, ids, budget=batchapi.POLL_BUDGET)}
            for index, node in zip(needs.nodes, ids):
                reads.nodes[index] = by_id.get(node) or {}
        if needs.results:  # concurrently, waited for (a forgotten job, a multi-node job's nodes)
            for index, arrival in self._reader.read_now(job.job_url, needs.results).items():
                if isinstance(arrival, ReadFailed):
                    raise arrival.error  # nothing committed; the next poll reads again
                reads.results[index] = arrival
        if needs.stored:
            reads.stored = frozenset(self._storage.list_results(job.job_url, needs.stored_from))
        if needs.markers:  # failed children's out-of-memory markers (storage.oom_markers)
            reads.markers.update(self._storage.oom_markers(job.job_url, needs.markers))

    def _apply(self, job: TrackedJob, actions: Actions) -> None:
        tails = {index: self._tail(description) for index, description in actions.failed.items()}

        def failure_for(index: int, description: Mapping[str, Any]) -> BaseException:
            job_id = description.get("jobId") or job.child_id(index)
            error = classify_failure(description, job_id=job_id, log_tail=tails.get(index),
                                     memory_mib=job.memory_mib)
            if isinstance(error, DependencyFailedError) and error.__cause__ is None:
                error.__cause__ = _upstream_failure(job.children[index])
            return error

        def no_result_error(index: int) -> BaseException:
            return RemoteError(
                f"Batch job {job.child_id(index)} succeeded but wrote no result: the process "
                f"ended before the worker finished (for example os._exit(0) in the function).")

        def expired_error(index: int) -> BaseException:
            child_id = job.child_id(index)
            return JobMetadataExpired(
                f"Batch no longer knows job {child_id} ({BATCH_RETENTION}) and storage holds no "
                f"result for it.", job_id=child_id)

        def unplaceable_error(index: int, reason: str) -> BaseException:
            child_id = job.child_id(index)
            if job.retry is not None and index in job.retry.history:  # its memory was raised
                return job.retry.unplaceable_error(index, job.memory_mib, reason)
            asked = f" ({actions.requested})" if actions.requested else ""
            return JobUnplaceableError(
                f"Batch job {child_id}{asked} could not be placed: it waited RUNNABLE longer than "
                f"runnable_timeout={job.runnable_timeout:g}s and was cancelled. Batch's reason: "
                f"{reason}. Ask for fewer vCPUs, less memory or fewer GPUs, or use a job queue "
                f"whose compute environments can run it.",
                job_id=child_id, status_reason=reason)

        to_read = job.apply(actions, failure_for=failure_for, no_result_error=no_result_error,
                            expired_error=expired_error, unplaceable_error=unplaceable_error)
        self._reader.request(job, job.job_url, to_read)
        if actions.settles:
            logger.debug("batchfutures: job %s: %d child(ren) settled, %d open", job.job_id,
                         actions.settles, len(job.unresolved))

    def apply_arrivals(self, wait: bool = False) -> bool:
        """Settle the children whose results the reader brought back; True if any arrived.

        ``wait``: first wait until every requested read has arrived (tests, and the end of a
        run, use it)."""
        while wait and self._reader.busy:
            time.sleep(0.005)
        arrivals = self._reader.take()
        for job, found in arrivals.items():
            assert isinstance(job, TrackedJob)
            try:
                self._apply(job, arrived(found, array=job.array, open_=job.open_children))
            except BaseException as error:  # noqa: B036 - the next round reads them again
                logger.warning("batchfutures poller: results of job %s not settled: %r",
                               job.job_id, error)
                job.read_lost(found)
        self._forget([job for job in arrivals if isinstance(job, TrackedJob) and job.done])
        return bool(arrivals)

    def _tail(self, description: Mapping[str, Any]) -> Optional[str]:
        if self._log_tail is None or self._tails_left <= 0:
            return None
        self._tails_left -= 1
        log_tail = self._log_tail()
        if log_tail is None:
            return None
        try:  # its last LOG_TAIL_BYTES at most, held and put in the message (errors.py)
            return cut_log_tail(log_tail(description))
        except Exception as error:  # a missing log must not hide the job's failure
            logger.debug("no log tail for %s: %s", description.get("jobId"), error)
            return None

    def _forget(self, jobs: Iterable[TrackedJob]) -> None:
        with self._lock:
            for job in jobs:
                self._jobs.pop(job.job_id, None)
                self._described.pop(job.job_id, None)
                self._alone_refused.discard(job.job_id)



def pages_this_round(needed: int, tokens: float) -> int:
    """DescribeJobs pages a round sends: the ``needed`` ones while the request budget holds
    ``tokens`` for them, else as many as it holds, and one at least (every round moves)."""
    if needed <= 0:
        return 0
    return max(1, min(needed, math.floor(tokens) if math.isfinite(tokens) else needed))


def jobs_to_describe(job_ids: Sequence[str], described: Mapping[str, int],
                     pages: int) -> List[str]:
    """The ``pages`` x 100 jobs a round describes: those described longest ago first (a job
    never described counts from the round it was first seen), ties in tracking order; returned
    in tracking order. A job waits at most ceil(len(job_ids) / (pages x 100)) rounds, whatever
    is tracked after it."""
    order = sorted(range(len(job_ids)), key=lambda i: (described.get(job_ids[i], -1), i))
    return [job_ids[i] for i in sorted(order[:pages * MAX_DESCRIBE_JOBS])]


def _hold(fn: Optional[Callable], owner: Any) -> Callable[[], Any]:
    """A getter of ``fn``: weak when ``fn`` is a method of the owner (the poller must not keep it
    alive), strong otherwise. ``_hold(f, o)()`` is f, or None once the owner is gone."""
    if fn is not None and getattr(fn, "__self__", None) is owner:
        return weakref.WeakMethod(fn)
    return lambda: fn



def _upstream_failure(futures: List[Any]) -> Optional[BaseException]:
    """The exception of the first failed future these futures were given as arguments."""
    for future in futures:
        for upstream in getattr(future, "_upstream", None) or ():
            if upstream.done() and not upstream.cancelled() and upstream.exception() is not None:
                return upstream.exception()
    return None
