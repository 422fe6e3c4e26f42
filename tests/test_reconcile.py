"""Table tests of the poller's reasoning: milliseconds, no processes, no threads.

`World` holds what AWS Batch and storage hold for one job, in dicts, and answers the calls the
poller makes in botocore's shapes (DescribeJobs, ListJobs with pages, CancelJob; GET and LIST of
result objects). It can do what AWS does and the embedded emulator does not by default: show a
stale `statusSummary` (`freeze_summary`), leave a child out of ListJobs for a while (`hide`),
fail one read (`fail`). Each poll runs the real `Poller.examine` (reads, `reconcile`, apply) on
a real `TrackedJob` with real futures and real result objects.

Where a test says "old code", the poller before reconcile.py got it wrong: it committed the
summary before its reads (one failed read stranded the job), trusted the counts ("every child
finished" meant "the waiting ones succeeded"), and read any unknown reason as an abort.
"""

from __future__ import annotations

import collections
import sys
from typing import Any, Dict, List, Optional, Set

import pytest
from botocore.exceptions import ClientError

from batchfutures import wire
from batchfutures.errors import (
    BatchError,
    HostTerminatedError,
    JobAbortedError,
    JobFailedError,
    JobMetadataExpired,
    JobTimeoutError,
    JobUnplaceableError,
    MemoryLimitExceeded,
    RemoteError,
    classify_failure,
)
from batchfutures.futures import BatchFuture
from batchfutures.jobs import ChildState, JobFacts, JobStatus, TrackedJob
from batchfutures.poller import Poller
from batchfutures.reconcile import Reads, reconcile
from batchfutures.results import ReadFailed

MISCONFIGURED = ("MISCONFIGURATION:JOB_RESOURCE_REQUIREMENT - The job resource requirement "
                 "(vCPU/memory/GPU) is higher than that can be met by the CE(s) attached to the "
                 "job queue.")
EXITED = "Essential container in task exited"
OOM = "OutOfMemoryError: Container killed due to memory usage"


def result_object(*values: Any) -> bytes:
    return wire.pack_result([wire.encode_ok(v) for v in values], {})


class ExitsWhenLoaded:
    """A value whose unpickling raises SystemExit (as CPython's test suite does to executors)."""

    def __reduce__(self):
        return (sys.exit, (3,))


