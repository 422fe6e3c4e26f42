"""The end of an attempt as Batch reports it: a table of cases, no processes."""

import pytest

from batchfutures.emulator.runtime.attempts import KillReason, docker_exit_code
from batchfutures.emulator.runtime.outcomes import AttemptEnd, attempt_outcome

EXITED = "Essential container in task exited"
OOM = "OutOfMemoryError: Container killed due to memory usage"
HOST = "Host EC2 (instance i-0123456789abcdef0) terminated."

CASES = [
    # (what happened, container shown, attempt statusReason, succeeded, retryable)
    (AttemptEnd(exit_code=0), {"exitCode": 0}, EXITED, True, True),
    (AttemptEnd(exit_code=3), {"exitCode": 3}, EXITED, False, True),
    (AttemptEnd(exit_code=137), {"exitCode": 137}, EXITED, False, True),  # a SIGKILL, not an OOM
    (AttemptEnd(exit_code=137, memory_exceeded=True), {"exitCode": 137, "reason": OOM}, EXITED,
     False, True),
    (AttemptEnd(exit_code=1, memory_exceeded=True), {"exitCode": 1, "reason": OOM}, EXITED,
     False, True),  # a child was the one killed, the main process failed
    (AttemptEnd(exit_code=0, memory_exceeded=True), {"exitCode": 0}, EXITED, True, True),
    (AttemptEnd(exit_code=137, killed=KillReason.TIMEOUT),
     {"exitCode": 137}, "Job attempt duration exceeded timeout", False, False),
    (AttemptEnd(exit_code=137, killed=KillReason.TERMINATE, stop_reason="stop it"),
     {"exitCode": 137}, "stop it", False, False),
    (AttemptEnd(exit_code=137, killed=KillReason.SHUTDOWN, stop_reason="shut down"),
     {"exitCode": 137}, "shut down", False, False),
    (AttemptEnd(exit_code=137, killed=KillReason.HOST_LOST, memory_exceeded=True), {}, HOST,
     False, True),
    (AttemptEnd(exit_code=137, killed=KillReason.MEMORY, memory_exceeded=True),
     {"exitCode": 137, "reason": OOM}, EXITED, False, True),  # the fallback's monitor
    (AttemptEnd(start_error="FileNotFoundError: 'nope'"),
     {"reason": "CannotStartContainerError: FileNotFoundError: 'nope'"}, "Task failed to start",
     False, True),
]


@pytest.mark.parametrize("end, container, reason, succeeded, retryable", CASES)
def test_attempt_outcomes(end, container, reason, succeeded, retryable):
    outcome = attempt_outcome(end)
    assert outcome.container == container
    assert outcome.status_reason == reason
    assert outcome.succeeded is succeeded
    assert outcome.retryable is retryable


@pytest.mark.parametrize("returncode, code", [(0, 0), (1, 1), (-9, 137), (-15, 143), (None, 137)])
def test_docker_exit_codes(returncode, code):
    assert docker_exit_code(returncode) == code
