"""The Batch job as a whole: status, reason, times, children and log of one job id.

    describe(batch, job_id, logs=..., log_group=...)
        │ DescribeJobs [job_id] ─────────────> the job (a plain job, an array parent, or a child)
        │ ListJobs arrayJobId, per status  ──> each child's status, exit code, reason
        │   (only statuses the parent's statusSummary counts; every page)
        v
    JobInfo ── .log(index=None) ──> DescribeJobs [child] + GetLogEvents (the latest attempt)
            ── failed_calls(storage, info) ──> the result objects: calls whose function raised,
                                               and the usage each call's meta records
            ── .usage ──> job_usage(storage, info): usage.JobUsage (docs/usage.md)
                 calls: their cpu_s summed, their largest peak_memory_mib (result objects' meta)
                 reserved: the job's VCPU and MEMORY (jobdetail.resources of its container)
                   x its run time: an array's children's startedAt..stoppedAt (ListJobs: each
                   child's latest attempt), a plain job's attempts' (DescribeJobs), summed;
                   a child still running counts up to now

`describe` reads Batch only; `failed_calls` reads the result objects in storage (a job whose
function raised is SUCCEEDED for Batch: only storage knows). `BatchExecutor.job(job_id)` and
`batchfutures status` show the same object.
"""

from __future__ import annotations

import datetime
import functools
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple

from botocore.exceptions import ClientError

from . import batchapi, jobdetail, waiting, wire
from . import logs as logreader
from .batchapi import BatchAPI
from .errors import JobMetadataExpired
from .logs import LogsAPI, log_group_of
from .statuses import FINISHED, STATUS_ORDER
from .usage import JobUsage, Totals, run_seconds

if TYPE_CHECKING:
    from .environments import Environment
    from .storage import Storage

__all__ = ["JobInfo", "ChildInfo", "FailedCall", "CallFailures", "describe", "describe_in",
           "failed_calls", "job_usage", "not_found"]

DEFAULT_LOG_GROUP = "/aws/batch/job"
# status shows at most this many result objects' failed calls (one GET each)
MAX_RESULTS_READ = 1000


def _seconds(epoch_ms: Any) -> Optional[float]:
    """Batch's epoch milliseconds as epoch seconds; 0 or missing means "not yet"."""
    if not epoch_ms:
        return None
    return float(epoch_ms) / 1000.0


def iso(epoch: Optional[float]) -> Optional[str]:
    if epoch is None:
        return None
    return datetime.datetime.fromtimestamp(epoch, datetime.timezone.utc).isoformat(timespec="seconds")


def duration(start: Optional[float], stop: Optional[float], now: Optional[float] = None) -> Optional[float]:
    """Seconds from start to stop (or to now while it runs); None before it started."""
    if start is None:
        return None
    end = stop if stop is not None else now
    return None if end is None else max(0.0, end - start)


def not_found(job_id: str) -> JobMetadataExpired:
    return JobMetadataExpired(
        f"Batch does not know job {job_id!r} (never submitted, or its metadata expired)",
        job_id=job_id)


@dataclass(frozen=True)
class ChildInfo:
    """One child of an array job, as ListJobs summarises it."""

    index: int
    job_id: str
    status: str
    exit_code: Optional[int] = None
    status_reason: Optional[str] = None
    started_at: Optional[float] = None
    stopped_at: Optional[float] = None

    def as_dict(self) -> Dict[str, Any]:
        return {"index": self.index, "jobId": self.job_id, "status": self.status,
                "exitCode": self.exit_code, "statusReason": self.status_reason,
                "startedAt": iso(self.started_at), "stoppedAt": iso(self.stopped_at),
                "duration": duration(self.started_at, self.stopped_at)}