class World:
    """AWS Batch and storage for one job, as dicts; answers the poller's calls."""

    def __init__(self, size: int, job_id: str = "arr-1", *, array: Optional[bool] = None) -> None:
        self.job_id, self.size = job_id, size
        self.array = size > 1 if array is None else array
        self.parent: Dict[str, Any] = {"status": "PENDING"}
        self.children: Dict[int, Dict[str, Any]] = {i: {"status": "PENDING"} for i in range(size)}
        self.results: Dict[int, bytes] = {}
        self.frozen: Optional[Dict[str, int]] = None   # a stale statusSummary, when set
        self.hidden: Set[int] = set()                  # children ListJobs does not show yet
        self.faults: Dict[str, int] = {}               # operation -> failures left
        self.calls: collections.Counter = collections.Counter()
        self.cancelled: List[tuple] = []

    # -- setting the scene ---------------------------------------------------------------------
    def child(self, index: int, status: str, reason: Optional[str] = None,
              exit_code: Optional[int] = None, container_reason: Optional[str] = None,
              result: Any = ..., **flags: Any) -> None:
        child = {"status": status}
        if reason:
            child["statusReason"] = reason
        container = {}
        if exit_code is not None:
            container["exitCode"] = exit_code
        if container_reason:
            container["reason"] = container_reason
        child["container"] = container
        child.update(flags)
        self.children[index] = child
        if result is not ...:
            self.results[index] = result if isinstance(result, bytes) else result_object(result)

    def succeed(self, *indices: int) -> None:
        for index in indices:
            self.child(index, "SUCCEEDED", exit_code=0, result=index * 10)

    def finish(self, status: Optional[str] = None, reason: Optional[str] = None) -> None:
        failed = any(c["status"] == "FAILED" for c in self.children.values())
        self.parent["status"] = status or ("FAILED" if failed else "SUCCEEDED")
        if reason:
            self.parent["statusReason"] = reason

    def freeze_summary(self) -> None:
        self.frozen = self.true_summary()

    def thaw_summary(self) -> None:
        self.frozen = None

    def fail(self, operation: str, times: int = 1) -> None:
        self.faults[operation] = times

    def true_summary(self) -> Dict[str, int]:
        return dict(collections.Counter(c["status"] for c in self.children.values()))

    def _maybe_fail(self, operation: str) -> None:
        self.calls[operation] += 1
        if self.faults.get(operation, 0) > 0:
            self.faults[operation] -= 1
            if operation in ("GetObject", "ListObjects"):
                raise OSError(f"503 SlowDown ({operation}, after s3fs's retries)")
            raise ClientError({"Error": {"Code": "AccessDeniedException", "Message": "no"},
                               "ResponseMetadata": {"HTTPStatusCode": 403}}, operation)

    # -- Batch ---------------------------------------------------------------------------------
    def describe_parent(self) -> Optional[Dict[str, Any]]:
        found = self.describe_jobs(jobs=[self.job_id])["jobs"]
        return found[0] if found else None

    def _detail(self, index: int) -> Dict[str, Any]:
        child = self.children[index]
        detail = {"jobId": f"{self.job_id}:{index}" if self.array else self.job_id,
                  "status": child["status"],
                  "attempts": [{"container": dict(child.get("container") or {}),
                                "statusReason": child.get("statusReason")}]
                  if child.get("container") else [],
                  "container": {"resourceRequirements": [{"type": "VCPU", "value": "64"},
                                                         {"type": "MEMORY", "value": "512"}]}}
        for key in ("statusReason", "isCancelled", "isTerminated"):
            if key in child:
                detail[key] = child[key]
        return detail

    def describe_jobs(self, jobs: List[str]) -> Dict[str, Any]:
        self._maybe_fail("DescribeJobs")
        found = []
        for job_id in jobs:
            if job_id == self.job_id and self.parent.get("forgotten"):
                continue
            if job_id == self.job_id and self.array:
                detail = {"jobId": self.job_id, **{k: v for k, v in self.parent.items()}}
                detail["container"] = {"resourceRequirements": [
                    {"type": "VCPU", "value": "64"}, {"type": "MEMORY", "value": "512"}]}
                summary = self.frozen if self.frozen is not None else self.true_summary()
                detail["arrayProperties"] = {"size": self.size, "statusSummary": dict(summary)}
                found.append(detail)
            elif job_id == self.job_id:
                found.append(self._detail(0))
            else:
                index = int(job_id.rpartition(":")[2])
                found.append(self._detail(index))
        return {"jobs": found}

    def list_jobs(self, arrayJobId: str, jobStatus: str, maxResults: int = 1000,
                  nextToken: Optional[str] = None) -> Dict[str, Any]:
        self._maybe_fail(f"ListJobs:{jobStatus}")
        items = [{"jobId": f"{arrayJobId}:{i}", "status": c["status"],
                  "arrayProperties": {"index": i}, "statusReason": c.get("statusReason"),
                  "container": dict(c.get("container") or {})}
                 for i, c in sorted(self.children.items())
                 if c["status"] == jobStatus and i not in self.hidden]
        start = int(nextToken or 0)
        page = items[start:start + maxResults]
        response: Dict[str, Any] = {"jobSummaryList": page}
        if start + maxResults < len(items):
            response["nextToken"] = str(start + maxResults)
        return response

    def cancel_job(self, jobId: str, reason: str) -> Dict[str, Any]:
        self.calls["CancelJob"] += 1
        self.cancelled.append((jobId, reason))
        return {}

    # -- storage ---------------------------------------------------------------------------------
    def read_result(self, job_url: str, index: int) -> Optional[bytes]:
        self._maybe_fail("GetObject")
        return self.results.get(index)

    def list_results(self, job_url: str, start: int = 0) -> Set[int]:
        self._maybe_fail("ListObjects")
        return {index for index in self.results if index >= start}


class Owner:
    """What owns a poller (a Session in the package); only weakly referenced by it. Nothing
    buffered here."""

    def flush_due(self):
        pass

    def next_flush_delay(self):
        return float("inf")

    def has_pending(self):
        return False


class Rig:
    """One TrackedJob, its futures, the World and a Poller that is never started (no thread)."""

    def __init__(self, world: World, *, per_child: int = 1, runnable_timeout=None,
                 grace: float = 60.0) -> None:
        self.world = world
        self.owner = Owner()
        self.poller = Poller(self.owner, batch=lambda: world, storage=world,
                             min_interval=0.01, max_interval=0.1, grace=grace,
                             check_interval=30.0)
        self.futures = [[BatchFuture() for _ in range(per_child)] for _ in range(world.size)]
        self.job = TrackedJob(world.job_id, "mem://run/job", self.futures, array=world.array,
                              memory_mib=512, submitted_at=0.0, runnable_timeout=runnable_timeout)
        self.now = 100.0

    def poll(self, advance: float = 1.0) -> bool:
        """One poll of this job, as the poller thread does it; False when a read failed."""
        self.now += advance
        description = self.world.describe_parent()
        try:
            self.poller.examine(self.job, description, self.world, now=self.now)
        except Exception:
            return False
        finally:  # results are read in the background: settle what they brought
            self.poller.apply_arrivals(wait=True)
        return True

    def future(self, index: int) -> BatchFuture:
        return self.futures[index][0]

    def settled(self) -> Dict[int, Any]:
        """index -> result or exception type, for the settled children."""
        out = {}
        for index, group in enumerate(self.futures):
            future = group[0]
            if future.done():
                out[index] = future.exception() or future.result()
        return out

    def committed(self) -> tuple:
        job = self.job
        return (job.status, dict(job.summary), tuple(job.states), job.unresolved,
                job.stuck_since, job.checked_at)


