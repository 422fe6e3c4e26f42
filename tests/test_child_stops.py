"""Stopping array children under the stack's client policy (issue 28, point 4).

The client policy stops only jobs tagged batchfutures:stack, and an array child has no tags of
its own (TagResource: "ARNs for child jobs of array and multi-node parallel (MNP) jobs aren't
supported"), so AWS may refuse a stop of one child alone (batchfutures/childstops.py).

1. The decisions, table-tested: which ids a round of requests is sent to
   (`childstops.stop_calls`), and which failure is "this child cannot be stopped alone"
   (`childstops.refused_alone`).
2. A child's result that arrives after its future was aborted or cancelled changes nothing
   (real TrackedJobs and result objects).
3. On the emulator (threads launcher: the fast tier), through a recording wrapper around the real
   emulator client: an abort of every child of an array sends one stop, of the parent; with child
   stops refused (`FaultProfile(child_stops_refused=...)`) the refused child runs on, its result
   is ignored, the refusal is logged once at INFO and not sent again, and the executor ends.
"""

from __future__ import annotations

import functools
import logging
import threading
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Tuple

import pytest
from botocore.exceptions import ClientError
from test_session_threads import wait_until

from batchfutures import BatchExecutor, JobAbortedError, LocalEnvironment, wire
from batchfutures.batchapi import Stop, StopFailed, stop_jobs
from batchfutures.childstops import refused_alone, stop_calls
from batchfutures.emulator.faults import FaultProfile
from batchfutures.emulator.service import BatchEmulator
from batchfutures.futures import BatchFuture
from batchfutures.jobs import Actions, TrackedJob, settle
from batchfutures.reconcile import arrived

T, C = Stop.TERMINATE, Stop.CANCEL


# -- 1. the decisions ------------------------------------------------------------------------------
@pytest.mark.parametrize("array, terminate, cancel, wanted, waiting, refused, expected", [
    # nothing asked
    (True, {}, {}, True, True, False, []),
    # a plain job is its one child: always the job; a terminate covers a cancel
    (False, {0: "why"}, {}, False, False, False, [(T, "J", "why")]),
    (False, {}, {0: "c"}, False, False, False, [(C, "J", "c")]),
    (False, {0: "t"}, {0: "c"}, False, False, False, [(T, "J", "t")]),
    # every unfinished child aborted: one TerminateJob of the parent (which carries the tag)
    (True, {0: "a", 1: "b", 2: "a"}, {}, False, False, False, [(T, "J", "a")]),
    # ...and cancelled children with them: the terminate covers them
    (True, {0: "a"}, {1: "c"}, False, False, False, [(T, "J", "a")]),
    # a sibling still wanted (running): one TerminateJob per child
    (True, {2: "a", 0: "b"}, {}, True, False, False, [(T, "J:0", "b"), (T, "J:2", "a")]),
    # cancels as before: the parent when no other child waits to start, else per child
    (True, {}, {0: "c", 1: "c"}, True, False, False, [(C, "J", "c")]),
    (True, {}, {1: "c", 0: "c"}, True, True, False, [(C, "J:0", "c"), (C, "J:1", "c")]),
    # both kinds with a running sibling: children terminated, the rest cancelled on the parent
    (True, {0: "a"}, {1: "c"}, True, False, False, [(T, "J:0", "a"), (C, "J", "c")]),
    # a child stop of this job was refused before: no child stop is sent again ...
    (True, {0: "a"}, {1: "c"}, True, True, True, []),
    # ... but the whole job still is, when nothing else is wanted
    (True, {0: "a"}, {}, False, False, True, [(T, "J", "a")]),
    (True, {}, {0: "c"}, True, False, True, [(C, "J", "c")]),
])
def test_stop_calls(array, terminate, cancel, wanted, waiting, refused, expected):
    assert stop_calls("J", array=array, terminate=terminate, cancel=cancel,
                      others_wanted=wanted, others_waiting=waiting,
                      alone_refused=refused) == expected


@pytest.mark.parametrize("job_id, code, message, expected", [
    ("J:3", "AccessDeniedException", "User: x is not authorized to perform: batch:TerminateJob",
     True),
    ("J:3", "AccessDenied", "The caller isn't authorized", True),  # a bulk call's entry
    ("J:3", "ClientException", "User is not authorized to perform batch:CancelJob", True),
    ("J:3", "ClientException", "Job J:3 does not exist", False),  # a bad id, not a refusal
    ("J:3", "ThrottlingException", "Rate exceeded", False),  # batchapi sends it again
    ("J:3", "", "connection reset", False),
    ("J", "AccessDeniedException", "not authorized", False),  # the parent refused: a warning
    ("J#1", "AccessDeniedException", "not authorized", False),  # never sent: not a child here
])
def test_refused_alone(job_id, code, message, expected):
    assert refused_alone(job_id, code, message) is expected