@dataclass
class JobInfo:
    """A Batch job (plain, array parent, or one array child) from DescribeJobs and ListJobs."""

    job_id: str
    name: str
    status: str
    status_reason: Optional[str] = None
    created_at: Optional[float] = None  # epoch seconds
    started_at: Optional[float] = None
    stopped_at: Optional[float] = None
    exit_code: Optional[int] = None  # a plain job's (or child's) last attempt
    container_reason: Optional[str] = None
    attempts: int = 0
    size: int = 0  # children of an array job; 0 for a plain job or a child
    array_index: Optional[int] = None  # set when job_id names one child "<id>:<i>"
    status_counts: Dict[str, int] = field(default_factory=dict)
    children: List[ChildInfo] = field(default_factory=list)
    job_url: Optional[str] = None  # where batchfutures keeps its payload, if it is ours
    log_stream: Optional[str] = None
    log_group: str = DEFAULT_LOG_GROUP
    vcpus: Optional[float] = None  # the job's VCPU (its container's, overrides included)
    memory_mib: Optional[int] = None  # its MEMORY
    # a plain job's (or child's) attempts, (startedAt, stoppedAt) epoch seconds, the one
    # running now included (stoppedAt None)
    attempt_spans: List[Tuple[Optional[float], Optional[float]]] = field(default_factory=list)
    _log_reader: Optional[Callable[[Optional[int]], str]] = field(default=None, repr=False,
                                                                  compare=False)
    _usage_reader: Optional[Callable[[], JobUsage]] = field(default=None, repr=False,
                                                            compare=False)
    _usage: Optional[JobUsage] = field(default=None, repr=False, compare=False)
    _waiting_reader: Optional[Callable[[], Any]] = field(default=None, repr=False, compare=False)

    @property
    def is_array(self) -> bool:
        return self.size > 0

    @property
    def ended(self) -> bool:
        return self.status in FINISHED

    @property
    def parent_id(self) -> str:
        return self.job_id.partition(":")[0]

    def duration(self, now: Optional[float] = None) -> Optional[float]:
        return duration(self.started_at, self.stopped_at, now)

    def run_seconds(self, now: Optional[float] = None) -> float:
        """The job's containers' run time summed: its children's (an array), else its attempts'
        (a child still running counts up to ``now``; not at all when ``now`` is None)."""
        if self.is_array:
            return run_seconds(((c.started_at, c.stopped_at) for c in self.children), now)
        return run_seconds(self.attempt_spans or [(self.started_at, self.stopped_at)], now)

    @property
    def usage(self) -> JobUsage:
        """What the job's calls used and what it reserved (a ``usage.JobUsage``): its calls'
        ``cpu_s`` summed, their largest ``peak_memory_mib``, and the vCPU-seconds and
        GiB-seconds of its VCPU and MEMORY over its children's run times. Read from storage on
        first use (one GET per result object, at most MAX_RESULTS_READ), then kept."""
        if self._usage is None:
            if self._usage_reader is None:
                raise RuntimeError("this JobInfo was made without storage to read usage from")
            self._usage = self._usage_reader()
        return self._usage

    @property
    def waiting(self) -> Optional[Any]:
        """Why a RUNNABLE job waits (a ``waiting.Waiting``: ``reason``, ``message``, its
        ``position`` among the first 100 RUNNABLE jobs of its queue), read from Batch when asked
        (GetJobQueueSnapshot, its queue and compute environments, its consumable resources);
        None when it is not RUNNABLE."""
        if self.status != "RUNNABLE" or self._waiting_reader is None:
            return None
        return self._waiting_reader()

    def log(self, index: Optional[int] = None) -> str:
        """The console output of the job's latest attempt; of child ``index`` for an array."""
        if self._log_reader is None:
            raise RuntimeError("this JobInfo was made without a log reader")
        if self.is_array and index is None:
            raise ValueError(f"job {self.job_id} is an array job of {self.size} children: "
                             f"name a child index")
        return self._log_reader(index)

    def as_dict(self) -> Dict[str, Any]:
        """A JSON-ready view (times in ISO 8601 UTC, durations in seconds)."""
        out: Dict[str, Any] = {
            "jobId": self.job_id, "jobName": self.name, "status": self.status,
            "statusReason": self.status_reason, "createdAt": iso(self.created_at),
            "startedAt": iso(self.started_at), "stoppedAt": iso(self.stopped_at),
            "duration": self.duration(), "attempts": self.attempts,
        }
        if self.is_array:
            out["size"] = self.size
            out["statusCounts"] = dict(self.status_counts)
            out["children"] = [child.as_dict() for child in self.children]
        else:
            out["exitCode"] = self.exit_code
            if self.container_reason:
                out["containerReason"] = self.container_reason
        if self.array_index is not None:
            out["arrayIndex"] = self.array_index
        return out


def job_url_of(description: Dict[str, Any]) -> Optional[str]:
    """The payload URL the worker command carries, when the job is one of batchfutures'."""
    command = (description.get("container") or {}).get("command") or []
    if command and "/runs/" in str(command[-1]) and "batchfutures.worker" in " ".join(map(str, command)):
        return str(command[-1])
    return None


