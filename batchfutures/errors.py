"""Typed errors, and how a failed Batch job is classified into one of them.

    BatchError(Exception)
    ├── ConfigurationError(BatchError, ValueError)
    │   └── EnvironmentBuildError(ConfigurationError)  requirements= not prepared (no wheel...)
    ├── SerializationError(BatchError, pickle.PicklingError)
    ├── EnvironmentMismatchError(BatchError)
    ├── RemoteError(BatchError)
    ├── JobMetadataExpired(BatchError)
    ├── InitializerFailedError(BatchError, concurrent.futures.BrokenExecutor)
    ├── DryRunResult(BatchError)          what a dry-run future raises: .requests, .objects
    ├── IntegrityError(BatchError)        a stored object's seal does not check
    ├── PollerStoppedError(BatchError)
    ├── BudgetExceededError(BatchError)   max_cost reached: this call was never sent
    └── JobFailedError(BatchError)
        ├── MemoryLimitExceeded(JobFailedError)
        ├── JobTimeoutError(JobFailedError)
        ├── JobAbortedError(JobFailedError)
        ├── HostTerminatedError(JobFailedError)
        ├── DependencyFailedError(JobFailedError)
        └── JobUnplaceableError(JobFailedError)

`classify_failure` reads a FAILED job description (the dict DescribeJobs returns) and builds the
exception a future raises. Batch's own fields decide the type, so the emulator and AWS are
classified by the same code:

    OutOfMemoryError... (container reason or statusReason)    -> MemoryLimitExceeded
    exit code 137, no such reason, and the worker's out-of-memory marker (a MemoryError: no
      kernel kill, so no reason; see wants_oom_marker)         -> MemoryLimitExceeded
    "Job attempt duration exceeded timeout"                    -> JobTimeoutError
    "Host EC2 (instance ...) terminated.", "Your Spot Task was interrupted."
                                                               -> HostTerminatedError
    "Dependent Job failed"                                     -> DependencyFailedError
    "Canceled by JobStateTimeLimit action due to reason: X"    -> JobUnplaceableError (.reason X)
    isCancelled / isTerminated, or our own "batchfutures:" reason -> JobAbortedError
    anything else (Batch's reason kept)                        -> JobFailedError
"""

from __future__ import annotations

import concurrent.futures
import pickle
from typing import Any, Callable, Dict, Mapping, Optional

from .batchlimits import OOM_EXIT_STATUS
from .jobdetail import attempt_count, last_attempt, last_container, resources

__all__ = [
    "BatchError",
    "ConfigurationError",
    "SerializationError",
    "EnvironmentMismatchError",
    "EnvironmentBuildError",
    "RemoteError",
    "JobMetadataExpired",
    "InitializerFailedError",
    "DryRunResult",
    "DependencyFailedError",
    "JobFailedError",
    "MemoryLimitExceeded",
    "JobTimeoutError",
    "JobAbortedError",
    "HostTerminatedError",
    "IntegrityError",
    "JobUnplaceableError",
    "PollerStoppedError",
    "BudgetExceededError",
    "classify_failure",
    "wants_oom_marker",
    "oom_marker_applies",
    "OOM_MARKER_FIELD",
    "is_unplaceable_reason",
    "time_limit_reason",
    "time_limit_status_reason",
    "OOM_REASON_PREFIX",
    "TIMEOUT_REASON",
    "HOST_LOST_PREFIXES",
    "DEPENDENCY_FAILED_REASON",
]


class BatchError(Exception):
    """Base class of every error batchfutures raises on its own account."""


class ConfigurationError(BatchError, ValueError):
    """A setting, environment or job queue is invalid; raised before anything is uploaded."""


class EnvironmentBuildError(ConfigurationError):
    """`requirements=` could not be prepared for the job's platform (a requirement with no wheel
    for it, a resolution or pip failure); raised at submit, before anything is uploaded."""


class SerializationError(BatchError, pickle.PicklingError):
    """The callable or an argument cannot be pickled; nothing was uploaded or submitted."""


class EnvironmentMismatchError(BatchError):
    """The worker cannot load the payload: its Python or library versions differ from the client's."""