# -- baseline ------------------------------------------------------------------------------------
def test_an_array_that_succeeds_settles_every_future():
    world = World(5)
    rig = Rig(world)
    world.succeed(*range(5))
    world.finish()
    assert rig.poll()
    assert [rig.future(i).result() for i in range(5)] == [0, 10, 20, 30, 40]
    assert rig.job.done and set(rig.job.states) == {ChildState.SETTLED}
    assert world.calls["GetObject"] == 5  # one GET per finished child, no storage listing
    assert world.calls["ListObjects"] == 0


def test_nothing_changed_means_no_reads_at_all():
    world = World(4)
    world.child(0, "RUNNING")
    rig = Rig(world)
    assert rig.poll()
    before = sum(world.calls.values())
    for _ in range(5):
        assert rig.poll()
    assert sum(world.calls.values()) - before == 5  # the parent's DescribeJobs only
    # running children are never listed (pages would grow with them): while some wait to
    # start, nobody knows which run
    assert not any(f.running() for group in rig.futures for f in group)


def test_running_children_are_never_listed_and_run_once_none_waits_to_start():
    world = World(4)
    rig = Rig(world)
    for index in range(4):
        world.child(index, "RUNNING" if index < 3 else "RUNNABLE")
    assert rig.poll()
    assert not any(rig.future(i).running() for i in range(4))
    world.child(3, "STARTING")
    assert rig.poll()
    assert all(rig.future(i).running() for i in range(4))
    assert not rig.future(0).cancel()  # as ProcessPoolExecutor: a running call is not cancelled
    world.succeed(0, 1, 2, 3)
    world.finish()
    assert rig.poll()
    assert [rig.future(i).result() for i in range(4)] == [0, 10, 20, 30]
    assert not any(op in world.calls for op in ("ListJobs:RUNNING", "ListJobs:STARTING"))


# -- counts lag: they are hints -------------------------------------------------------------------
def test_a_finished_parent_with_a_stale_summary_still_settles_from_storage():
    """The summary still says RUNNING when the parent is SUCCEEDED (statusSummary lags)."""
    world = World(4)
    for i in range(4):
        world.child(i, "RUNNING")
    rig = Rig(world)
    rig.poll()
    world.freeze_summary()
    world.succeed(*range(4))
    world.finish()
    assert rig.poll()
    assert [rig.future(i).result() for i in range(4)] == [0, 10, 20, 30]


def test_successes_hidden_by_a_frozen_summary_are_found_once_it_moves():
    world = World(6)
    rig = Rig(world)
    world.freeze_summary()  # PENDING: 6, for a long while
    world.succeed(0, 1, 2)
    for _ in range(3):
        rig.poll()
    assert rig.settled() == {}  # counts did not move: nothing read yet (no speculative GETs)
    assert world.calls["GetObject"] == 0
    world.thaw_summary()
    rig.poll()
    assert rig.settled() == {0: 0, 1: 10, 2: 20}


def test_a_summary_that_goes_backwards_loses_nothing():
    """Two DescribeJobs answered from replicas of different ages."""
    world = World(4)
    rig = Rig(world)
    world.freeze_summary()
    stale = dict(world.frozen)
    world.succeed(0, 1)
    world.thaw_summary()
    rig.poll()
    world.frozen = stale  # older than what the last poll saw
    world.succeed(2)
    rig.poll()
    world.thaw_summary()
    world.succeed(3)
    world.finish()
    rig.poll()
    assert [rig.future(i).result() for i in range(4)] == [0, 10, 20, 30]


def test_oom_child_with_lagging_counts_is_memory_limit_exceeded_never_no_result():
    """Old code: FAILED counted once while ListJobs did not show the child yet; the next poll's
    "every child finished" branch took the waiting ones as succeeded and the OOM-killed child
    failed as "succeeded but wrote no result"."""
    world = World(6)
    rig = Rig(world)
    world.succeed(0, 1, 2)
    world.child(3, "RUNNING")
    world.child(4, "RUNNING")
    world.child(5, "FAILED", EXITED, 137, OOM)
    world.hidden = {5}  # ListJobs has not caught up with child 5
    assert rig.poll()
    assert 5 not in rig.settled()
    world.hidden = set()
    world.succeed(3, 4)  # every child has finished; the parent still says RUNNING
    world.parent["status"] = "RUNNING"
    assert rig.poll()
    assert not isinstance(rig.settled().get(5), RemoteError)
    world.finish()
    assert rig.poll()
    error = rig.future(5).exception()
    assert type(error) is MemoryLimitExceeded and error.memory_mib == 512
    assert [rig.future(i).result() for i in range(5)] == [0, 10, 20, 30, 40]


def test_failed_count_lagging_behind_the_listing_still_types_the_failure():
    world = World(3)
    rig = Rig(world)
    world.freeze_summary()
    world.child(1, "FAILED", EXITED, 3)
    world.succeed(0, 2)
    world.finish()  # parent FAILED, the summary still says PENDING: 3
    assert rig.poll()
    assert type(rig.future(1).exception()) is JobFailedError
    assert rig.future(1).exception().exit_code == 3
    assert [rig.future(i).result() for i in (0, 2)] == [0, 20]


