"""Typed errors, and how a failed Batch job is classified into one of them.

    BatchError(Exception)
    ├── ConfigurationError(BatchError, ValueError)
    ├── SerializationError(BatchError, pickle.PicklingError)
    ├── EnvironmentMismatchError(BatchError)
    ├── RemoteError(BatchError)
    ├── JobMetadataExpired(BatchError)
    ├── InitializerFailedError(BatchError, concurrent.futures.BrokenExecutor)
    ├── DryRunResult(BatchError)          what a dry-run future raises: .requests, .objects
    └── JobFailedError(BatchError)
        ├── MemoryLimitExceeded(JobFailedError)
        ├── JobTimeoutError(JobFailedError)
        ├── JobAbortedError(JobFailedError)
        ├── HostTerminatedError(JobFailedError)
        └── DependencyFailedError(JobFailedError)
    IntegrityError(BatchError)

`classify_failure` reads the last attempt of a FAILED job description (the dict DescribeJobs
returns) and builds the exception a future raises. Batch's own strings decide the type, so the
emulator and AWS are classified by the same code.
"""

from __future__ import annotations

import concurrent.futures
import pickle
from typing import Any, Mapping, Optional

__all__ = [
    "BatchError",
    "ConfigurationError",
    "SerializationError",
    "EnvironmentMismatchError",
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
    "classify_failure",
]


class BatchError(Exception):
    """Base class of every error batchfutures raises on its own account."""


class ConfigurationError(BatchError, ValueError):
    """A setting, environment or job queue is invalid; raised before anything is uploaded."""


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


# Reasons Batch itself writes for a container that failed on its own. Any other statusReason on
# a FAILED job is the free text a CancelJob/TerminateJob caller gave, so it means "aborted".
_SYSTEM_REASON_PREFIXES = (
    "essential container in task exited",
    "task failed to start",
    "dependent job failed",
    "cannotpullcontainer",
    "cannotstartcontainer",
    "cannotinspectcontainer",
    "cannotcreatecontainer",
    "resourceinitializationerror",
    "outofmemoryerror",
    "array child job failed",
)
ABORT_REASON_PREFIX = "batchfutures:"
_TIMEOUT_PREFIX = "job attempt duration exceeded timeout"
_HOST_PREFIX = "host ec2"
_OOM_PREFIX = "outofmemoryerror"


def _last_attempt(job: Mapping[str, Any]) -> Mapping[str, Any]:
    attempts = job.get("attempts") or []
    return attempts[-1] if attempts else {}


def _memory_mib(job: Mapping[str, Any]) -> Optional[int]:
    for requirement in (job.get("container") or {}).get("resourceRequirements") or []:
        if requirement.get("type") == "MEMORY":
            try:
                return int(float(requirement["value"]))
            except (KeyError, ValueError):
                return None
    memory = (job.get("container") or {}).get("memory")
    return int(memory) if memory else None


def classify_failure(
    job: Mapping[str, Any],
    *,
    job_id: Optional[str] = None,
    log_tail: Optional[str] = None,
) -> JobFailedError:
    """Build the typed exception for a FAILED job description, from its last attempt."""
    job_id = job_id or job.get("jobId")
    attempt = _last_attempt(job)
    container = attempt.get("container") or job.get("container") or {}
    status_reason = job.get("statusReason") or attempt.get("statusReason")
    attempt_reason = attempt.get("statusReason") or status_reason or ""
    container_reason = container.get("reason") or ""
    exit_code = container.get("exitCode")
    fields = dict(job_id=job_id, status_reason=status_reason, exit_code=exit_code, log_tail=log_tail)
    tail = f"\nLast lines of its log:\n{log_tail}" if log_tail else ""

    reason_lower = (status_reason or "").lower()
    if container_reason.lower().startswith(_OOM_PREFIX) or reason_lower.startswith(_OOM_PREFIX):
        memory = _memory_mib(job)
        limit = f"{memory} MiB" if memory else "its memory setting"
        return MemoryLimitExceeded(
            f"Batch job {job_id} was killed for using more than {limit} of memory "
            f"({container_reason or status_reason}). Raise the limit, for example "
            f"executor.with_settings(memory=\"{_suggest_memory(memory)}\"), or use less memory "
            f"per call (a smaller chunksize).{tail}",
            memory_mib=memory,
            **fields,
        )
    if attempt_reason.lower().startswith(_TIMEOUT_PREFIX) or reason_lower.startswith(_TIMEOUT_PREFIX):
        seconds = (job.get("timeout") or {}).get("attemptDurationSeconds")
        limit = f"{seconds} s" if seconds else "its timeout"
        return JobTimeoutError(
            f"Batch job {job_id} ran longer than {limit} and was stopped "
            f"({status_reason}). Raise timeout= or split the work into smaller calls.{tail}",
            **fields,
        )
    if attempt_reason.lower().startswith(_HOST_PREFIX) or reason_lower.startswith(_HOST_PREFIX):
        return HostTerminatedError(
            f"Batch job {job_id} lost its host ({status_reason}). Spot capacity was probably "
            f"reclaimed; allow retries (retries=3) or use an on-demand queue.{tail}",
            **fields,
        )
    if status_reason and not reason_lower.startswith(_SYSTEM_REASON_PREFIXES):
        return JobAbortedError(
            f"Batch job {job_id} was cancelled or terminated: {status_reason}",
            **fields,
        )
    what = f"exited with code {exit_code}" if exit_code is not None else "failed"
    detail = f" ({container_reason})" if container_reason else ""
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
