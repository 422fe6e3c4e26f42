"""One vocabulary across the client/emulator line.

The emulator plays AWS, so it keeps its own copy of Batch's reason strings (emulator/jobstate.py)
as an independent writer; the client reads them through errors' constants (classify_failure, and
submission.RETRY_RULES built from them). Here every reason the emulator writes goes through both,
from the emulator's own code where it writes them, so a string changed on one side fails here.
Batch's limits and the OOM exit status have one home (batchlimits.py), status groups one too
(statuses.py): no other module writes them down again.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import batchfutures
from batchfutures import batchlimits, errors
from batchfutures.emulator import jobstate, retries
from batchfutures.emulator.jobstate import Job, JobSpec, describe
from batchfutures.emulator.runtime import endings
from batchfutures.emulator.runtime.attempts import KillReason
from batchfutures.emulator.runtime.deadlines import time_limit_cancellation
from batchfutures.emulator.runtime.endings import record_end
from batchfutures.emulator.runtime.outcomes import AttemptEnd
from batchfutures.emulator.service import SHUTDOWN_REASON
from batchfutures.emulator.table import EXIT_REASON
from batchfutures.jobdetail import attempt_count
from batchfutures.statuses import ACTIVE, FINISHED, QUEUED, JobStatus
from batchfutures.submission import RETRY_RULES

PACKAGE = Path(batchfutures.__file__).parent


def plain_job() -> Job:
    return Job(JobSpec(job_id="j", name="n", queue="q", created=0, seq=1,
                       retry_strategy={"attempts": 3, "evaluateOnExit": RETRY_RULES}))


def attempt_ended(end: AttemptEnd):
    """A plain job whose one attempt ended as `end`, recorded by the emulator and ended FAILED
    there: (its DescribeJobs answer, whether RETRY_RULES let Batch retry that attempt)."""
    job = plain_job()
    unit = job.units[0]
    attempt = {"container": {}}
    _, reason = record_end(unit, attempt, end, now=9, stopping=False)
    job.move(unit, JobStatus.FAILED, 9, reason)
    container = attempt["container"]
    retried = retries.should_retry(RETRY_RULES, exit_code=container.get("exitCode"),
                                   reason=container.get("reason"),
                                   status_reason=attempt["statusReason"])
    return describe(job), retried


def failed_with(reason: str):
    """A plain job the emulator ended FAILED with `reason` and no attempt (dependsOn, a queue's
    time limit, its own shutdown)."""
    job = plain_job()
    job.move(job.units[0], JobStatus.FAILED, 9, reason)
    return describe(job)


ABORTED = f"{errors.ABORT_REASON_PREFIX} cancelled by the user"


@pytest.mark.parametrize("end, error, retried, writes", [
    (AttemptEnd(exit_code=1), errors.JobFailedError, True, {"EXITED"}),
    (AttemptEnd(exit_code=137, killed=KillReason.MEMORY, memory_exceeded=True),
     errors.MemoryLimitExceeded, False, {"OOM_REASON", "EXITED"}),
    (AttemptEnd(exit_code=137, killed=KillReason.TIMEOUT), errors.JobTimeoutError, False,
     {"TIMEOUT_REASON"}),
    (AttemptEnd(killed=KillReason.HOST_LOST), errors.HostTerminatedError, True,
     {"HOST_TERMINATED"}),
    (AttemptEnd(exit_code=137, killed=KillReason.SPOT_RECLAIM, spot_platform="FARGATE_SPOT"),
     errors.HostTerminatedError, True, {"SPOT_TASK_INTERRUPTED"}),
    (AttemptEnd(exit_code=137, killed=KillReason.SPOT_RECLAIM, spot_platform="SPOT"),
     errors.HostTerminatedError, True, {"HOST_TERMINATED"}),
    (AttemptEnd(start_error="OSError: no such file"), errors.JobFailedError, True,
     {"START_FAILED"}),
    (AttemptEnd(exit_code=143, killed=KillReason.TERMINATE, stop_reason=ABORTED),
     errors.JobAbortedError, False, set()),
    (AttemptEnd(exit_code=137), errors.JobFailedError, True, {"EXITED"}),  # a plain SIGKILL
])
def test_every_attempt_end_the_emulator_writes_reads_back(end, error, retried, writes):
    description, rules_retry = attempt_ended(end)
    assert type(errors.classify_failure(description)) is error
    assert rules_retry is retried
    written = {description.get("statusReason"), *description["attempts"][-1]["container"].values()}
    assert {name for name in writes if getattr(jobstate, name) in written} == writes


@pytest.mark.parametrize("reason, error", [
    (jobstate.DEPENDENCY_FAILED, errors.DependencyFailedError),
    (jobstate.CHILD_FAILED, errors.JobFailedError),
    (jobstate.MAIN_NODE_EXITED, errors.JobFailedError),
    (endings.TOO_MANY_TAGS, errors.JobFailedError),
    (SHUTDOWN_REASON.format(pid=7), errors.JobFailedError),  # the emulator's own, not Batch's
    (EXIT_REASON.format(pid=7), errors.JobFailedError),
])
def test_every_job_reason_the_emulator_writes_reads_back(reason, error):
    assert type(errors.classify_failure(failed_with(reason))) is error


def test_a_queue_time_limit_the_emulator_writes_reads_back_as_unplaceable():
    actions = [{"state": "RUNNABLE", "action": "CANCEL", "maxTimeSeconds": 1,
                "reason": "MISCONFIGURATION:JOB_RESOURCE_REQUIREMENT"}]
    reason = time_limit_cancellation(actions, jobstate.MISCONFIGURED, held_for=2)
    assert reason is not None and errors.time_limit_reason(reason) == actions[0]["reason"]
    failure = errors.classify_failure(failed_with(reason))
    assert type(failure) is errors.JobUnplaceableError and failure.reason == actions[0]["reason"]
    # and the RUNNABLE reason that led to it: Batch cannot place the job, its resources too large
    assert errors.is_unplaceable_reason(jobstate.MISCONFIGURED)
    assert errors.is_too_large_reason(jobstate.MISCONFIGURED)


def test_a_compute_environment_too_small_reads_back_as_unplaceable():
    assert errors.is_unplaceable_reason(jobstate.CE_MAX_RESOURCE)
    actions = [{"state": "RUNNABLE", "action": "CANCEL", "maxTimeSeconds": 1,
                "reason": "MISCONFIGURATION:COMPUTE_ENVIRONMENT_MAX_RESOURCE"}]
    reason = time_limit_cancellation(actions, jobstate.CE_MAX_RESOURCE, held_for=2)
    failure = errors.classify_failure(failed_with(reason))
    assert type(failure) is errors.JobUnplaceableError and failure.reason == actions[0]["reason"]


def test_every_reason_constant_of_the_emulator_is_read_back_above():
    """A new reason in emulator/jobstate.py needs a row above (and a decision in errors)."""
    tested = {"EXITED", "OOM_REASON", "TIMEOUT_REASON", "HOST_TERMINATED", "START_FAILED",
              "SPOT_TASK_INTERRUPTED", "CE_MAX_RESOURCE",
              "DEPENDENCY_FAILED", "CHILD_FAILED", "MAIN_NODE_EXITED", "MISCONFIGURED",
              "TIME_LIMIT_CANCELLED"}
    written = {name for name, value in vars(jobstate).items()
               if name.isupper() and isinstance(value, str)}
    assert written == tested


def test_the_retry_rules_are_built_from_errors_constants():
    assert {"onReason": f"{errors.OOM_REASON_PREFIX}*", "action": "EXIT"} in RETRY_RULES
    assert {"onStatusReason": f"{errors.TIMEOUT_REASON}*", "action": "EXIT"} in RETRY_RULES
    assert {"onStatusReason": f"{errors.ABORT_REASON_PREFIX}*", "action": "EXIT"} in RETRY_RULES
    assert retries.check_strategy({"attempts": 3, "evaluateOnExit": RETRY_RULES}) is None


def test_the_status_groups_cover_every_status_once():
    assert sorted(QUEUED + ACTIVE + FINISHED, key=list(JobStatus).index) == list(JobStatus)


def _modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path, ast.parse(path.read_text(), str(path))


LIMIT_NAMES = set(batchlimits.__all__) | {"OOM_EXIT_CODE", "BULK_STOP_LIMIT", "DESCRIBE_PAGE",
                                          "MAX_DESCRIBE", "MAX_REQUEST_BYTES",
                                          "SUBMIT_PAYLOAD_LIMIT"}


# where the number is defined
NOT_YET = {"batchlimits.py"}


def test_batchs_limits_and_the_kill_status_are_written_down_once():
    again = []
    for path, tree in _modules():
        if str(path.relative_to(PACKAGE)) in NOT_YET:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and type(node.value) is int \
                    and node.value == batchlimits.OOM_EXIT_STATUS:
                again.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: 137")
        for node in tree.body:  # a module-level constant of the same name, given a literal
            if isinstance(node, ast.Assign) and isinstance(node.value, (ast.Constant, ast.BinOp)):
                names = {t.id for t in node.targets if isinstance(t, ast.Name)}
                again += [f"{path.relative_to(PACKAGE)}:{node.lineno}: {n}" for n in names & LIMIT_NAMES]
    assert again == []


@pytest.mark.parametrize("description, count", [
    ({}, 0),
    ({"attempts": None}, 0),
    ({"attempts": []}, 0),
    ({"attempts": [{}, {"container": {"exitCode": 1}}]}, 2),
    ({"attempts": "not a list"}, 0),
])
def test_attempt_count(description, count):
    assert attempt_count(description) == count