def test_a_finished_job_is_examined_every_poll_until_each_child_is_settled():
    world = World(3)
    rig = Rig(world)
    world.succeed(0, 1)
    world.child(2, "FAILED", EXITED, 1)
    world.hidden = {2}
    world.finish()
    rig.poll()
    assert 2 not in rig.settled()  # neither listing names it yet: it waits, it does not guess
    rig.poll()
    assert 2 not in rig.settled()
    world.hidden = set()
    rig.poll()  # same summary, same status: examined again because it is finished
    assert type(rig.future(2).exception()) is JobFailedError


def test_a_child_batch_lists_as_succeeded_without_a_result_fails_as_no_result():
    world = World(3)
    rig = Rig(world)
    world.succeed(0, 2)
    world.child(1, "SUCCEEDED", exit_code=0)  # os._exit(0) before the worker wrote anything
    world.finish()
    rig.poll()  # every child's result is read at once (the job SUCCEEDED); child 1 has none
    assert not rig.future(1).done()
    rig.poll()  # so storage is listed, and ListJobs(SUCCEEDED) confirms it succeeded
    error = rig.future(1).exception()
    assert isinstance(error, RemoteError) and "succeeded but wrote no result" in str(error)
    assert world.calls["ListJobs:SUCCEEDED"] == 1
    assert rig.future(1).status == "SUCCEEDED"


def test_a_parent_failed_before_any_child_is_classified_from_its_own_description():
    """Old code: "every child finished" with no child listed: each future "succeeded but wrote
    no result" (or, with a reason outside its list, JobAbortedError)."""
    world = World(4)
    world.children = {}
    rig = Rig(world)
    reason = "Job has more than 50 tags: 51 tags were given"
    world.finish("FAILED", reason)
    assert rig.poll()
    for i in range(4):
        error = rig.future(i).exception()
        assert type(error) is JobFailedError and error.status_reason == reason
        assert error.job_id == "arr-1"
    assert world.calls["GetObject"] == 0  # no child, nothing to read


# -- a failed read commits nothing ----------------------------------------------------------------
STEPS = ["ListJobs:FAILED", "DescribeJobs", "ListObjects", "ListJobs:SUCCEEDED"]


@pytest.mark.parametrize("step", STEPS)
def test_a_read_that_fails_commits_nothing_and_the_next_poll_settles_every_child(step):
    """Old code saved summary and status first: after one failed read every later poll saw
    "no change" and the job's futures never resolved."""
    world = World(6)
    rig = Rig(world)
    world.child(0, "RUNNING")
    world.child(1, "RUNNING")
    world.child(2, "RUNNING")
    assert rig.poll()
    before = rig.committed()
    world.succeed(0, 3)
    world.child(1, "FAILED", EXITED, 2)
    world.child(2, "RUNNING")
    world.child(4, "SUCCEEDED", exit_code=0)  # Batch says so; no result object
    world.child(5, "RUNNING")
    description = world.describe_parent()
    world.fail(step)  # every one of these reads is needed by this poll: each is tried in turn
    if step == "ListJobs:SUCCEEDED":  # asked only of a finished job whose child has no result
        world.finish()
        description = world.describe_parent()
    with pytest.raises((ClientError, OSError)):
        rig.poller.examine(rig.job, description, world, now=rig.now + 1)
    assert world.faults[step] == 0  # the fault was hit
    assert rig.committed() == before  # nothing committed
    assert not any(f.done() for group in rig.futures for f in group)
    world.faults = {}
    world.child(2, "SUCCEEDED", exit_code=0, result=20)
    world.child(5, "SUCCEEDED", exit_code=0, result=50)
    world.finish()
    for _ in range(3):
        rig.poll()
    settled = rig.settled()
    assert {i: settled.get(i) for i in (0, 2, 3, 5)} == {0: 0, 2: 20, 3: 30, 5: 50}
    assert type(settled[1]) is JobFailedError and settled[1].exit_code == 2
    assert isinstance(settled[4], RemoteError) and "no result" in str(settled[4])
    assert rig.job.done


def test_a_result_read_that_fails_is_read_again_and_the_rest_are_settled_meanwhile():
    """Results are read in the background: a failed GET does not hold up the other children."""
    world = World(4)
    rig = Rig(world)
    world.succeed(0, 1, 2, 3)
    world.finish()
    world.fail("GetObject")
    rig.poll()
    assert sum(rig.future(i).done() for i in range(4)) == 3
    assert len(rig.job.view(rig.now).reread) == 1
    rig.poll()
    assert [rig.future(i).result() for i in range(4)] == [0, 10, 20, 30]
    assert world.calls["GetObject"] == 5


