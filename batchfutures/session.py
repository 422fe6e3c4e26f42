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

import getpass
import logging
import math
import re
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from . import batchapi, logs, serialization
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
from .logs import log_group_of  # noqa: F401  (its old place)
from .poller import LOG_TAIL_LINES, Poller
from .settings import JobSettings

logger = logging.getLogger("batchfutures")

MAX_ARRAY_SIZE = 10_000
COALESCE_QUIET = 0.05  # flush a buffer once no call was added for this long...
COALESCE_MAX_AGE = 0.5  # ...or once its oldest call waited this long
_JOB_NAME_BAD = re.compile(r"[^A-Za-z0-9_-]+")


def job_name_for(fn: Any) -> str:
    """A Batch job name from a callable: letters, digits, '-' and '_', at most 128."""
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__
    name = _JOB_NAME_BAD.sub("-", str(name)).strip("-_") or "call"
    return f"bf-{name}"[:128]


@dataclass
class _Buffer:
    calls: List[Tuple[BatchFuture, Callable, tuple, dict]] = field(default_factory=list)
    first_at: float = 0.0
    last_at: float = 0.0


class Session:
    """What an executor and its views share: environment, storage, run, poller, buffers."""

    def __init__(self, env: Any) -> None:
        self.env = env
        self.storage = env.storage
        self.run_id = time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + "-" + uuid.uuid4().hex[:10]
        min_interval, max_interval = env.poll_intervals
        self.poller = Poller(self, min_interval=min_interval, max_interval=max_interval,
                             grace=env.describe_grace)
        self._lock = threading.RLock()
        self._buffers: Dict[JobSettings, _Buffer] = {}
        # id(fn) -> (fn kept alive so its id is not reused, its pickle). Cleared at every flush,
        # so a later batch sees the function's globals as they are then, as ProcessPoolExecutor.
        self._functions: Dict[int, Tuple[Any, bytes]] = {}
        self._queue_checked = False
        self._to_cancel: Dict[str, Tuple[TrackedJob, set]] = {}  # job id -> (job, child indices)
        self.closed = False
        self.submitted_jobs: List[str] = []
        subscribe = getattr(env, "subscribe", None)
        if subscribe is not None:
            subscribe(self.poller.wake)

    # -- submit and coalescing ---------------------------------------------------------------
    def submit(self, settings: JobSettings, fn: Callable, args: tuple, kwargs: dict) -> BatchFuture:
        self.pickled_function(fn)  # SerializationError now, before anything is uploaded
        serialization.pack_items([(0, args, kwargs)])
        future = BatchFuture(self)
        with self._lock:
            self._check_open()
            buffer = self._buffers.get(settings)
            now = time.monotonic()
            if buffer is None:
                buffer = self._buffers[settings] = _Buffer(first_at=now)
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
            return any(buffer.calls for buffer in self._buffers.values())

    def next_flush_delay(self) -> float:
        with self._lock:
            if not self._buffers:
                return math.inf
            now = time.monotonic()
            return min(
                min(b.last_at + COALESCE_QUIET, b.first_at + COALESCE_MAX_AGE) - now
                for b in self._buffers.values()
            )

    def flush_due(self) -> None:
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
            self._functions.clear()
        if buffer is None:
            return
        calls = [call for call in buffer.calls if not call[0].done()]  # skip cancelled, aborted
        if not calls:
            return
        functions: List[Callable] = []
        index_of: Dict[int, int] = {}
        calls_by_function = []
        for _, fn, args, kwargs in calls:
            if id(fn) not in index_of:
                index_of[id(fn)] = len(functions)
                functions.append(fn)
            calls_by_function.append((index_of[id(fn)], args, kwargs))
        futures = [[call[0]] for call in calls]
        try:  # one child per call
            blobs = [serialization.pack_items([call]) for call in calls_by_function]
            self.submit_job(settings, functions, blobs, [1] * len(blobs), futures, chunksize=1,
                            name=job_name_for(calls[0][1]))
        except BaseException as error:  # the futures carry the failure; nobody waits in vain
            failure = error if isinstance(error, BatchError) else _wrap_submit_error(error)
            for group in futures:
                for future in group:
                    settle(future, False, failure)
            if not isinstance(error, Exception):
                raise

    # -- one Batch job -----------------------------------------------------------------------
    def submit_job(self, settings: JobSettings, functions: Sequence[Callable],
                   blobs: List[bytes], item_counts: List[int],
                   futures: Sequence[List[BatchFuture]], *, chunksize: int, name: str,
                   encoding: str = serialization.CALLS, per_child: bool = False) -> TrackedJob:
        """Upload one Batch job's payload, submit it, and hand it to the poller.

        ``blobs`` holds each child's items (serialization's ``encoding``), ``item_counts`` how
        many; ``futures`` one list per child (one future per item, or with ``per_child`` one).
        """
        self._check_queue_once()
        try:
            function_urls = [self._function_url(fn) for fn in functions]
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

    def pickled_function(self, fn: Callable) -> bytes:
        """The callable's pickle, made once per function object and run."""
        with self._lock:
            known = self._functions.get(id(fn))
        if known is not None and known[0] is fn:
            return known[1]
        data = serialization.dumps(fn)
        with self._lock:
            self._functions[id(fn)] = (fn, data)
        return data

    def _function_url(self, fn: Callable) -> str:
        # content-addressed: the same pickle is uploaded once per run
        return self.storage.put_function(self.run_id, self.pickled_function(fn))

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

    # the log reader is batchfutures.logs; these keep the poller's and the futures' calls
    def log_stream(self, description: Dict[str, Any]) -> Optional[str]:
        return logs.log_stream(description)

    def log_group(self, description: Dict[str, Any]) -> str:
        return logs.log_group_of(description, self.env.log_group)

    def log_tail(self, description: Dict[str, Any]) -> Optional[str]:
        return logs.job_log_tail(self.env.logs, description, self.env.log_group,
                                 lines=LOG_TAIL_LINES)

    def read_log(self, future: BatchFuture) -> str:
        job_id = future.job_id
        if job_id is None:
            return ""
        found = batchapi.describe_jobs(self.env.batch, [job_id])
        if not found:
            raise JobMetadataExpired(f"Batch no longer knows job {job_id}; its log is gone with it",
                                     job_id=job_id)
        return logs.job_log(self.env.logs, found[0], self.env.log_group)

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
        if self.closed:
            raise RuntimeError("cannot schedule new futures after shutdown")

    def shutdown(self, wait: bool, cancel_futures: bool) -> None:
        with self._lock:
            self.closed = True
            if cancel_futures:
                for buffer in self._buffers.values():
                    for call in buffer.calls:
                        call[0].cancel()
        if cancel_futures:
            for job in self.poller.outstanding:
                for future in job.futures():
                    future.cancel()
        self.flush_all()
        if wait:
            for job in self.poller.outstanding:
                for future in job.futures():
                    try:
                        future.exception()
                    except BaseException:  # cancelled futures raise CancelledError
                        pass
        self.poller.stop(wait=wait)


# Batch retries when no rule matches, so the list ends with a catch-all EXIT: only a lost host
# is worth another attempt; an OOM kill, a crash or a timeout would fail the same way again.
RETRY_RULES = [
    {"onStatusReason": "Host EC2*", "action": "RETRY"},
    {"onReason": "OutOfMemoryError*", "action": "EXIT"},
    {"onStatusReason": "*", "action": "EXIT"},
]


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
