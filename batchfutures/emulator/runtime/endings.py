"""What follows the end of an attempt or of a unit: pure decisions, and Endings to apply them.

    ending_outcome(end, multinode=, terminated=)   outcomes.attempt_outcome, except a node
                                                   stopped because its main node ended
    next_status(outcome, ...)                      SUCCEEDED, RUNNABLE (retried) or FAILED
    record_end(unit, attempt, end, ...)            the attempt's record completed (exit code,
                                                   reason, times); the unit's next status
    array_end(failed, stop_reason, gate_failed)    an array's status and reason once every
                                                   child has ended
    Endings.finalize(unit, status, reason)         a unit's final status, its dependents told,
                                                   its job's end (an array's after the last
                                                   child's, a multi-node job's with its main
                                                   node's: the other nodes stop)
    Endings.fail_unspawned(job, now)               a job failed at admission

`Endings.finished` lists own jobs in the order they ended (the metadata TTL reads it). The caller
holds the emulator's lock.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from typing import Any, Callable, Deque, Dict, List, Optional, Tuple

from ...statuses import FINISHED, QUEUED, JobStatus
from .. import retries
from ..dependson import Dependencies
from ..jobstate import (
    CHILD_FAILED,
    DEPENDENCY_FAILED,
    EXITED,
    MAIN_NODE_EXITED,
    MAX_TAGS,
    Job,
    Unit,
)
from .attempts import AttemptHandle, KillReason
from .outcomes import AttemptEnd, AttemptOutcome, attempt_outcome
from .stopping import stop_attempt

TOO_MANY_TAGS = (f"ClientException: the job and its job definition have more than {MAX_TAGS} "
                 "tags to propagate")


def ending_outcome(end: AttemptEnd, *, multinode: bool, terminated: bool) -> AttemptOutcome:
    """attempt_outcome, except that a node stopped because its main node ended (not by
    TerminateJob) ends by its own exit code, as on AWS: 0 (it had finished, or left on SIGTERM)
    is SUCCEEDED, anything else FAILED with the reason it was stopped for."""
    with_main = end.killed is KillReason.TERMINATE and multinode and not terminated
    if not with_main:
        return attempt_outcome(end)
    outcome = attempt_outcome(dataclasses.replace(end, killed=None))
    if outcome.succeeded:
        return outcome
    return dataclasses.replace(outcome, status_reason=end.stop_reason or EXITED)


def next_status(outcome: AttemptOutcome, *, attempts_made: int, max_attempts: int,
                exit_rules: List[Dict[str, str]], multinode: bool, stopped: bool) -> JobStatus:
    """Where a unit goes after an attempt: RUNNABLE is a retry, allowed while attempts are left
    to a plain job or child that nobody stopped (CancelJob, TerminateJob, the emulator's close)
    and whose end the retry strategy's evaluateOnExit does not exclude."""
    if outcome.succeeded:
        return JobStatus.SUCCEEDED
    found = outcome.container
    if (outcome.retryable and not multinode and not stopped and attempts_made < max_attempts
            and retries.should_retry(exit_rules, exit_code=found.get("exitCode"),
                                     reason=found.get("reason"),
                                     status_reason=outcome.status_reason)):
        return JobStatus.RUNNABLE
    return JobStatus.FAILED


def array_end(failed: bool, stop_reason: Optional[str],
              gate_failed: bool) -> Tuple[JobStatus, Optional[str]]:
    """An array's status and reason once all its children ended, `failed` if any did: a
    CancelJob/TerminateJob reason first, then a failed whole-job dependency, then a child."""
    if not failed:
        return JobStatus.SUCCEEDED, None
    return JobStatus.FAILED, stop_reason or (DEPENDENCY_FAILED if gate_failed else CHILD_FAILED)


def end_of(handle: Optional[AttemptHandle], start_error: Optional[str],
           stop_reason: Optional[str], spot_platform: Optional[str] = None) -> AttemptEnd:
    """What is known of an attempt's end from its handle (None: it never got a process)."""
    if handle is None:
        return AttemptEnd(start_error=start_error, stop_reason=stop_reason)
    return AttemptEnd(exit_code=handle.exit_code(), killed=handle.kill_reason,
                      memory_exceeded=handle.memory_exceeded, start_error=start_error,
                      stop_reason=stop_reason, spot_platform=spot_platform)


def record_end(unit: Unit, attempt: Dict[str, Any], end: AttemptEnd, *, now: int,
               stopping: bool) -> Tuple[JobStatus, str]:
    """Complete the attempt's record and append it to the unit's; returns where the unit goes
    next (RUNNABLE: a retry) and the reason (EXITED when it succeeded)."""
    if end.start_error is None and "startedAt" not in attempt:
        unit.started = attempt["startedAt"] = now  # ended before it was seen running
    outcome = ending_outcome(end, multinode=unit.job.is_multinode, terminated=unit.terminated)
    attempt["container"].update(outcome.container)
    attempt["stoppedAt"] = now
    attempt["statusReason"] = outcome.status_reason
    unit.attempts.append(attempt)
    spec = unit.job.spec
    status = next_status(outcome, attempts_made=len(unit.attempts), max_attempts=spec.max_attempts,
                         exit_rules=spec.exit_rules, multinode=unit.job.is_multinode,
                         stopped=unit.cancelled or unit.terminated or stopping)
    return status, outcome.status_reason


class Endings:
    def __init__(self, dependencies: Dependencies, now_ms: Callable[[], int]) -> None:
        self.dependencies = dependencies
        self.finished: Deque[Job] = deque()  # own jobs in the order they ended (for the TTL)
        self._now_ms = now_ms  # the records' clock (epoch ms)

    def finalize(self, unit: Unit, status: JobStatus, reason: Optional[str]) -> None:
        job = unit.job
        now = self._now_ms()
        job.move(unit, status, now, reason)
        self.dependencies.ended(unit, status == JobStatus.SUCCEEDED)
        if job.is_array:
            if job.status not in FINISHED and job.all_children_done:
                self._end_job(job, *array_end(job.counts[JobStatus.FAILED] > 0,
                                              job.stop_reason, job.gate_failed), now)
        elif job.is_multinode:
            if unit.is_main_node and job.status not in FINISHED:
                self._end_multinode(job, unit, status, reason, now)
        else:
            self.finished.append(job)

    def fail_unspawned(self, job: Job, now: int) -> None:
        """Fail a job at admission, before it has children (an array keeps none)."""
        if job.has_children:
            job.drop_children()
            self._end_job(job, JobStatus.FAILED, TOO_MANY_TAGS, now)
        else:
            self.finalize(job.units[0], JobStatus.FAILED, TOO_MANY_TAGS)

    def _end_job(self, job: Job, status: JobStatus, reason: Optional[str], now: int) -> None:
        job.finish_parent(status, reason, now)
        self.dependencies.ended(job, status == JobStatus.SUCCEEDED)
        self.finished.append(job)

    def _end_multinode(self, job: Job, main: Unit, status: JobStatus, reason: Optional[str],
                       now: int) -> None:
        """The main node's end is the job's: its status and reason; the other nodes stop."""
        job.cancelled = job.cancelled or main.cancelled
        job.terminated = job.terminated or main.terminated
        self._end_job(job, status, reason, now)
        why = job.stop_reason or MAIN_NODE_EXITED  # CancelJob/TerminateJob's, else the main's end
        for node in job.units:
            if node is main or node.status in FINISHED:
                continue
            if node.status in QUEUED:
                self.finalize(node, JobStatus.FAILED, why)
            else:
                node.stop_reason = why
                stop_attempt(node, KillReason.TERMINATE)