@pytest.mark.parametrize("step", ["ListJobs:FAILED", "DescribeJobs", "ListObjects", "ListJobs:SUCCEEDED"])
def test_each_read_of_a_finished_job_failing_once_is_survived(step):
    """The same, with the job already finished when its reads fail (one failure per step)."""
    world = World(4)
    rig = Rig(world)
    world.succeed(0, 2)
    world.child(1, "FAILED", EXITED, 5)
    world.child(3, "SUCCEEDED", exit_code=0)  # no result: needs ListJobs(SUCCEEDED)
    world.finish()
    description = world.describe_parent()
    world.fail(step)
    before = rig.committed()
    with pytest.raises((ClientError, OSError)):
        rig.poller.examine(rig.job, description, world, now=101.0)
    assert world.faults[step] == 0  # the fault was hit
    assert rig.committed() == before
    assert not any(f.done() for group in rig.futures for f in group)
    rig.poll()
    settled = rig.settled()
    assert settled[0] == 0 and settled[2] == 20
    assert type(settled[1]) is JobFailedError
    assert isinstance(settled[3], RemoteError)


# -- what a failure means ---------------------------------------------------------------------------
REASONS = [
    # (child fields, expected type)
    (dict(reason=EXITED, exit_code=1, container_reason=OOM), MemoryLimitExceeded),
    (dict(reason="Job attempt duration exceeded timeout", exit_code=137), JobTimeoutError),
    (dict(reason="Host EC2 (instance i-0abc) terminated."), HostTerminatedError),
    (dict(reason="Your Spot Task was interrupted."), HostTerminatedError),
    (dict(reason="Timeout waiting for network interface provisioning to complete."), JobFailedError),
    (dict(reason="CannotPullContainerError: pull access denied"), JobFailedError),
    (dict(reason="some words another client wrote", isTerminated=True), JobAbortedError),
    (dict(reason="not needed any more", isCancelled=True), JobAbortedError),
    (dict(reason="batchfutures: aborted by the user"), JobAbortedError),
]


@pytest.mark.parametrize("fields, expected", REASONS, ids=[f["reason"][:30] for f, _ in REASONS])
def test_a_failed_childs_reason_decides_its_type(fields, expected):
    """Old code: any reason outside a fixed list was JobAbortedError (Fargate's ENI timeout, a
    Spot interruption)."""
    world = World(2)
    rig = Rig(world)
    world.succeed(0)
    world.child(1, "FAILED", **fields)
    world.finish()
    rig.poll()
    error = rig.future(1).exception()
    assert type(error) is expected
    assert error.status_reason == fields["reason"] and error.job_id == "arr-1:1"


def test_timeout_reason_is_a_timeout_error():
    error = classify_failure({"jobId": "j", "status": "FAILED",
                              "statusReason": "Job attempt duration exceeded timeout",
                              "timeout": {"attemptDurationSeconds": 60}})
    assert type(error) is JobTimeoutError and "60 s" in str(error)


# -- results that cannot be loaded ------------------------------------------------------------------
def test_a_result_whose_unpickling_raises_system_exit_fails_only_its_own_future():
    world = World(3)
    rig = Rig(world, per_child=2)
    world.succeed(0, 2)
    world.child(1, "SUCCEEDED", exit_code=0,
                result=wire.pack_result([wire.encode_ok(ExitsWhenLoaded()),
                                                  wire.encode_ok("fine")], {}))
    world.finish()
    assert rig.poll()
    bad, good = rig.futures[1]
    assert isinstance(bad.exception(), SystemExit)
    assert good.result() == "fine"
    assert rig.futures[0][0].result() == 0 and rig.futures[2][0].result() == 20


def test_a_corrupt_result_object_fails_its_child_with_a_remote_error():
    world = World(2)
    rig = Rig(world)
    world.succeed(0)
    world.child(1, "SUCCEEDED", exit_code=0, result=b"not a result object")
    world.finish()
    rig.poll()
    assert isinstance(rig.future(1).exception(), RemoteError)
    assert rig.future(0).result() == 0


# -- a job Batch forgot -----------------------------------------------------------------------------
def test_a_forgotten_job_is_settled_from_storage_then_expires_with_batchs_retention():
    world = World(3)
    rig = Rig(world, grace=10.0)
    world.results[0] = result_object("kept")
    world.parent["forgotten"] = True
    rig.now = 5.0  # inside the grace period: DescribeJobs may just not show it yet
    rig.poll(advance=0)
    assert rig.settled() == {} and world.calls["ListObjects"] == 0
    rig.now = 20.0
    rig.poll(advance=0)
    assert rig.future(0).result() == "kept"
    for i in (1, 2):
        error = rig.future(i).exception()
        assert isinstance(error, JobMetadataExpired)
        assert "at least 7 days" in str(error) and "24 hours" not in str(error)
    assert world.calls["ListObjects"] == 1


