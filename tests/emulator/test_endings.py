"""What follows an attempt's or a unit's end (emulator/runtime/endings.py) and how units are
stopped (stopping.py): pure decisions in tables, then Endings and stop() on real jobs, no process."""

import pytest

from batchfutures.emulator.dependson import Dependencies
from batchfutures.emulator.jobstate import (
    CHILD_FAILED,
    DEPENDENCY_FAILED,
    EXITED,
    MAIN_NODE_EXITED,
    START_FAILED,
    TIMEOUT_REASON,
    Job,
    JobSpec,
)
from batchfutures.emulator.runtime.attempts import KillReason
from batchfutures.emulator.runtime.endings import (
    Endings,
    array_end,
    end_of,
    ending_outcome,
    next_status,
    record_end,
)
from batchfutures.emulator.runtime.outcomes import AttemptEnd, attempt_outcome
from batchfutures.emulator.runtime.stopping import abandon_attempt, kill_for_shutdown, stop
from batchfutures.statuses import JobStatus

TERMINATED = AttemptEnd(exit_code=143, killed=KillReason.TERMINATE, stop_reason=MAIN_NODE_EXITED)


@pytest.mark.parametrize("end, multinode, terminated, succeeded, reason", [
    # a node stopped because its main node ended: its own exit code decides
    (AttemptEnd(exit_code=0, killed=KillReason.TERMINATE, stop_reason=MAIN_NODE_EXITED), True, False,
     True, EXITED),
    (TERMINATED, True, False, False, MAIN_NODE_EXITED),
    (AttemptEnd(exit_code=143, killed=KillReason.TERMINATE), True, False, False, EXITED),
    # TerminateJob, of a node or of a plain job: the caller's reason, never a success
    (AttemptEnd(exit_code=0, killed=KillReason.TERMINATE, stop_reason="by user"), True, True,
     False, "by user"),
    (AttemptEnd(exit_code=0, killed=KillReason.TERMINATE, stop_reason="by user"), False, False,
     False, "by user"),
    (AttemptEnd(exit_code=137, killed=KillReason.TIMEOUT), True, False, False, TIMEOUT_REASON),
    (AttemptEnd(exit_code=0), False, False, True, EXITED),
])
def test_ending_outcome(end, multinode, terminated, succeeded, reason):
    outcome = ending_outcome(end, multinode=multinode, terminated=terminated)
    assert (outcome.succeeded, outcome.status_reason) == (succeeded, reason)
    assert outcome.container == attempt_outcome(end).container  # the exit code as it is


FAILED_1 = attempt_outcome(AttemptEnd(exit_code=1))
RULES_EXIT_ON_1 = [{"onExitCode": "1", "action": "EXIT"}]


@pytest.mark.parametrize("outcome, changes, status", [
    (attempt_outcome(AttemptEnd(exit_code=0)), {}, JobStatus.SUCCEEDED),
    (FAILED_1, {}, JobStatus.RUNNABLE),                               # attempts left: retried
    (FAILED_1, {"attempts_made": 3}, JobStatus.FAILED),               # none left
    (FAILED_1, {"multinode": True}, JobStatus.FAILED),                # a node is never retried
    (FAILED_1, {"stopped": True}, JobStatus.FAILED),                  # cancelled, terminated, closing
    (FAILED_1, {"exit_rules": RULES_EXIT_ON_1}, JobStatus.FAILED),    # evaluateOnExit says EXIT
    (attempt_outcome(AttemptEnd(exit_code=2)), {"exit_rules": RULES_EXIT_ON_1}, JobStatus.RUNNABLE),
    (attempt_outcome(AttemptEnd(exit_code=137, killed=KillReason.TIMEOUT)), {}, JobStatus.FAILED),
    (attempt_outcome(AttemptEnd(start_error="OSError")), {}, JobStatus.RUNNABLE),
    (attempt_outcome(AttemptEnd(start_error="OSError")),
     {"exit_rules": [{"onReason": "CannotStartContainerError*", "action": "EXIT"}]}, JobStatus.FAILED),
])
def test_next_status(outcome, changes, status):
    given = dict(attempts_made=1, max_attempts=3, exit_rules=[], multinode=False, stopped=False)
    given.update(changes)
    assert next_status(outcome, **given) is status