def _child(summary: Dict[str, Any], parent_id: str) -> ChildInfo:
    index = int((summary.get("arrayProperties") or {}).get("index", -1))
    if index < 0:
        index = int(summary["jobId"].rpartition(":")[2])
    container = summary.get("container") or {}
    return ChildInfo(index=index, job_id=summary.get("jobId") or f"{parent_id}:{index}",
                     status=summary.get("status", ""), exit_code=container.get("exitCode"),
                     status_reason=summary.get("statusReason") or container.get("reason"),
                     started_at=_seconds(summary.get("startedAt")),
                     stopped_at=_seconds(summary.get("stoppedAt")))


def describe(batch_client: BatchAPI, job_id: str, *, logs: Optional[LogsAPI] = None,
             log_group: str = DEFAULT_LOG_GROUP, children: bool = True) -> JobInfo:
    """The job ``job_id`` (a plain job, an array job, or ``"<array id>:<index>"``) as a whole.

    One DescribeJobs, plus for an array (with ``children``) ListJobs per status its summary
    counts. ``logs`` (a CloudWatch Logs client) makes ``JobInfo.log()`` work. Raises
    JobMetadataExpired when Batch does not know the job.
    """
    found = batchapi.describe_jobs(batch_client, [job_id])
    if not found:
        raise not_found(job_id)
    description = found[0]
    container = jobdetail.last_container(description)
    array = description.get("arrayProperties") or {}
    size = int(array.get("size") or 0)
    parent_id, _, index_text = job_id.partition(":")
    info = JobInfo(
        job_id=description.get("jobId", job_id), name=description.get("jobName", ""),
        status=description.get("status", ""), status_reason=description.get("statusReason"),
        created_at=_seconds(description.get("createdAt")),
        started_at=_seconds(description.get("startedAt")),
        stopped_at=_seconds(description.get("stoppedAt")),
        exit_code=None if size else container.get("exitCode"),
        container_reason=None if size else container.get("reason"),
        attempts=jobdetail.attempt_count(description),
        size=size,
        array_index=int(index_text) if index_text.isdigit() else array.get("index"),
        status_counts={status: int((array.get("statusSummary") or {}).get(status, 0))
                       for status in STATUS_ORDER} if size else {},
        job_url=job_url_of(description),
        log_stream=jobdetail.log_stream(description),
        log_group=log_group_of(description, log_group),
    )
    reserved = jobdetail.resources(description.get("container") or {})
    info.vcpus, info.memory_mib = reserved.vcpus, reserved.memory_mib
    if not size:
        info.attempt_spans = _attempt_spans(description)
    if size and children:
        listed: Dict[int, ChildInfo] = {}
        wanted = [s for s in STATUS_ORDER if info.status_counts.get(s)] or list(STATUS_ORDER)
        for status in wanted:
            for summary in batchapi.list_children(batch_client, parent_id, status):
                child = _child(summary, parent_id)
                listed[child.index] = child
        info.children = [listed[i] for i in sorted(listed)]
    if logs is not None:
        info._log_reader = _log_reader(batch_client, logs, info, log_group)
    info._waiting_reader = functools.partial(waiting.look_up, batch_client, description)
    return info


def _attempt_spans(description: Dict[str, Any]) -> List[Tuple[Optional[float], Optional[float]]]:
    """(startedAt, stoppedAt) of each finished attempt, and of the one running now."""
    spans = [(_seconds(attempt.get("startedAt")), _seconds(attempt.get("stoppedAt")))
             for attempt in description.get("attempts") or [] if isinstance(attempt, dict)]
    started, stopped = _seconds(description.get("startedAt")), _seconds(description.get("stoppedAt"))
    if description.get("status") not in FINISHED and started is not None and stopped is None:
        last_stop = max((stop for _, stop in spans if stop is not None), default=None)
        if last_stop is None or started >= last_stop:  # the attempt running now
            spans.append((started, None))
    return spans


def describe_in(env: Environment, job_id: str, *, children: bool = True) -> JobInfo:
    """`describe` with an environment's clients (what `BatchExecutor.job` returns); its
    ``usage`` reads the environment's storage."""
    info = describe(env.batch, job_id, logs=env.logs, log_group=env.log_group, children=children)
    storage = env.storage
    info._usage_reader = lambda: job_usage(storage, info)
    return info