# -- RUNNABLE with a reason Batch cannot get past -------------------------------------------------
def test_a_plain_job_held_runnable_shows_why_and_is_cancelled_after_runnable_timeout():
    world = World(1, "plain-1")
    rig = Rig(world, runnable_timeout=600)
    world.child(0, "RUNNABLE", MISCONFIGURED)
    rig.poll()
    future = rig.future(0)
    assert future.status == "RUNNABLE" and future.status_reason == MISCONFIGURED
    assert not future.done()
    rig.poll(advance=599)
    assert not future.done() and not world.cancelled
    rig.poll(advance=2)
    error = future.exception()
    assert type(error) is JobUnplaceableError and isinstance(error, JobFailedError)
    assert error.status_reason == MISCONFIGURED and "64 vCPUs" in str(error)
    assert "runnable_timeout=600s" in str(error)
    assert world.cancelled == [("plain-1", world.cancelled[0][1])]
    assert world.cancelled[0][1].startswith("batchfutures:")


def test_a_runnable_job_without_runnable_timeout_waits_and_shows_why(caplog, monkeypatch):
    import logging

    # a library's logging.config (moto, cfn-lint) may have disabled existing loggers
    monkeypatch.setattr(logging.getLogger("batchfutures"), "disabled", False)
    world = World(1, "plain-2")
    rig = Rig(world)
    world.child(0, "RUNNABLE", "CAPACITY:INSUFFICIENT_INSTANCE_CAPACITY - no Spot capacity")
    with caplog.at_level("WARNING", logger="batchfutures"):
        for _ in range(3):
            rig.poll(advance=10_000)
    assert not rig.future(0).done() and not world.cancelled
    assert rig.future(0).status_reason.startswith("CAPACITY:")
    warned = [r.getMessage() for r in caplog.records if "waits RUNNABLE" in r.getMessage()]
    assert len(warned) == 1 and "plain-2" in warned[0] and "set runnable_timeout=" in warned[0]


def test_an_array_held_runnable_is_cancelled_as_one_job_after_runnable_timeout():
    world = World(5)
    rig = Rig(world, runnable_timeout=120)
    for i in range(5):
        world.child(i, "RUNNABLE", MISCONFIGURED)
    rig.poll()
    assert all(rig.future(i).status_reason == MISCONFIGURED for i in range(5))
    assert world.calls["ListJobs:RUNNABLE"] == 1
    rig.poll(advance=10)  # the next RUNNABLE check is not due yet
    assert world.calls["ListJobs:RUNNABLE"] == 1
    rig.poll(advance=115)
    assert all(type(rig.future(i).exception()) is JobUnplaceableError for i in range(5))
    assert [target for target, _ in world.cancelled] == ["arr-1"]  # one CancelJob, the parent


def test_a_large_array_held_runnable_is_judged_from_a_sample_of_one_page():
    """RUNNABLE children are listed for their reason, which all share: one page of a sample,
    not a page per 1,000 children every check (a 10,000-child array cost 10 ListJobs)."""
    world = World(2500)
    rig = Rig(world, runnable_timeout=120)
    for i in range(2500):
        world.child(i, "RUNNABLE", MISCONFIGURED)
    rig.poll()
    assert world.calls["ListJobs:RUNNABLE"] == 1
    assert rig.future(2400).status == "RUNNABLE"
    rig.poll(advance=121)
    assert world.calls["ListJobs:RUNNABLE"] == 2
    assert all(type(rig.future(i).exception()) is JobUnplaceableError for i in (0, 99, 2499))
    assert [target for target, _ in world.cancelled] == ["arr-1"]


def test_an_array_whose_children_run_is_not_timed_out():
    world = World(3)
    rig = Rig(world, runnable_timeout=60)
    world.child(0, "RUNNING")
    world.child(1, "RUNNABLE", "CAPACITY:INSUFFICIENT_INSTANCE_CAPACITY")
    world.child(2, "RUNNABLE", "CAPACITY:INSUFFICIENT_INSTANCE_CAPACITY")
    for _ in range(4):
        rig.poll(advance=100)
    assert not world.cancelled and not rig.settled()
    assert world.calls["ListJobs:RUNNABLE"] == 0  # something runs: capacity exists


# -- a retry_on_oom retry whose raised memory no compute environment has -------------------------
def _retrying(rig):
    """Make the rig's job a retry_on_oom retry: each child was killed once at 256 MiB."""
    from batchfutures.oomretry import ChildHistory, OomRetry, Try
    from batchfutures.settings import JobSettings

    history = {i: ChildHistory(("mem://run/first", i), (Try(256, f"first:{i}"),))
               for i in range(rig.world.size)}
    rig.job.retry = OomRetry(JobSettings(memory=256, retry_on_oom=3), placeable_mib=None,
                             resubmit=lambda *args: None, history=history)
    return rig


def test_a_retry_no_compute_environment_can_hold_fails_for_memory_at_once():
    world = World(1, "plain-retry")
    rig = _retrying(Rig(world))  # no runnable_timeout: without this rule it would wait forever
    world.child(0, "RUNNABLE", MISCONFIGURED)
    rig.poll()
    error = rig.future(0).exception(timeout=0)
    assert type(error) is MemoryLimitExceeded and error.tried_mib == (256,)
    assert error.memory_mib == 256 and error.job_id == "first:0"
    assert "512 MiB cannot be placed" in str(error) and MISCONFIGURED in str(error)
    [(target, reason)] = world.cancelled
    assert target == "plain-retry" and reason.startswith("batchfutures: the retry_on_oom memory")


