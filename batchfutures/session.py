"""The job-state core an executor and its settings views share.

    submit(fn, *args) ──pickle now (SerializationError here)──> coalescing buffer per settings
                              │  flushed when the window closes, when full (10,000 children),
                              │  on result()/exception()/log() of one of its futures, on shutdown
                              v
    map slice / flushed buffer ──> _submit_job:
        1. the queue is checked once (ENABLED and VALID) before the first upload
        2. functions uploaded content-addressed, once per run
        3. one inputs object per Batch job (every child's items, indexed by byte range)
        4. SubmitJob carrying only the worker command and a pointer to the inputs
           (on failure the inputs are deleted: nothing half-made is left behind)
        5. a TrackedJob handed to the Poller, which settles the futures

A Session owns the storage, the run id, the poller thread and the buffers; executors are thin
layers that hold a Session and a JobSettings.
"""

from __future__ import annotations

import collections
import concurrent.futures
import getpass
import logging
import math
import re
import threading
import time
import uuid
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Deque, Dict, List, Optional, Tuple

from . import batchapi, serialization
from ._version import __version__
from .errors import (
    ABORT_REASON_PREFIX,
    BatchError,
    ConfigurationError,
    JobAbortedError,
    JobMetadataExpired,
    RemoteError,
)
from .futures import BatchFuture
from .jobs import TrackedJob, settle
from .poller import LOG_TAIL_LINES, Poller
from .settings import JobSettings

logger = logging.getLogger("batchfutures")

MAX_ARRAY_SIZE = 10_000
COALESCE_QUIET = 0.05  # flush a buffer once no call was added for this long...
COALESCE_MAX_AGE = 0.5  # ...or once its oldest call waited this long
PACING_RECHECK = 1.0  # with max_workers: look at free workers at least this often
_JOB_NAME_BAD = re.compile(r"[^A-Za-z0-9_-]+")


def job_name_for(fn: Any) -> str:
    """A Batch job name from a callable: letters, digits, '-' and '_', at most 128."""
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__
    name = _JOB_NAME_BAD.sub("-", str(name)).strip("-_") or "call"
    return f"bf-{name}"[:128]


@dataclass
class _Buffer:
    """Calls with the same settings waiting to be sent together as one array job."""

    calls: List[Tuple[BatchFuture, Callable, tuple, dict]] = field(default_factory=list)
    # id(fn) -> (fn, its pickle): made once per function and batch, gone with the batch, so
    # nothing keeps a callable alive once its calls were sent
    pickles: Dict[int, Tuple[Callable, bytes]] = field(default_factory=dict)
    first_at: float = 0.0
    last_at: float = 0.0


@dataclass
class _PendingJob:
    """Children ready to be submitted, waiting for free workers (``max_workers``)."""

    settings: JobSettings
    function_pickles: List[bytes]
    blobs: List[bytes]
    item_counts: List[int]
    futures: List[List[BatchFuture]]
    chunksize: int
    name: str
    encoding: str
    per_child: bool

    def take(self, count: int) -> "_PendingJob":
        """The first ``count`` children as a job of their own; this one keeps the rest."""
        part = _PendingJob(self.settings, self.function_pickles, self.blobs[:count],
                           self.item_counts[:count], self.futures[:count], self.chunksize,
                           self.name, self.encoding, self.per_child)
        del self.blobs[:count], self.item_counts[:count], self.futures[:count]
        return part


def _wanted(group: List[BatchFuture]) -> bool:
    return any(not future.done() for future in group)


_live_sessions: "weakref.WeakSet[Session]" = weakref.WeakSet()
_interpreter_exiting = False


def _at_interpreter_exit() -> None:
    """As concurrent.futures does: buffered calls are sent, local jobs are waited for."""
    global _interpreter_exiting
    _interpreter_exiting = True
    for session in list(_live_sessions):
        try:
            session.finish_at_exit()
        except Exception:  # one session must not keep the others' calls from being sent
            logger.exception("batchfutures: could not finish an executor at interpreter exit")


