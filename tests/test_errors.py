"""Failed jobs are classified from Batch's own strings, the same for the emulator and AWS."""

import pickle
import re

import pytest

from batchfutures import errors
from batchfutures.errors import classify_failure


def job(status_reason=None, reason=None, exit_code=None, memory=None, timeout=None):
    container = {}
    if reason is not None:
        container["reason"] = reason
    if exit_code is not None:
        container["exitCode"] = exit_code
    description = {"jobId": "j-1", "status": "FAILED",
                   "attempts": [{"container": container, "statusReason": status_reason}],
                   "container": {"resourceRequirements": [{"type": "MEMORY", "value": str(memory)}]}
                   if memory else {}}
    if status_reason is not None:
        description["statusReason"] = status_reason
    if timeout:
        description["timeout"] = {"attemptDurationSeconds": timeout}
    return description


def test_hierarchy():
    assert issubclass(errors.ConfigurationError, (errors.BatchError, ValueError))
    assert issubclass(errors.SerializationError, (errors.BatchError, pickle.PicklingError))
    for cls in (errors.MemoryLimitExceeded, errors.JobTimeoutError, errors.JobAbortedError,
                errors.HostTerminatedError):
        assert issubclass(cls, errors.JobFailedError)
    for cls in (errors.EnvironmentMismatchError, errors.RemoteError, errors.JobMetadataExpired,
                errors.JobFailedError):
        assert issubclass(cls, errors.BatchError)


@pytest.mark.parametrize("exit_code", [137, 1, None])
def test_oom_whatever_the_exit_code(exit_code):
    failure = classify_failure(job("Essential container in task exited",
                                   "OutOfMemoryError: Container killed due to memory usage",
                                   exit_code, memory=512), log_tail="last line")
    assert type(failure) is errors.MemoryLimitExceeded
    assert failure.memory_mib == 512 and failure.exit_code == exit_code
    assert "512 MiB" in str(failure) and "memory=" in str(failure)
    assert failure.log_tail == "last line" and failure.job_id == "j-1"


def test_oom_reason_is_case_insensitive():
    failure = classify_failure(job("Essential container in task exited", "outOfMemoryError: x", 137))
    assert isinstance(failure, errors.MemoryLimitExceeded)


def test_timeout():
    failure = classify_failure(job("Job attempt duration exceeded timeout", exit_code=137, timeout=60))
    assert type(failure) is errors.JobTimeoutError and "60 s" in str(failure)


def test_host_terminated():
    failure = classify_failure(job("Host EC2 (instance i-0abc) terminated."))
    assert type(failure) is errors.HostTerminatedError


@pytest.mark.parametrize("reason, flag", [("batchfutures: aborted by the user", None),
                                          ("stop it now", "isTerminated"),
                                          ("not needed", "isCancelled")])
def test_aborted(reason, flag):
    description = job(reason, exit_code=137)
    if flag:
        description[flag] = True
    failure = classify_failure(description)
    assert type(failure) is errors.JobAbortedError and failure.status_reason == reason


def test_an_unknown_reason_is_a_failure_not_an_abort():
    reason = "Timeout waiting for network interface provisioning to complete."
    failure = classify_failure(job(reason))
    assert type(failure) is errors.JobFailedError and reason in str(failure)


def test_plain_failure():
    failure = classify_failure(job("Essential container in task exited", exit_code=3))
    assert type(failure) is errors.JobFailedError
    assert failure.exit_code == 3 and "exited with code 3" in str(failure)


def test_failures_pickle_with_their_fields():
    failure = classify_failure(job("Essential container in task exited", "OutOfMemoryError: x",
                                   137, memory=256), log_tail="tail")
    copy = pickle.loads(pickle.dumps(failure))
    assert type(copy) is errors.MemoryLimitExceeded
    assert (copy.job_id, copy.exit_code, copy.memory_mib, copy.log_tail) == ("j-1", 137, 256, "tail")
    assert str(copy) == str(failure)


def test_a_job_the_queue_cancelled_for_being_unplaceable_says_so():
    from batchfutures.errors import JobUnplaceableError

    described = {"jobId": "j", "status": "FAILED", "isCancelled": True, "attempts": [],
                 "statusReason": "MISCONFIGURATION:JOB_RESOURCE_REQUIREMENT - The job resource "
                                 "requirement (vCPU/memory/GPU) is higher than that can be met"}
    error = classify_failure(described)
    assert type(error) is JobUnplaceableError and "jobStateTimeLimitActions" in str(error)


def drawn_tree():
    """errors.py's drawing of its exception tree: {class: (drawn bases, drawn parent)}; the parent
    is the class the line hangs from (None at the top)."""
    drawing = errors.__doc__.split("\n\n")[1]
    found, stack = {}, []  # stack: (indent, class) of the lines above
    for line in drawing.splitlines():
        match = re.match(r"^(\s*(?:[│ ]\s*)*(?:[├└]── )?)(\w+)\(([^)]*)\)", line)
        assert match, line
        indent, name = len(match.group(1)), match.group(2)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        bases = tuple(base.strip().rsplit(".", 1)[-1] for base in match.group(3).split(","))
        found[name] = (bases, stack[-1][1] if stack else None)
        stack.append((indent, name))
    return found


def test_the_exception_tree_drawn_in_errors_is_the_real_one():
    real = {name: cls for name, cls in vars(errors).items()
            if isinstance(cls, type) and issubclass(cls, BaseException)
            and cls.__module__ == errors.__name__}
    drawn = drawn_tree()
    assert set(drawn) == set(real)  # every class drawn, nothing drawn that is not one
    for name, (bases, parent) in drawn.items():
        assert bases == tuple(base.__name__ for base in real[name].__bases__), name
        assert parent == (None if name == "BatchError" else real[name].__bases__[0].__name__), name