def test_a_retry_waiting_for_capacity_waits_like_any_job():
    world = World(1, "plain-retry")
    rig = _retrying(Rig(world))
    world.child(0, "RUNNABLE", "CAPACITY:INSUFFICIENT_INSTANCE_CAPACITY - no Spot capacity")
    for _ in range(3):
        rig.poll(advance=10_000)
    assert not rig.future(0).done() and not world.cancelled


def test_an_array_retry_too_large_for_the_queue_is_cancelled_whole_at_its_first_check():
    world = World(3)
    rig = _retrying(Rig(world))
    for i in range(3):
        world.child(i, "RUNNABLE", MISCONFIGURED)
    rig.poll()
    errors = [rig.future(i).exception(timeout=0) for i in range(3)]
    assert all(type(e) is MemoryLimitExceeded for e in errors)
    assert [e.job_id for e in errors] == ["first:0", "first:1", "first:2"]
    assert [target for target, _ in world.cancelled] == ["arr-1"]


# -- the request budget over a whole run, with a lagging summary --------------------------------------
def test_a_long_run_with_a_lagging_summary_reads_each_result_once():
    size = 200
    world = World(size)
    rig = Rig(world)
    order = list(range(size))
    step = 0
    while order:
        batch, order = order[:7], order[7:]
        for i in batch:
            world.child(i, "RUNNING")
        rig.poll()
        if step % 3 == 0:
            world.freeze_summary()  # the summary only refreshes every third poll
        else:
            world.thaw_summary()
        for i in batch:
            if i % 50 == 7:
                world.child(i, "FAILED", EXITED, 1)
            else:
                world.succeed(i)
        step += 1
    world.thaw_summary()
    world.finish()
    for _ in range(3):
        rig.poll()
    settled = rig.settled()
    assert len(settled) == size
    failed = {i for i in range(size) if i % 50 == 7}
    assert all(type(settled[i]) is JobFailedError for i in failed)
    assert all(settled[i] == i * 10 for i in range(size) if i not in failed)
    assert world.calls["GetObject"] <= 1.05 * size
    assert not any(op in world.calls for op in ("ListJobs:RUNNING", "ListJobs:STARTING"))


# -- the pure step itself -----------------------------------------------------------------------------
def test_reconcile_asks_for_listings_first_and_commits_only_at_the_end():
    world = World(3)
    world.succeed(0)
    world.child(1, "FAILED", EXITED, 1)
    world.succeed(2)
    world.finish()
    rig = Rig(world)
    view = rig.job.view(200.0)
    reads = Reads(world.describe_parent())
    step = reconcile(view, reads)
    assert step.needs.listings == (JobStatus.FAILED,) and not step.actions.settles
    reads.listings[JobStatus.FAILED] = world.list_jobs("arr-1", "FAILED")["jobSummaryList"]
    step = reconcile(view, reads)
    assert step.needs.children == (1,)
    reads.children[1] = world.describe_jobs(jobs=["arr-1:1"])["jobs"][0]
    step = reconcile(view, reads)
    assert step.needs.stored and step.needs.stored_from == 0  # FAILED: storage says who did not
    reads.stored = frozenset(world.results)
    step = reconcile(view, reads)
    assert not step.needs
    assert step.actions.read == (0, 2) and set(step.actions.failed) == {1}
    assert rig.job.unresolved == {0, 1, 2}  # reconcile changed nothing itself


def test_a_settled_child_lets_go_of_its_futures_while_the_job_runs_on():
    import gc
    import weakref

    world = World(3)
    rig = Rig(world)
    world.child(2, "RUNNING")
    world.succeed(0)
    assert rig.poll()
    first = rig.futures[0][0]
    assert first.result() == 0 and not rig.job.done
    ref = weakref.ref(first)
    del first
    rig.futures[0] = []  # the caller drops it (the job got the same inner list)
    gc.collect()
    assert ref() is None  # the running job keeps neither the future nor its result
    world.succeed(1, 2)
    world.finish()
    assert rig.poll()
    assert [rig.future(i).result() for i in (1, 2)] == [10, 20] and rig.job.done


def test_the_poller_holds_its_owner_weakly():
    import gc
    import weakref

    world = World(1, "plain-3")
    owner = Owner()
    poller = Poller(owner, batch=lambda: world, storage=world, min_interval=0.01,
                    max_interval=0.1, grace=1.0)
    ref = weakref.ref(owner)
    del owner
    gc.collect()
    assert ref() is None
    assert poller._owner() is None


def test_errors_stay_batch_errors():
    assert issubclass(JobUnplaceableError, BatchError)


# -- which results to read (reconcile.results_to_read), as a table ------------------------------
def _view(open_=range(10), *, reading=(), reread=(), missing=(), summary=None, status="RUNNING"):
    return JobFacts(job_id="arr-1", array=True, size=10, open=frozenset(open_),
                   started=frozenset(), status=JobStatus.of(status),
                   summary=dict(summary or {"RUNNING": 4, "RUNNABLE": 6}), submitted_at=0.0,
                   now=1.0, reading=frozenset(reading), reread=frozenset(reread),
                   missing=frozenset(missing))