# Runs before non-daemon threads are joined and before atexit handlers (the emulator closes in
# one), as concurrent.futures.process registers its own exit hook.
_register_atexit = getattr(threading, "_register_atexit", None)
if _register_atexit is not None:
    _register_atexit(_at_interpreter_exit)
else:  # pragma: no cover - Python without threading._register_atexit
    import atexit

    atexit.register(_at_interpreter_exit)


class Session:
    """What an executor and its views share: environment, storage, run, poller, buffers."""

    def __init__(self, env: Any, *, max_workers: Optional[int] = None,
                 initializer: Optional[Callable[..., Any]] = None, initargs: tuple = (),
                 ship_local_modules: bool = True) -> None:
        self.env = env
        self.max_workers = max_workers
        self.by_value = ship_local_modules
        # pickled now: an initializer that cannot travel fails here, not at the first submit
        self._initializer = None if initializer is None else serialization.dumps(
            (initializer, initargs), what=f"the initializer {initializer!r} and its initargs",
            by_value=ship_local_modules)
        self._initializer_url: Optional[str] = None
        self.storage = env.storage
        self.run_id = time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + "-" + uuid.uuid4().hex[:10]
        min_interval, max_interval = env.poll_intervals
        self.poller = Poller(self, min_interval=min_interval, max_interval=max_interval,
                             grace=env.describe_grace)
        self._lock = threading.RLock()
        self._buffers: Dict[JobSettings, _Buffer] = {}
        # max_workers: children wait here until submitting them keeps at most max_workers of
        # this session's children unfinished; the poller submits them as others finish
        self._pending: Deque[_PendingJob] = collections.deque()
        self._in_flight: List[List[List[BatchFuture]]] = []  # per paced job: its children's futures
        self._pace_lock = threading.Lock()
        self._cancelled_at_shutdown = False
        self._queue_checked = False
        self._to_cancel: Dict[str, Tuple[TrackedJob, set]] = {}  # job id -> (job, child indices)
        self.closed = False
        self.submitted_jobs: List[str] = []
        _live_sessions.add(self)
        subscribe = getattr(env, "subscribe", None)
        if subscribe is not None:
            subscribe(self.poller.wake)

    # -- submit and coalescing ---------------------------------------------------------------
    def submit(self, settings: JobSettings, fn: Callable, args: tuple, kwargs: dict) -> BatchFuture:
        self._check_open()
        with self._lock:
            buffer = self._buffers.get(settings)
            known = buffer.pickles.get(id(fn)) if buffer is not None else None
        # SerializationError now, before anything is uploaded
        pickled = known[1] if known is not None and known[0] is fn else \
            serialization.dumps(fn, by_value=self.by_value)
        serialization.pack_items([(0, args, kwargs)], by_value=self.by_value)
        future = BatchFuture(self)
        with self._lock:
            self._check_open()
            buffer = self._buffers.get(settings)
            now = time.monotonic()
            if buffer is None:
                buffer = self._buffers[settings] = _Buffer(first_at=now)
            buffer.pickles.setdefault(id(fn), (fn, pickled))
            buffer.calls.append((future, fn, args, kwargs))
            buffer.last_at = now
            full = len(buffer.calls) >= MAX_ARRAY_SIZE
        if full:
            self.flush(settings)
        else:
            self.poller.start()
            self.poller.wake()
        return future

    def has_pending(self) -> bool:
        with self._lock:
            return bool(self._pending) or any(buffer.calls for buffer in self._buffers.values())

    def next_flush_delay(self) -> float:
        with self._lock:
            if self._pending:  # woken when a paced child finishes; this is only a safety net
                return PACING_RECHECK
            if not self._buffers:
                return math.inf
            now = time.monotonic()
            return min(
                min(b.last_at + COALESCE_QUIET, b.first_at + COALESCE_MAX_AGE) - now
                for b in self._buffers.values()
            )

    def flush_due(self) -> None:
        """On the poller thread: send the buffers whose window closed, and paced children."""
        self.submit_paced()
        now = time.monotonic()
        with self._lock:
            due = [s for s, b in self._buffers.items()
                   if now >= min(b.last_at + COALESCE_QUIET, b.first_at + COALESCE_MAX_AGE)]
        for settings in due:
            self.flush(settings)

    def flush_all(self) -> None:
        with self._lock:
            pending = list(self._buffers)
        for settings in pending:
            self.flush(settings)

    def flush_for(self, future: BatchFuture) -> None:
        """Send the buffer holding ``future`` now: its caller is waiting for it."""
        if future._job is not None:
            return
        with self._lock:
            target = next((s for s, b in self._buffers.items()
                           if any(call[0] is future for call in b.calls)), None)
        if target is not None:
            self.flush(target)

    def flush(self, settings: JobSettings) -> None:
        with self._lock:
            buffer = self._buffers.pop(settings, None)
        if buffer is None:
            return
        calls = [call for call in buffer.calls if not call[0].done()]  # skip cancelled, aborted
        pickles = buffer.pickles
        del buffer
        if not calls:
            return
        function_pickles: List[bytes] = []
        index_of: Dict[int, int] = {}
        blobs: List[bytes] = []
        futures: List[List[BatchFuture]] = []
        for future, fn, args, kwargs in calls:  # one child per call
            if id(fn) not in index_of:
                index_of[id(fn)] = len(function_pickles)
                function_pickles.append(pickles[id(fn)][1])
            blobs.append(serialization.pack_items([(index_of[id(fn)], args, kwargs)],
                                                  by_value=self.by_value))
            futures.append([future])
        name = job_name_for(calls[0][1])
        del calls, pickles  # the callables and arguments now live only in their pickles
        try:
            self.submit_job(settings, function_pickles, blobs, [1] * len(blobs), futures,
                            chunksize=1, name=name)
        except BaseException as error:  # the futures carry the failure; nobody waits in vain
            _fail_all(futures, error)
            if not isinstance(error, Exception):
                raise

    # -- one Batch job -----------------------------------------------------------------------
    def submit_job(self, settings: JobSettings, function_pickles: List[bytes],
                   blobs: List[bytes], item_counts: List[int],
                   futures: List[List[BatchFuture]], *, chunksize: int, name: str,
                   encoding: str = serialization.CALLS, per_child: bool = False) -> None:
        """Submit one Batch job's children now, or with ``max_workers`` as workers free up.

        ``blobs`` holds each child's items (serialization's ``encoding``), ``item_counts`` how
        many; ``futures`` one list per child (one future per item, or with ``per_child`` one).
        """
        # copies: taking children off a waiting job must not change the caller's lists
        job = _PendingJob(settings, function_pickles, list(blobs), list(item_counts),
                          list(futures), chunksize, name, encoding, per_child)
        if self.max_workers is None:
            self._submit_now(job)
            return
        with self._lock:
            self._pending.append(job)
        self.poller.start()
        self.submit_paced(raise_errors=True)

    def submit_paced(self, *, raise_errors: bool = False) -> None:
        """Submit waiting children while fewer than ``max_workers`` are unfinished.

        Children are taken from the head of the queue in submission order, as many as there
        are free workers, so one Batch job carries every child that may start now.
        """
        if self.max_workers is None:
            return
        with self._pace_lock:  # one submitter at a time: the count of free workers stays true
            while True:
                with self._lock:
                    if not self._pending:
                        return
                    free = self.max_workers - self._unfinished_children()
                    if free <= 0:
                        return
                    head = self._pending[0]
                    part = head.take(min(free, MAX_ARRAY_SIZE))
                    if not head.blobs:
                        self._pending.popleft()
                    wanted = [i for i, group in enumerate(part.futures) if _wanted(group)]
                    if len(wanted) < len(part.futures):  # cancelled while waiting: not sent
                        part = _PendingJob(part.settings, part.function_pickles,
                                           [part.blobs[i] for i in wanted],
                                           [part.item_counts[i] for i in wanted],
                                           [part.futures[i] for i in wanted], part.chunksize,
                                           part.name, part.encoding, part.per_child)
                    if not part.blobs:
                        continue
                    self._in_flight.append(part.futures)
                for group in part.futures:  # a finished child frees a worker: submit the next
                    for future in group:
                        future.add_done_callback(self._wake_poller)
                try:
                    self._submit_now(part)
                except BaseException as error:
                    _fail_all(part.futures, error)
                    if raise_errors or not isinstance(error, Exception):
                        raise
                    logger.warning("batchfutures: could not submit %d waiting children: %s",
                                   len(part.futures), error)

    def _unfinished_children(self) -> int:
        self._in_flight = [job for job in self._in_flight if any(_wanted(g) for g in job)]
        return sum(1 for job in self._in_flight for group in job if _wanted(group))

    def _wake_poller(self, _future: BatchFuture) -> None:
        self.poller.wake()

    def _submit_now(self, job: _PendingJob) -> TrackedJob:
        """Upload one Batch job's payload, submit it, and hand it to the poller."""
        settings, blobs, item_counts, futures = job.settings, job.blobs, job.item_counts, job.futures
        chunksize, name, encoding, per_child = job.chunksize, job.name, job.encoding, job.per_child
        self._check_queue_once()
        try:
            function_urls = [self.storage.put_function(self.run_id, data)  # content-addressed
                             for data in job.function_pickles]
        except (FileNotFoundError, PermissionError) as error:
            raise _storage_error(self.storage, error) from error
        job_key = uuid.uuid4().hex
        job_url = self.storage.job_url(self.run_id, job_key)
        items = sum(item_counts)
        header = {
            "functions": function_urls,
            "children": len(blobs),
            "items": items,
            "chunksize": chunksize,
            "encoding": encoding,
            "run_id": self.run_id,
            "job_key": job_key,
        }
        if self._initializer is not None:
            header["initializer"] = self._initializer_location()
        header.update(serialization.payload_stamp())  # the worker checks its versions against these
        try:
            self.storage.write_inputs(job_url, header, blobs)
        except (FileNotFoundError, PermissionError) as error:
            raise _storage_error(self.storage, error) from error
        memory = settings.memory_mib(self.env.definition_memory())
        request = self._request(settings, name, job_url, len(blobs), memory)
        try:
            response = batchapi.submit_job(self.env.batch, request)
        except Exception as error:
            self.storage.delete_job(job_url)
            raise _wrap_submit_error(error) from error
        job_id = response["jobId"]
        try:
            self.storage.write_job_pointer(job_id, job_url)
        except Exception:  # only attach-after-expiry needs it; the job itself is fine
            logger.warning("batchfutures: could not record the storage pointer of job %s", job_id)
        job = TrackedJob(job_id, job_url, futures, array=len(blobs) > 1, memory_mib=memory,
                         item_counts=item_counts if per_child else None)
        with self._lock:
            self.submitted_jobs.append(job_id)
        logger.debug("submitted Batch job %s (%d children, %d items)", job_id, len(blobs), items)
        self.poller.track(job)
        return job

    def _request(self, settings: JobSettings, name: str, job_url: str, size: int,
                 memory: int) -> Dict[str, Any]:
        resources = [
            {"type": "VCPU", "value": _number(settings.vcpus)},
            {"type": "MEMORY", "value": str(memory)},
        ]
        if settings.gpus:
            resources.append({"type": "GPU", "value": str(settings.gpus)})
        overrides: Dict[str, Any] = {
            "command": self.env.worker_command(job_url),
            "resourceRequirements": resources,
        }
        if settings.environment:
            overrides["environment"] = [{"name": k, "value": v} for k, v in settings.environment]
        tags = {
            "batchfutures:run": self.run_id,
            "batchfutures:user": _user(),
            "batchfutures:version": __version__,
        }
        tags.update(dict(settings.tags))
        request: Dict[str, Any] = {
            "jobName": name,
            "jobQueue": self.env.job_queue,
            "jobDefinition": self.env.job_definition,
            "containerOverrides": overrides,
            "retryStrategy": {"attempts": settings.retries, "evaluateOnExit": RETRY_RULES},
            "tags": tags,
            "propagateTags": True,
        }
        if size > 1:
            request["arrayProperties"] = {"size": size}
        if settings.timeout is not None:
            request["timeout"] = {"attemptDurationSeconds": max(1, int(math.ceil(settings.timeout)))}
        if settings.share_id is not None:
            request["shareIdentifier"] = settings.share_id
        if settings.priority is not None:
            request["schedulingPriorityOverride"] = settings.priority
        return request

    def _check_queue_once(self) -> None:
        if self._queue_checked:
            return
        self.env.check_queue()
        self._queue_checked = True

    def _initializer_location(self) -> str:
        if self._initializer_url is None:
            try:
                self._initializer_url = self.storage.put_function(self.run_id, self._initializer)
            except (FileNotFoundError, PermissionError) as error:
                raise _storage_error(self.storage, error) from error
        return self._initializer_url

    # -- results, logs, cancel, abort --------------------------------------------------------
    def decode_result(self, data: bytes, count: int) -> List[Tuple[bool, Any]]:
        try:
            _, outcomes = serialization.unpack_result(data)
        except ValueError as error:  # truncated or foreign: every item of the child fails
            return [(False, RemoteError(f"the result object could not be read: {error}"))] * count
        decoded = [serialization.outcome_result(outcome) for outcome in outcomes]
        if len(decoded) < count:  # a truncated result never passes for a complete one
            decoded += [(False, BatchError("the worker recorded no outcome for this item"))] * (
                count - len(decoded))
        return decoded

    def log_stream(self, description: Dict[str, Any]) -> Optional[str]:
        attempts = description.get("attempts") or []
        for attempt in reversed(attempts):
            stream = (attempt.get("container") or {}).get("logStreamName")
            if stream:
                return stream
        return (description.get("container") or {}).get("logStreamName")

    def log_group(self, description: Dict[str, Any]) -> str:
        return log_group_of(description, self.env.log_group)

    def log_tail(self, description: Dict[str, Any]) -> Optional[str]:
        stream = self.log_stream(description)
        if not stream:
            return None
        try:
            lines = batchapi.read_log(self.env.logs, self.log_group(description), stream,
                                      limit_events=LOG_TAIL_LINES)
        except Exception as error:  # a missing log must not hide the job's failure
            logger.debug("no log tail for %s: %s", description.get("jobId"), error)
            return None
        return "\n".join(lines) or None

    def read_log(self, future: BatchFuture) -> str:
        job_id = future.job_id
        if job_id is None:
            return ""
        found = batchapi.describe_jobs(self.env.batch, [job_id])
        if not found:
            raise JobMetadataExpired(f"Batch no longer knows job {job_id}; its log is gone with it",
                                     job_id=job_id)
        description = found[0]
        stream = self.log_stream(description)
        if not stream:
            return f"(no log yet: job {job_id} is {description.get('status')})"
        return "\n".join(batchapi.read_log(self.env.logs, self.log_group(description), stream))

    def on_cancelled(self, future: BatchFuture) -> None:
        """A future was cancelled: its remote child is cancelled once none of its items is wanted.

        The CancelJob calls are made by the poller, in bulk: when every unfinished child of a
        job is cancelled, one call on the job itself replaces one per child.
        """
        job = future._job
        if job is None:
            return  # still buffered: the flush skips it
        if all(f.cancelled() for f in job.children[future._child]):
            with self._lock:
                self._to_cancel.setdefault(job.job_id, (job, set()))[1].add(future._child)
            self.poller.wake()

    def send_cancellations(self) -> None:
        with self._lock:
            pending, self._to_cancel = self._to_cancel, {}
        reason = f"{ABORT_REASON_PREFIX} cancelled by the client"
        for job, indices in pending.values():
            # children a CancelJob on the whole job would wrongly stop: still wanted, not started
            wanted = [i for i in range(job.size) if i not in indices and
                      any(not f.done() and not f.running() for f in job.children[i])]
            targets = [job.job_id] if not wanted or not job.array else \
                [job.child_id(i) for i in sorted(indices)]
            for target in targets:
                try:
                    batchapi.call(self.env.batch.cancel_job, jobId=target, reason=reason)
                except Exception as error:
                    logger.warning("batchfutures: could not cancel Batch job %s: %s", target, error)

    def abort(self, future: BatchFuture, reason: str) -> bool:
        if future.done():
            return False
        text = f"{ABORT_REASON_PREFIX} {reason}"
        job = future._job
        if job is None:
            error = JobAbortedError(f"the call was aborted before it was submitted: {reason}",
                                    status_reason=text)
            return settle(future, False, error)
        child_id = job.child_id(future._child)
        batchapi.call(self.env.batch.terminate_job, jobId=child_id, reason=text)
        error_fields = dict(job_id=child_id, status_reason=text)
        for sibling in job.children[future._child]:
            settle(sibling, False, JobAbortedError(
                f"Batch job {child_id} was terminated on request: {reason}", **error_fields))
        job.unresolved.discard(future._child)
        return True

    # -- attach ------------------------------------------------------------------------------
    def attach(self, job_id: str) -> List[BatchFuture]:
        parent_id, _, child = job_id.partition(":")
        found = batchapi.describe_jobs(self.env.batch, [parent_id])
        job_url = None
        if found:
            command = (found[0].get("container") or {}).get("command") or []
            job_url = command[-1] if command else None
        if job_url is None:
            job_url = self.storage.read_job_pointer(parent_id)
        if job_url is None:
            raise JobMetadataExpired(
                f"Batch does not know job {parent_id} and storage has no record of it", job_id=job_id)
        header = self.storage.read_header(job_url)
        children, items, chunksize = header["children"], header["items"], header["chunksize"]
        futures = [
            [BatchFuture(self) for _ in range(min(chunksize, items - i * chunksize))]
            for i in range(children)
        ]
        job = TrackedJob(parent_id, job_url, futures, array=children > 1,
                         submitted_at=time.monotonic() - 1e9)  # no grace: the job is old
        if child:
            wanted = int(child)
            if not 0 <= wanted < children:
                raise ConfigurationError(f"job {parent_id} has no child {wanted}")
            for index in range(children):
                if index != wanted:
                    job.unresolved.discard(index)
            selected = futures[wanted]
        else:
            selected = [f for group in futures for f in group]
        self.poller.track(job)
        return selected

    # -- shutdown ----------------------------------------------------------------------------
    def _check_open(self) -> None:
        if _interpreter_exiting:
            raise RuntimeError("cannot schedule new futures after interpreter shutdown")
        if self.closed:
            raise RuntimeError("cannot schedule new futures after shutdown")

    def _unfinished_futures(self) -> List[BatchFuture]:
        with self._lock:
            waiting = [f for job in self._pending for group in job.futures for f in group]
        tracked = [f for job in self.poller.outstanding for f in job.futures()]
        return [f for f in waiting + tracked if not f.done()]

    def shutdown(self, wait: bool, cancel_futures: bool) -> None:
        with self._lock:
            self.closed = True
            if cancel_futures:
                self._cancelled_at_shutdown = True
                for buffer in self._buffers.values():
                    for call in buffer.calls:
                        call[0].cancel()
                for job in self._pending:  # never sent: nothing remote to cancel
                    for group in job.futures:
                        for future in group:
                            future.cancel()
        if cancel_futures:
            for future in self._unfinished_futures():
                future.cancel()
        self.flush_all()
        if wait:
            # a KeyboardInterrupt here propagates: Ctrl-C is never swallowed
            concurrent.futures.wait(self._unfinished_futures())
        self.poller.stop(wait=wait)

    def interrupt(self) -> None:
        """Ctrl-C left the executor: stop every unfinished job of this session, promptly.

        Calls not yet sent are cancelled; jobs Batch has are cancelled (not started) or
        terminated (running), one call per Batch job; the job ids are logged once.
        """
        with self._lock:
            self.closed = True
            self._cancelled_at_shutdown = True
            buffered = [call[0] for buffer in self._buffers.values() for call in buffer.calls]
            self._buffers.clear()
            waiting = [f for job in self._pending for group in job.futures for f in group]
            self._pending.clear()
        for future in buffered + waiting:
            future.cancel()
        jobs = [job for job in self.poller.outstanding
                if any(not f.done() for f in job.futures())]
        if jobs:
            logger.warning("batchfutures: interrupted; stopping %d Batch job(s): %s", len(jobs),
                           ", ".join(job.job_id for job in jobs))
        reason = f"{ABORT_REASON_PREFIX} interrupted by the client (KeyboardInterrupt)"
        for job in jobs:
            try:  # TerminateJob on an array's parent stops its children too
                batchapi.call(self.env.batch.terminate_job, jobId=job.job_id, reason=reason,
                              attempts=2, max_delay=2.0)
            except Exception as error:
                logger.warning("batchfutures: could not stop Batch job %s: %s", job.job_id, error)
            error = JobAbortedError(f"Batch job {job.job_id} was stopped: the client was interrupted",
                                    job_id=job.job_id, status_reason=reason)
            for future in job.futures():
                settle(future, False, error)
        self.poller.stop(wait=False)

    def finish_at_exit(self) -> None:
        """At interpreter exit: send buffered calls; wait for local jobs, or name AWS ones."""
        self.flush_all()
        self.submit_paced()
        if self._cancelled_at_shutdown:
            return
        unfinished = self._unfinished_futures()
        if not unfinished:
            return
        from .environments import LocalEnvironment

        if isinstance(self.env, LocalEnvironment):
            # the emulator's jobs die with this process, so wait, as ProcessPoolExecutor does
            concurrent.futures.wait(unfinished)
            return
        jobs = sorted({f._job.job_id for f in unfinished if f._job is not None})
        logger.warning(
            "batchfutures: the interpreter exits while %d Batch job(s) still run; they go on in "
            "Batch. Collect their results later with BatchExecutor(env).attach(job_id): %s",
            len(jobs), ", ".join(jobs))