class RemoteError(BatchError):
    """The remote exception (or result) could not be brought back; carries the traceback text."""

    def __init__(self, message: str, traceback: Optional[str] = None) -> None:
        super().__init__(message)
        self.traceback = traceback

    def __str__(self) -> str:
        text = super().__str__()
        if self.traceback:
            return f"{text}\n\nRemote traceback:\n{self.traceback}"
        return text


class JobMetadataExpired(BatchError):
    """Batch no longer knows the job and storage holds no result for it."""

    def __init__(self, message: str, job_id: Optional[str] = None) -> None:
        super().__init__(message)
        self.job_id = job_id


class IntegrityError(BatchError):
    """A stored function, inputs object or result failed its signature check (altered, unsigned,
    or signed with another key); nothing was unpickled and nothing ran."""


class JobFailedError(BatchError):
    """The container failed (a non-zero exit, a failed start, a failed dependency)."""

    def __init__(
        self,
        message: str,
        *,
        job_id: Optional[str] = None,
        status_reason: Optional[str] = None,
        exit_code: Optional[int] = None,
        log_tail: Optional[str] = None,
    ) -> None:
        super().__init__(message)
        self.job_id = job_id
        self.status_reason = status_reason
        self.exit_code = exit_code
        self.log_tail = log_tail

    def __reduce__(self):  # keep the attributes through pickling (e.g. to another process)
        return (_rebuild_job_error, (type(self), self.args[0], self.__dict__))


def _rebuild_job_error(cls, message, state):
    error = cls.__new__(cls)
    Exception.__init__(error, message)
    error.__dict__.update(state)
    return error