# (view, status now, summary now, stored listing or None, expected: set to read, or ("list", k))
TO_READ = [
    # nothing succeeded since the last poll: nothing to read, no listing
    (_view(), "RUNNING", {"RUNNING": 4, "RUNNABLE": 6}, None, set()),
    # ...but a read that failed is made again
    (_view(reread={3}), "RUNNING", {"RUNNING": 4, "RUNNABLE": 6}, None, {3}),
    # two more succeeded, eight wait: list storage from the lowest child waiting
    (_view(), "RUNNING", {"RUNNING": 2, "SUCCEEDED": 2, "RUNNABLE": 6}, None, ("list", 0)),
    (_view(open_=range(4, 10)), "RUNNING", {"RUNNING": 3, "SUCCEEDED": 5, "RUNNABLE": 2},
     None, ("list", 4)),
    # the listing names what to read; children being read are not waiting
    (_view(reading={0}), "RUNNING", {"RUNNING": 2, "SUCCEEDED": 2, "RUNNABLE": 6},
     frozenset({0, 1}), {1}),
    # as many newly succeeded as wait: all of them, no listing
    (_view(open_={8, 9}, summary={"SUCCEEDED": 8, "RUNNING": 2}), "RUNNING", {"SUCCEEDED": 10},
     None, {8, 9}),
    # the job SUCCEEDED: every child did, read them all without a listing
    (_view(), "SUCCEEDED", {"SUCCEEDED": 10}, None, set(range(10))),
    # ...except one read before and not there: then storage says which are written
    (_view(missing={5}), "SUCCEEDED", {"SUCCEEDED": 10}, None, ("list", 0)),
    (_view(missing={5}), "SUCCEEDED", {"SUCCEEDED": 10}, frozenset(range(10)) - {5},
     set(range(10)) - {5}),
    # the job FAILED: the results storage holds (the failed ones hold none)
    (_view(), "FAILED", {"SUCCEEDED": 9, "FAILED": 1}, None, ("list", 0)),
    (_view(), "FAILED", {"SUCCEEDED": 9, "FAILED": 1}, frozenset(range(9)), set(range(9))),
]


@pytest.mark.parametrize("view, status, summary, stored, expected", TO_READ)
def test_which_results_are_read_and_when_storage_is_listed(view, status, summary, stored,
                                                            expected):
    from batchfutures.reconcile import results_to_read

    reads = Reads({"status": status})
    reads.stored = stored
    grew = summary.get("SUCCEEDED", 0) > view.summary.get("SUCCEEDED", 0)
    waiting = view.open - view.reading
    to_read, start = results_to_read(view, reads, JobStatus.of(status), summary, grew, waiting)
    if isinstance(expected, tuple):
        assert to_read is None and start == expected[1]
    else:
        assert to_read == frozenset(expected)


ARRIVED = [
    # (array, arrivals, expected settled results, no_result, reread, missing)
    (True, {0: b"r0", 1: None, 2: ReadFailed(OSError("503"))}, {0}, (), (2,), (1,)),
    (False, {0: None}, set(), (0,), (), ()),  # a plain job said SUCCEEDED: no result at all
    (False, {0: b"r0"}, {0}, (), (), ()),
]


@pytest.mark.parametrize("array, arrivals, results, no_result, reread, missing", ARRIVED)
def test_what_the_reader_brought_back_settles(array, arrivals, results, no_result, reread,
                                               missing):
    from batchfutures.reconcile import arrived

    actions = arrived(arrivals, array=array, open_=set(range(3 if array else 1)))
    assert set(actions.results) == results and actions.no_result == no_result
    assert actions.reread == reread and actions.missing == missing
    assert set(actions.read_done) == set(arrivals)


def test_every_future_of_an_array_child_ends_with_its_final_status_and_exit_code():
    """As single jobs have: FAILED and the container's exit code, or SUCCEEDED and 0."""
    world = World(3)
    rig = Rig(world)
    world.child(0, "RUNNING")
    world.child(1, "RUNNING")
    world.child(2, "RUNNABLE")
    rig.poll()
    world.succeed(0)
    world.child(1, "FAILED", EXITED, 3)
    world.child(2, "FAILED", "OutOfMemoryError: Container killed due to memory usage", 137,
                container_reason="OutOfMemoryError: Container killed due to memory usage")
    world.finish()
    rig.poll()
    for future in rig.futures[0]:
        assert future.result() == 0 and (future.status, future.exit_code) == ("SUCCEEDED", 0)
    for future in rig.futures[1]:
        assert type(future.exception()) is JobFailedError
        assert (future.status, future.exit_code) == ("FAILED", 3)
    for future in rig.futures[2]:
        assert type(future.exception()) is MemoryLimitExceeded
        assert (future.status, future.exit_code) == ("FAILED", 137)