# `retries` means retries: Batch tries a failed attempt again when no rule matches, so a crash
# (non-zero exit), a lost host, a Spot interruption and Batch's transient start failures (Task
# failed to start, CannotPullContainer, ResourceInitializationError) are retried by default.
# What would fail the same way again exits: an out-of-memory kill, a timeout (Batch itself does
# not retry those) and a termination this client asked for. An exception raised by the function
# is an outcome, not a failure: the worker exits 0. At most 5 rules (Batch's limit).
RETRY_RULES = [
    {"onReason": "OutOfMemoryError*", "action": "EXIT"},
    {"onStatusReason": "Job attempt duration exceeded timeout*", "action": "EXIT"},
    {"onStatusReason": f"{ABORT_REASON_PREFIX}*", "action": "EXIT"},
]


def log_group_of(description: Dict[str, Any], default: str) -> str:
    """A job's log group: the awslogs-group its definition sets, else Batch's default group."""
    config = (description.get("container") or {}).get("logConfiguration") or {}
    if config.get("logDriver", "awslogs") == "awslogs":
        group = (config.get("options") or {}).get("awslogs-group")
        if group:
            return group
    return default


def _fail_all(futures: List[List[BatchFuture]], error: BaseException) -> None:
    failure = error if isinstance(error, BatchError) else _wrap_submit_error(error)
    for group in futures:
        for future in group:
            settle(future, False, failure)


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def _user() -> str:
    try:
        return _JOB_NAME_BAD.sub("-", getpass.getuser())[:64] or "unknown"
    except Exception:
        return "unknown"


def _storage_error(storage: Any, error: BaseException) -> ConfigurationError:
    return ConfigurationError(
        f"cannot write job payloads to {storage.root_url}: {error}. Check that the bucket (or "
        f"folder) exists and that these credentials may write to it.")


def _wrap_submit_error(error: BaseException) -> BaseException:
    if isinstance(error, BatchError):
        return error
    code = batchapi.error_code(error)
    if code == "ClientException":
        message = error.response.get("Error", {}).get("Message", str(error))
        return ConfigurationError(f"Batch rejected the job: {message}")
    return error