@pytest.mark.parametrize("failed, stop_reason, gate_failed, expected", [
    (False, None, False, (JobStatus.SUCCEEDED, None)),
    (False, "by user", True, (JobStatus.SUCCEEDED, None)),
    (True, None, False, (JobStatus.FAILED, CHILD_FAILED)),
    (True, None, True, (JobStatus.FAILED, DEPENDENCY_FAILED)),
    (True, "by user", True, (JobStatus.FAILED, "by user")),  # CancelJob/TerminateJob's first
])
def test_array_end(failed, stop_reason, gate_failed, expected):
    assert array_end(failed, stop_reason, gate_failed) == expected


# -- on real jobs ----------------------------------------------------------------------------
class FakeHandle:
    def __init__(self, exit_code=0, kill_reason=None, memory_exceeded=False):
        self._code, self.kill_reason, self.memory_exceeded = exit_code, kill_reason, memory_exceeded
        self.killed = []

    def exit_code(self):
        return self._code

    def kill(self, reason):
        self.killed.append(reason)


def job(**fields):
    return Job(JobSpec(job_id="j", name="n", queue="q", created=0, seq=1, **fields))


def multinode(**fields):
    return job(num_nodes=3, main_node=0, nodes=[{}, {}, {}], **fields)


def endings():
    ended = []
    dependencies = Dependencies(foreign_status=lambda job_id: None, ready=ended.append,
                                fail=ended.append)
    return Endings(dependencies, now_ms=lambda: 42)


def test_end_of_reads_the_handle():
    assert end_of(None, "OSError: no", "r") == AttemptEnd(start_error="OSError: no", stop_reason="r")
    handle = FakeHandle(exit_code=137, kill_reason=KillReason.MEMORY, memory_exceeded=True)
    assert end_of(handle, None, None) == AttemptEnd(exit_code=137, killed=KillReason.MEMORY,
                                                    memory_exceeded=True)


def test_record_end_completes_the_attempt_and_decides():
    unit = job(retry_strategy={"attempts": 2}).units[0]
    attempt = {"container": {"logStreamName": "d/default/t"}}
    status, reason = record_end(unit, attempt, AttemptEnd(exit_code=3), now=9, stopping=False)
    assert (status, reason) == (JobStatus.RUNNABLE, EXITED)
    assert attempt == {"container": {"logStreamName": "d/default/t", "exitCode": 3},
                       "startedAt": 9, "stoppedAt": 9, "statusReason": EXITED}  # never seen RUNNING
    assert unit.started == 9 and unit.attempts == [attempt]
    second = {"container": {}, "startedAt": 5}
    assert record_end(unit, second, AttemptEnd(exit_code=3), now=9, stopping=False)[0] is JobStatus.FAILED
    assert second["startedAt"] == 5
    unstarted = {"container": {}}
    record_end(job().units[0], unstarted, AttemptEnd(start_error="E"), now=9, stopping=True)
    assert "startedAt" not in unstarted and unstarted["statusReason"] == START_FAILED


def test_a_plain_job_ends_with_its_unit():
    ends, plain = endings(), job()
    ends.finalize(plain.units[0], JobStatus.SUCCEEDED, EXITED)
    assert (plain.status, plain.reason, list(ends.finished)) == (JobStatus.SUCCEEDED, EXITED, [plain])