def _log_reader(batch_client: BatchAPI, logs_client: LogsAPI, info: JobInfo,
                default_group: str) -> Callable[[Optional[int]], str]:
    def read(index: Optional[int]) -> str:
        target = info.job_id if index is None else f"{info.parent_id}:{int(index)}"
        if index is not None and not 0 <= int(index) < info.size:
            raise ValueError(f"job {info.parent_id} has children 0 to {info.size - 1}, not {index}")
        found = batchapi.describe_jobs(batch_client, [target])
        if not found:
            raise not_found(target)
        stream = jobdetail.log_stream(found[0])
        if not stream:
            return ""
        group = log_group_of(found[0], default_group)
        try:
            return "\n".join(logreader.read_all(logs_client, group, stream))
        except ClientError as error:  # the stream is named before its first line arrives
            if batchapi.error_code(error) == "ResourceNotFoundException":
                return ""
            raise
    return read


# -- calls whose function raised (storage) ------------------------------------------------------
@dataclass(frozen=True)
class FailedCall:
    item: int  # the item's position in the job (map order)
    child: int
    error_type: str
    message: str

    def as_dict(self) -> Dict[str, Any]:
        return {"item": self.item, "child": self.child, "error": self.error_type,
                "message": self.message}


@dataclass
class CallFailures:
    """What the result objects read say about the job's calls."""

    calls_read: int = 0  # items whose outcome was read
    failed: List[FailedCall] = field(default_factory=list)
    results_skipped: int = 0  # result objects left unread (beyond the limit)
    usage: Totals = field(default_factory=Totals)  # the calls' usage read (docs/usage.md)
    chunksize: int = 1

    def as_dict(self) -> Dict[str, Any]:
        return {"callsRead": self.calls_read, "failedCalls": [f.as_dict() for f in self.failed],
                "resultsSkipped": self.results_skipped}


def failed_calls(storage: Storage, info: JobInfo, *, limit: int = MAX_RESULTS_READ) -> Optional[CallFailures]:
    """The calls of the job whose function raised, from its result objects (at most ``limit``).

    None when the job is not one of batchfutures' (no payload URL) or its payload is gone.
    """
    job_url = info.job_url or storage.read_job_pointer(info.parent_id)
    if not job_url:
        return None
    try:
        header = storage.read_header(job_url)
    except (FileNotFoundError, ValueError):
        return None
    chunksize = int(header.get("chunksize") or 1)
    if info.array_index is not None:
        indices = [info.array_index] if storage.has_result(job_url, info.array_index) else []
    else:
        indices = sorted(storage.list_results(job_url))
    report = CallFailures(results_skipped=max(0, len(indices) - limit), chunksize=max(1, chunksize))
    for child in indices[:limit]:
        data = storage.read_result(job_url, child)
        if data is None:
            continue
        try:
            meta, outcomes = wire.unpack_result(data)
        except ValueError as error:
            report.failed.append(FailedCall(child * chunksize, child, "RemoteError",
                                            f"the result object could not be read: {error}"))
            continue
        used = meta.get("usage")
        if isinstance(used, list):
            report.usage.add_raw(used[:len(outcomes)])
        for position, outcome in enumerate(outcomes):
            report.calls_read += 1
            if wire.outcome_kind(outcome) == wire.OK:
                continue
            _, raised = wire.outcome_result(outcome)
            report.failed.append(FailedCall(child * chunksize + position, child,
                                            type(raised).__name__, str(raised)))
    return report


def job_usage(storage: Storage, info: JobInfo, *, calls: Optional[CallFailures] = None,
              now: Optional[float] = None, limit: int = MAX_RESULTS_READ) -> JobUsage:
    """The job's usage (``JobInfo.usage``): its calls' from their result objects (``calls``:
    what failed_calls read already, else read now) and what it reserved from Batch's answer.

    A job still running counts its running children up to ``now`` (default: the time now).
    """
    if calls is None:
        try:
            calls = failed_calls(storage, info, limit=limit)
        except (FileNotFoundError, ValueError):
            calls = None
    totals = calls.usage if calls is not None else Totals()
    processes = 1
    if calls is not None and info.vcpus and info.vcpus >= 2 and calls.chunksize > 1:
        processes = min(int(info.vcpus), calls.chunksize)  # the inner pool (pool.py)
    return JobUsage.of(totals, info.vcpus, info.memory_mib,
                       info.run_seconds(time.time() if now is None else now),
                       processes=processes,
                       results_skipped=calls.results_skipped if calls is not None else 0,
                       ended=info.ended)