class MemoryLimitExceeded(JobFailedError):
    """The container was killed for exceeding its memory setting."""

    def __init__(self, message: str, *, memory_mib: Optional[int] = None, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.memory_mib = memory_mib


class JobTimeoutError(JobFailedError):
    """An attempt ran longer than the job's timeout."""


class JobAbortedError(JobFailedError):
    """The job was cancelled or terminated on request (abort, shutdown, another client)."""


class HostTerminatedError(JobFailedError):
    """The host went away (Spot reclaim, instance terminated)."""


class DependencyFailedError(JobFailedError):
    """A future given as an argument failed; ``__cause__`` is that failure."""


class DryRunResult(BatchError):
    """What a dry-run future raises: what would have been sent, and nothing was.

    ``requests``: the SubmitJob requests (dicts, as boto3 would send them); ``objects``: the
    storage keys and sizes in bytes that would have been written.
    """

    def __init__(self, message: str, *, requests: Any = (), objects: Any = ()) -> None:
        super().__init__(message)
        self.requests = list(requests)
        self.objects = list(objects)


class InitializerFailedError(BatchError, concurrent.futures.BrokenExecutor):
    """The executor's ``initializer`` raised in a child's process; its ``__cause__`` says how.

    Only that child's items fail (ProcessPoolExecutor breaks the whole pool; here each child is
    a fresh process, so later children still run and may succeed).
    """


class JobUnplaceableError(JobFailedError):
    """The job waited RUNNABLE longer than ``runnable_timeout`` (or its queue's
    jobStateTimeLimitActions' time) with a reason saying Batch cannot place it
    (``MISCONFIGURATION:...``, ``CAPACITY:...``), and was cancelled. ``.reason``: that reason."""

    def __init__(self, message: str, *, reason: Optional[str] = None, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.reason = reason if reason is not None else kwargs.get("status_reason")


class BudgetExceededError(BatchError):
    """``BatchExecutor(max_cost=USD)``: the estimated cost of this executor's calls reached
    ``max_cost`` before this call was sent, so it was not (nothing running was stopped).
    ``.spent`` and ``.max_cost`` in USD."""

    def __init__(self, message: str, *, spent: float = 0.0, max_cost: float = 0.0) -> None:
        super().__init__(message)
        self.spent, self.max_cost = spent, max_cost

    def __reduce__(self) -> Any:
        return (_rebuild_budget_error, (str(self), self.spent, self.max_cost))


def _rebuild_budget_error(message: str, spent: float, max_cost: float) -> "BudgetExceededError":
    return BudgetExceededError(message, spent=spent, max_cost=max_cost)


class PollerStoppedError(BatchError):
    """The executor's polling thread ended while this future's job was outstanding.

    The job itself may still run: ``executor.attach(job_id)`` from a new executor collects it.
    """

    def __init__(self, message: str, job_id: Optional[str] = None) -> None:
        super().__init__(message)
        self.job_id = job_id


ABORT_REASON_PREFIX = "batchfutures:"  # the reason of every CancelJob/TerminateJob this library sends
# Batch's reason strings the client reads, as Batch spells them (matched without regard to case):
# classify_failure reads them and submission.RETRY_RULES is built from them. The emulator writes
# its own copy (emulator/jobstate.py, as AWS would); tests/test_vocabulary.py sends every reason
# the emulator writes through classify_failure and the retry rules, so neither drifts unseen.
OOM_REASON_PREFIX = "OutOfMemoryError"  # a container's reason after the kernel's OOM kill
TIMEOUT_REASON = "Job attempt duration exceeded timeout"  # an attempt's (and job's) statusReason
HOST_LOST_PREFIXES = ("Host EC2", "Your Spot Task was interrupted")  # its instance went away
DEPENDENCY_FAILED_REASON = "Dependent Job failed"  # a dependsOn job failed: this one never ran
_TIMEOUT_PREFIX = TIMEOUT_REASON.lower()
_HOST_LOST = tuple(prefix.lower() for prefix in HOST_LOST_PREFIXES)
_OOM_PREFIX = OOM_REASON_PREFIX.lower()
# The key under which the poller (reconcile) adds the worker's out-of-memory marker, read from
# storage (storage.read_oom_marker), to a failed child's description before it is classified.
OOM_MARKER_FIELD = "batchfuturesOutOfMemoryMarker"
# A RUNNABLE job's statusReason when Batch cannot place it (botocore's JobDetail.statusReason).
UNPLACEABLE_PREFIXES = ("MISCONFIGURATION:", "CAPACITY:")
# ... of those, the one that says no compute environment has the vCPUs, memory or GPUs asked for
RESOURCES_TOO_LARGE_PREFIX = "MISCONFIGURATION:JOB_RESOURCE_REQUIREMENT"
# A job the queue's jobStateTimeLimitActions ended: "<verb> by JobStateTimeLimit action due to
# reason: <the action's reason>" (AWS Batch User Guide, "Jobs stuck in a RUNNABLE status";
# Canceled for job queues of ECS/EKS/Fargate compute environments, Terminated for SageMaker's).
TIME_LIMIT_VERBS = {"CANCEL": "Canceled", "TERMINATE": "Terminated"}
TIME_LIMIT_WORDING = "{verb} by JobStateTimeLimit action due to reason: {reason}"


def add_note(error: BaseException, note: str) -> None:
    """PEP 678's ``error.add_note(note)``; before Python 3.11 the same ``__notes__`` list (kept
    through pickling, shown by tracebacks from 3.11 on)."""
    try:
        if hasattr(error, "add_note"):
            error.add_note(note)
        else:
            error.__notes__ = [*getattr(error, "__notes__", []), note]  # type: ignore[attr-defined]
    except Exception:  # an exception type that refuses attributes keeps its message alone
        pass


def is_unplaceable_reason(reason: Optional[str]) -> bool:
    """Whether a RUNNABLE job's reason says Batch cannot place it as things are."""
    return bool(reason) and str(reason).startswith(UNPLACEABLE_PREFIXES)


def time_limit_status_reason(reason: str, action: str = "CANCEL") -> str:
    """The statusReason Batch writes on a job its queue's time-limit ``action`` ended."""
    return TIME_LIMIT_WORDING.format(verb=TIME_LIMIT_VERBS[action], reason=reason)


def time_limit_reason(status_reason: Optional[str]) -> Optional[str]:
    """The action's reason X of a statusReason "Canceled (Terminated) by JobStateTimeLimit
    action due to reason: X"; None for any other statusReason."""
    for action in TIME_LIMIT_VERBS:
        prefix = time_limit_status_reason("", action)
        if status_reason and status_reason.startswith(prefix):
            return status_reason[len(prefix):].strip()
    return None


def is_too_large_reason(reason: Optional[str]) -> bool:
    """Whether a RUNNABLE job's reason says its resources exceed every compute environment's."""
    return bool(reason) and str(reason).startswith(RESOURCES_TOO_LARGE_PREFIX)


# A failed job's log tail in an error message is cut to its last 64 KiB (the lines are the
# user's, one CloudWatch event may be 256 KiB and the emulator's lines are unbounded).
LOG_TAIL_BYTES = 64 * 1024


def cut_log_tail(text: Optional[str], limit: int = LOG_TAIL_BYTES) -> Optional[str]:
    """``text`` itself when its UTF-8 is at most ``limit`` bytes; else its last ``limit`` bytes
    (from a line's start when one begins in them), after a line saying how much was cut."""
    if text is None:
        return None
    data = text.encode("utf-8", "surrogatepass")
    if len(data) <= limit:
        return text
    kept = data[-limit:]
    newline = kept.find(b"\n")
    if 0 <= newline < len(kept) - 1:
        kept = kept[newline + 1:]  # whole lines when there are some
    cut = len(data) - len(kept)
    return (f"[... {cut:,} bytes of the log cut; the last {len(kept):,} bytes follow, "
            f"future.log() has all of it]\n" + kept.decode("utf-8", "replace"))


def wants_oom_marker(job: Mapping[str, Any]) -> bool:
    """Whether a FAILED job (child) description can only be told an out-of-memory failure by the
    worker's marker: its last attempt exited 137 with no ``OutOfMemoryError`` reason, and no
    reason says it was stopped (timeout, lost host, cancel or terminate, the queue's time limit).

    The worker exits 137 on a MemoryError without a kernel kill, so ECS (and the emulator under
    cgroups) gives no reason; a plain SIGKILL is exit 137 too, and leaves no marker.
    """
    attempt, container = last_attempt(job), last_container(job)
    if container.get("exitCode") != OOM_EXIT_STATUS:
        return False
    if job.get("isCancelled") or job.get("isTerminated"):
        return False
    reasons = [str(text or "").lower() for text in (job.get("statusReason"),
                                                    attempt.get("statusReason"),
                                                    container.get("reason"))]
    stopped = (_OOM_PREFIX, _TIMEOUT_PREFIX, *_HOST_LOST, ABORT_REASON_PREFIX)
    if any(text.startswith(stopped) for text in reasons):
        return False
    return time_limit_reason(job.get("statusReason")) is None


def oom_marker_applies(job: Mapping[str, Any], marker: Optional[Mapping[str, Any]]) -> bool:
    """Whether ``marker`` (storage.read_oom_marker's) speaks for the job's last attempt: written
    by it or a later one (its ``attempt``, AWS_BATCH_JOB_ATTEMPT, is at least the number of
    attempts the description lists), or either count unknown. An earlier attempt's marker does
    not make the last attempt's exit 137 an OOM."""
    if not isinstance(marker, Mapping):
        return False
    attempts = attempt_count(job)
    try:
        number = int(marker.get("attempt"))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return True
    return not attempts or number >= attempts


def classify_failure(
    job: Mapping[str, Any],
    *,
    job_id: Optional[str] = None,
    log_tail: Optional[str] = None,
    memory_mib: Optional[int] = None,
    oom_marker: Optional[Mapping[str, Any]] = None,
) -> JobFailedError:
    """Build the typed exception for a FAILED job description (or ListJobs summary).

    ``memory_mib``: the job's memory setting, for a description that does not carry it.
    ``oom_marker``: the worker's out-of-memory marker of this child, when storage holds one
    (else the description's ``OOM_MARKER_FIELD``, which reconcile adds): with an exit code 137
    and no reason saying otherwise (``wants_oom_marker``) the failure is a MemoryLimitExceeded,
    as a kernel kill's ``OutOfMemoryError`` reason makes it.
    """
    job_id = job_id or job.get("jobId")
    attempt, container = last_attempt(job), last_container(job)
    status_reason = job.get("statusReason") or attempt.get("statusReason")
    attempt_reason = attempt.get("statusReason") or status_reason or ""
    container_reason = container.get("reason") or ""
    exit_code = container.get("exitCode")
    log_tail = cut_log_tail(log_tail)
    fields: Dict[str, Any] = dict(job_id=job_id, status_reason=status_reason, exit_code=exit_code,
                                  log_tail=log_tail)
    tail = f"\nLast lines of its log:\n{log_tail}" if log_tail else ""

    reasons = [text.lower() for text in (status_reason or "", attempt_reason, container_reason)]
    def out_of_memory(what: Callable[[str], str]) -> MemoryLimitExceeded:
        """The kernel's kill and the worker's marker alike: ``what(limit)`` says which."""
        memory = resources(job.get("container") or {}).memory_mib or memory_mib
        limit = f"{memory} MiB" if memory else "its memory setting"
        return MemoryLimitExceeded(
            f"Batch job {job_id} {what(limit)}. Raise the limit, for example "
            f"executor.with_settings(memory=\"{_suggest_memory(memory)}\"), or use less memory "
            f"per call (a smaller chunksize).{tail}",
            memory_mib=memory,
            **fields,
        )

    if any(text.startswith(_OOM_PREFIX) for text in reasons):
        return out_of_memory(lambda limit: f"was killed for using more than {limit} of memory "
                                           f"({container_reason or status_reason})")
    if any(text.startswith(_TIMEOUT_PREFIX) for text in reasons[:2]):
        seconds = (job.get("timeout") or {}).get("attemptDurationSeconds")
        limit = f"{seconds} s" if seconds else "its timeout"
        return JobTimeoutError(
            f"Batch job {job_id} ran longer than {limit} and was stopped "
            f"({status_reason}). Raise timeout= or split the work into smaller calls.{tail}",
            **fields,
        )
    if any(text.startswith(_HOST_LOST) for text in reasons[:2]):
        return HostTerminatedError(
            f"Batch job {job_id} lost its host ({status_reason or attempt_reason}). Spot capacity "
            f"was probably reclaimed; allow retries (retries=3) or use an on-demand queue.{tail}",
            **fields,
        )
    if (status_reason or "").lower().startswith(DEPENDENCY_FAILED_REASON.lower()):
        # never raw: the session sets __cause__ to the failed argument's exception (jobs.py)
        return DependencyFailedError(
            f"Batch job {job_id} did not run: a job it depends on (a future passed as an "
            f"argument) failed ({status_reason}).", **fields)
    cause = time_limit_reason(status_reason)
    if cause is None and is_unplaceable_reason(status_reason) and not attempt_count(job):
        cause = status_reason  # the bare reason, as older emulators wrote it
    if cause is not None:
        # the queue's jobStateTimeLimitActions ended a job Batch could not place (before any
        # attempt, so this comes before the isCancelled check below)
        return JobUnplaceableError(
            f"Batch job {job_id} could not be placed and its queue's jobStateTimeLimitActions "
            f"cancelled it; Batch's reason: {cause}. Ask for fewer vCPUs, less memory or fewer "
            f"GPUs, or use a job queue whose compute environments can run it.",
            reason=cause, **fields)
    # Aborted only when Batch says a CancelJob/TerminateJob was accepted, or the reason is one
    # this library wrote; any other reason is Batch's own account of a failure.
    if job.get("isCancelled") or job.get("isTerminated") or \
            (status_reason or "").startswith(ABORT_REASON_PREFIX):
        return JobAbortedError(
            f"Batch job {job_id} was cancelled or terminated: {status_reason or 'no reason given'}",
            **fields,
        )
    marker = oom_marker if oom_marker is not None else job.get(OOM_MARKER_FIELD)
    if marker is not None and wants_oom_marker(job) and oom_marker_applies(job, marker):
        return out_of_memory(lambda limit: (
            f"ran out of memory with {limit}: its worker raised MemoryError and exited with "
            f"code {exit_code}, recording so in storage (Batch gives no OutOfMemoryError reason "
            f"when the kernel did not kill it)"))
    what = f"exited with code {exit_code}" if exit_code is not None else "failed"
    detail = f" ({container_reason})" if container_reason and container_reason != status_reason else ""
    return JobFailedError(
        f"Batch job {job_id} {what}{detail}: {status_reason or 'no reason given'}. "
        f"Its log has the details (future.log()).{tail}",
        **fields,
    )


def _suggest_memory(memory_mib: Optional[int]) -> str:
    if not memory_mib:
        return "4GiB"
    doubled = memory_mib * 2
    if doubled % 1024 == 0:
        return f"{doubled // 1024}GiB"
    return f"{doubled}MiB"