def test_an_array_ends_with_its_last_child():
    ends, array = endings(), job(array_size=2)
    ends.finalize(array.units[0], JobStatus.FAILED, EXITED)
    assert array.status is not JobStatus.FAILED and not ends.finished
    ends.finalize(array.units[1], JobStatus.SUCCEEDED, EXITED)
    assert (array.status, array.reason, array.stopped) == (JobStatus.FAILED, CHILD_FAILED, 42)
    assert list(ends.finished) == [array]


def test_a_multinode_job_ends_with_its_main_node_and_stops_the_others():
    ends, nodes = endings(), multinode()
    main, running, runnable = nodes.units
    for unit, status in ((main, JobStatus.RUNNING), (running, JobStatus.RUNNING),
                         (runnable, JobStatus.RUNNABLE)):
        nodes.move(unit, status, 0)
    running.handle = FakeHandle()
    ends.finalize(main, JobStatus.FAILED, EXITED)
    assert (nodes.status, nodes.reason, list(ends.finished)) == (JobStatus.FAILED, EXITED, [nodes])
    assert running.handle.killed == [KillReason.TERMINATE] and running.stop_reason == MAIN_NODE_EXITED
    assert (runnable.status, runnable.reason) == (JobStatus.FAILED, MAIN_NODE_EXITED)


def test_a_job_with_too_many_tags_fails_unspawned():
    ends, array = endings(), job(array_size=3)
    ends.fail_unspawned(array, 7)
    assert (array.status, array.units, array.childless, list(ends.finished)) == (
        JobStatus.FAILED, [], True, [array])
    assert array.reason.startswith("ClientException:")


@pytest.mark.parametrize("terminate, status, ends_now, killed", [
    (False, JobStatus.RUNNABLE, True, False),   # CancelJob: what has not started fails
    (False, JobStatus.RUNNING, False, False),   # what has started goes on
    (True, JobStatus.PENDING, True, False),
    (True, JobStatus.RUNNING, False, True),     # TerminateJob kills what runs
    (True, JobStatus.SUCCEEDED, False, False),  # what has ended stays as it is
])
def test_stop(terminate, status, ends_now, killed):
    plain = job()
    unit = plain.units[0]
    plain.move(unit, status, 0)
    unit.handle = FakeHandle()
    finalized = []
    stop(plain, None, "by user", terminate=terminate,
         finalize=lambda u, s, r: finalized.append((u, s, r)))
    assert finalized == ([(unit, JobStatus.FAILED, "by user")] if ends_now else [])
    assert unit.handle.killed == ([KillReason.TERMINATE] if killed else [])
    assert unit.terminated is (terminate and (ends_now or killed))
    assert unit.cancelled is (not terminate and ends_now)


def test_terminating_a_unit_being_launched_kills_it_once_it_exists():
    plain = job()
    plain.move(plain.units[0], JobStatus.STARTING, 0)
    stop(plain, plain.units[0], "by user", terminate=True, finalize=lambda *a: None)
    assert plain.units[0].kill_pending is KillReason.TERMINATE


def test_the_shutdown_kills_every_attempt_and_records_those_without_a_process():
    running, launching = job(), job()
    running.move(running.units[0], JobStatus.RUNNING, 0)
    running.units[0].handle = handle = FakeHandle()
    launching.move(launching.units[0], JobStatus.STARTING, 0)
    handles = kill_for_shutdown([running.units[0]], [running, launching], "closing")
    assert handles == [handle] and handle.killed == [KillReason.SHUTDOWN]
    assert launching.units[0].kill_pending is KillReason.SHUTDOWN
    assert running.units[0].stop_reason == launching.units[0].stop_reason == "closing"
    unit = launching.units[0]
    unit.current = {"container": {}}
    abandon_attempt(unit, "closing", 5)
    assert unit.current is None
    assert unit.attempts == [{"container": {}, "stoppedAt": 5, "statusReason": "closing"}]
    abandon_attempt(unit, "closing", 6)  # no attempt under way: nothing recorded
    assert len(unit.attempts) == 1