def test_stop_failed_keeps_the_text_callers_log_and_the_code_apart():
    why = StopFailed("AccessDenied", "no")
    assert why == "AccessDenied: no" and (why.code, why.message) == ("AccessDenied", "no")
    error = ClientError({"Error": {"Code": "AccessDeniedException", "Message": "denied"},
                         "ResponseMetadata": {"HTTPStatusCode": 403}}, "TerminateJob")
    assert (StopFailed.of(error).code, StopFailed.of(error).message) == (
        "AccessDeniedException", "denied")
    assert StopFailed.of(OSError("reset")) == "reset" and StopFailed.of(OSError()).code == ""


# -- 2. a late result changes nothing -------------------------------------------------------------
def _job(per_child: bool) -> Tuple[TrackedJob, List[BatchFuture]]:
    futures = [BatchFuture() for _ in range(2)]
    job = TrackedJob("J", "memory://J", [[f] for f in futures], array=True,
                     item_counts=[1, 1] if per_child else None)
    return job, futures


def _apply(job: TrackedJob, actions: Actions) -> None:
    def never(*_: Any) -> BaseException:
        raise AssertionError("no failure is decided here")

    job.apply(actions, failure_for=never, no_result_error=never, expired_error=never,
              unplaceable_error=never)


def _stop(future: BatchFuture, how: str) -> None:
    """What Poller.request_abort / BatchFuture.cancel do to a future before any call is sent."""
    if how == "abort":
        assert settle(future, False, JobAbortedError("aborted", job_id=future.job_id))
    else:
        assert future.cancel()


@pytest.mark.parametrize("how", ["abort", "cancel"])
@pytest.mark.parametrize("per_child", [False, True])  # map_futures' futures, map's per-child one
@pytest.mark.parametrize("dropped", [False, True])  # before or after the poller's drop_settled
def test_a_result_arriving_after_the_future_was_stopped_changes_nothing(how, per_child, dropped):
    job, futures = _job(per_child)
    _stop(futures[0], how)
    if dropped:
        job.drop_settled((0,))
        assert 0 not in job.open_children
    results = {i: wire.pack_result([wire.encode_ok(10 + i)], {})
               for i in range(2)}
    # the reader's arrival (skips children no longer open), then a step that settles anyway
    _apply(job, arrived(results, array=True, open_=job.open_children))
    _apply(job, Actions(results=dict(results)))
    if how == "abort":
        assert type(futures[0].exception()) is JobAbortedError
    else:
        assert futures[0].cancelled()
    value = futures[1].result()
    assert (value() if per_child else value) == ([(True, 11)] if per_child else 11)
    assert job.done


# -- 3. on the emulator --------------------------------------------------------------------------
# a call blocks here until the test lets it go (the threads launcher runs it in this process)
GATE = threading.Event()


def wait_for_gate(x: int) -> int:
    if not GATE.wait(60):
        raise TimeoutError("the test never opened the gate")
    return x


class Recording:
    """The real emulator client, each call recorded; the poller's DescribeJobs can be held (so
    that requests queued meanwhile are sent in its next round, together)."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.calls: List[Tuple[str, Dict[str, Any]]] = []
        self.passing = threading.Event()
        self.passing.set()
        self.held = threading.Event()

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._client, name)
        if name.startswith("_") or not callable(method):
            return method

        @functools.wraps(method)
        def recorded(**params: Any) -> Any:
            if name == "describe_jobs" and not self.passing.is_set() \
                    and threading.current_thread().name == "batchfutures-poller":
                self.held.set()
                self.passing.wait(60)
            self.calls.append((name, params))
            return method(**params)

        return recorded

    def stops(self) -> List[Tuple[str, List[str]]]:
        """(operation, job ids) of every stop call, in order."""
        return [(name, params.get("jobs") or [params.get("jobId")])
                for name, params in self.calls
                if name in ("cancel_job", "cancel_jobs", "terminate_job", "terminate_jobs")]


class RecordedEnvironment(LocalEnvironment):
    """A local environment on the threads launcher whose Batch client is recorded."""

    def __init__(self, workdir: Path, faults: FaultProfile, vcpus: int = 4) -> None:
        super().__init__(workdir, max_vcpus=vcpus)
        self._emulator = BatchEmulator(self.workdir / "emulator", launcher="threads",
                                       max_vcpus=vcpus, faults=faults)
        self.recording = Recording(self._emulator)

    @property
    def batch(self) -> Any:
        return self.recording


@pytest.fixture
def make_env(tmp_path: Path) -> Iterator[Callable[..., RecordedEnvironment]]:
    GATE.clear()
    made: List[RecordedEnvironment] = []

    def make(faults: FaultProfile = FaultProfile(), vcpus: int = 4) -> RecordedEnvironment:
        made.append(RecordedEnvironment(tmp_path / f"work{len(made)}", faults, vcpus))
        return made[-1]

    yield make
    GATE.set()
    for env in made:
        env.recording.passing.set()
        env.emulator.close()


def gated_array(executor: BatchExecutor, size: int) -> Tuple[List[Any], str]:
    """An array job of ``size`` children, each blocked on GATE; its futures once submitted."""
    futures = executor.map_futures(wait_for_gate, range(size), chunksize=1)
    assert wait_until(lambda: all(f.job_id for f in futures))
    parent = futures[0].job_id.split(":")[0]
    assert [f.job_id for f in futures] == [f"{parent}:{i}" for i in range(size)]
    return futures, parent


def status(env: RecordedEnvironment, job_id: str) -> str:
    return env.emulator.describe_jobs(jobs=[job_id])["jobs"][0]["status"]


def test_aborting_every_child_of_an_array_sends_one_stop_of_the_parent(make_env):
    env = make_env()
    with BatchExecutor(env, vcpus=1, memory=256, ship_local_modules=False) as executor:
        futures, parent = gated_array(executor, 4)
        env.recording.passing.clear()  # the poller's next DescribeJobs waits ...
        assert env.recording.held.wait(60)
        for future in futures:  # ... while every child is aborted
            assert future.abort("not needed")
        env.recording.passing.set()
        for future in futures:
            assert type(future.exception(timeout=60)) is JobAbortedError
        assert wait_until(lambda: status(env, parent) == "FAILED")
    assert env.recording.stops() == [("terminate_jobs", [parent])]
    children = env.emulator.describe_jobs(jobs=[f.job_id for f in futures])["jobs"]
    assert {child["status"] for child in children} == {"FAILED"}


def test_aborting_one_child_while_a_sibling_runs_stops_that_child_alone(make_env):
    env = make_env()
    with BatchExecutor(env, vcpus=1, memory=256, ship_local_modules=False) as executor:
        futures, parent = gated_array(executor, 2)
        assert futures[0].abort("not needed")
        assert wait_until(lambda: status(env, f"{parent}:0") == "FAILED")
        GATE.set()
        assert futures[1].result(timeout=60) == 1
    assert env.recording.stops() == [("terminate_jobs", [f"{parent}:0"])]


def test_the_emulator_refuses_child_stops_when_told_and_stops_the_parent(make_env):
    env = make_env(FaultProfile(child_stops_refused=frozenset({"CancelJob", "TerminateJob"})))
    emulator = env.emulator
    parent = emulator.submit_job(jobName="held", jobQueue="batchfutures",
                                 jobDefinition="batchfutures-worker", arrayProperties={"size": 2},
                                 containerOverrides={"command": ["true"], "resourceRequirements": [
                                     {"type": "VCPU", "value": "8"}]})["jobId"]  # never placed
    with pytest.raises(ClientError) as refused:
        emulator.terminate_job(jobId=f"{parent}:0", reason="one child")
    assert refused.value.response["Error"]["Code"] == "AccessDeniedException"
    assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    failed = stop_jobs(emulator, Stop.CANCEL, [f"{parent}:1"], "one child")
    assert failed[f"{parent}:1"].code == "AccessDenied"
    assert emulator.faults.refused == 2 and status(env, f"{parent}:0") != "FAILED"
    assert stop_jobs(emulator, Stop.CANCEL, [parent], "the whole job") == {}
    assert wait_until(lambda: status(env, parent) == "FAILED")
    with pytest.raises(ValueError, match="child_stops_refused"):
        FaultProfile(child_stops_refused=frozenset({"SubmitJob"}))


REFUSING = FaultProfile(child_stops_refused=frozenset({"CancelJob", "TerminateJob"}))


def refusals(caplog: Any) -> List[logging.LogRecord]:
    return [r for r in caplog.records if "refused" in r.getMessage()]


def test_a_refused_child_runs_on_and_its_result_is_ignored(make_env, caplog):
    caplog.set_level(logging.INFO, logger="batchfutures")
    env = make_env(REFUSING)
    with BatchExecutor(env, vcpus=1, memory=256, ship_local_modules=False) as executor:
        futures, parent = gated_array(executor, 2)
        assert futures[0].abort("not needed")
        assert type(futures[0].exception(timeout=60)) is JobAbortedError
        assert wait_until(lambda: env.emulator.faults.refused == 1)
        GATE.set()  # both calls return: the refused child finishes and writes its result
        assert futures[1].result(timeout=60) == 1
        assert wait_until(lambda: status(env, f"{parent}:0") == "SUCCEEDED")
    assert type(futures[0].exception()) is JobAbortedError  # not the result it wrote
    assert env.recording.stops() == [("terminate_jobs", [f"{parent}:0"])]  # sent once
    (record,) = refusals(caplog)
    assert record.levelno == logging.INFO and f"{parent}:0" in record.getMessage()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_after_a_refusal_no_child_stop_is_sent_and_the_last_abort_stops_the_job(make_env,
                                                                                  caplog):
    caplog.set_level(logging.INFO, logger="batchfutures")
    env = make_env(REFUSING)
    executor = BatchExecutor(env, vcpus=1, memory=256, ship_local_modules=False)
    poller = executor._session.poller
    futures, parent = gated_array(executor, 4)
    env.recording.passing.clear()
    assert env.recording.held.wait(60)
    assert futures[0].abort("first") and futures[1].abort("first")  # one call, both refused
    env.recording.passing.set()
    assert wait_until(lambda: env.emulator.faults.refused == 2)
    assert futures[2].abort("second")  # refused too, surely: not sent
    assert wait_until(lambda: not poller._requests)  # taken by a round of its own
    assert futures[3].abort("last")  # none is wanted now: the whole job, which is allowed
    assert wait_until(lambda: status(env, parent) == "FAILED")
    executor.shutdown(wait=True)  # ends, with the calls still blocked (a thread is not killed)
    assert all(type(f.exception()) is JobAbortedError for f in futures)
    assert env.recording.stops() == [("terminate_jobs", [f"{parent}:0", f"{parent}:1"]),
                                     ("terminate_jobs", [parent])]
    assert env.emulator.faults.refused == 2
    assert len(refusals(caplog)) == 1  # once per job
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_refused_child_cancel_leaves_its_future_cancelled_and_its_run_ignored(make_env, caplog):
    caplog.set_level(logging.INFO, logger="batchfutures")
    env = make_env(REFUSING, vcpus=2)  # children 0 and 1 run (blocked); 2 and 3 wait RUNNABLE
    with BatchExecutor(env, vcpus=1, memory=256, ship_local_modules=False) as executor:
        futures, parent = gated_array(executor, 4)
        assert futures[3].cancel()  # not started: cancelled; child 2 still waits to start
        assert wait_until(lambda: env.emulator.faults.refused == 1)
        GATE.set()  # every child runs, the refused one too, once a vCPU is free
        assert [f.result(timeout=60) for f in futures[:3]] == [0, 1, 2]
        assert wait_until(lambda: status(env, f"{parent}:3") == "SUCCEEDED")
    assert futures[3].cancelled()
    assert env.recording.stops() == [("cancel_jobs", [f"{parent}:3"])]
    (record,) = refusals(caplog)
    assert record.levelno == logging.INFO and "cancel" in record.getMessage()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_the_cli_says_to_cancel_the_whole_job_when_a_child_alone_is_refused(make_env, monkeypatch,
                                                                             capsys):
    from batchfutures.cli import jobcommands
    from batchfutures.cli.app import main

    env = make_env(FaultProfile(child_stops_refused=frozenset({"TerminateJob"})))
    parent = env.emulator.submit_job(
        jobName="held", jobQueue="batchfutures", jobDefinition="batchfutures-worker",
        arrayProperties={"size": 2}, containerOverrides={"command": ["true"], "resourceRequirements": [
            {"type": "VCPU", "value": "8"}]})["jobId"]  # never placed: it stays unfinished
    monkeypatch.setattr(jobcommands, "environment", lambda args: env)  # the test's emulator
    assert main(["cancel", f"{parent}:0"]) == 1
    error = capsys.readouterr().err
    assert "may not stop one child of an array alone" in error and "Traceback" not in error
    assert f"batchfutures cancel {parent}`" in error
    assert main(["cancel", parent]) == 0  # the whole job can be stopped
    assert "termination requested" in capsys.readouterr().out
