"""What a child's futures show (status, status reason, exit code, usage), kept once per child by
its job (jobs.ChildStatuses, usage.ItemUsage) and read by each future through (job, child)."""

from __future__ import annotations

import concurrent.futures

import pytest

from batchfutures import wire
from batchfutures.futures import BatchFuture
from batchfutures.jobs import ChildStatuses, TrackedJob
from batchfutures.usage import Usage


# -- the store, step by step ----------------------------------------------------------------------
@pytest.mark.parametrize("steps, expected", [
    ([], (None, None, None)),
    ([("show", "RUNNING", None, None)], ("RUNNING", None, None)),
    # a None keeps what was shown before
    ([("show", "FAILED", "Essential container in task exited", 3), ("show", None, None, None)],
     ("FAILED", "Essential container in task exited", 3)),
    ([("show", "RUNNING", "r", None), ("show", "SUCCEEDED", None, 0)], ("SUCCEEDED", "r", 0)),
    # a rerun after a dependency's retry: PENDING, the failed try's reason and code gone
    ([("show", "FAILED", "Dependent Job failed", 1), ("wait_again",)], ("PENDING", None, None)),
    # a retry_on_oom resubmission clears the killed try's reason and exit code
    ([("show", "FAILED", "OutOfMemoryError", 137), ("set_reason", None), ("set_exit_code", None)],
     ("FAILED", None, None)),
    ([("set_reason", "why"), ("set_exit_code", 2)], (None, "why", 2)),
])
def test_a_childs_shown_status_reason_and_exit_code(steps, expected):
    store = ChildStatuses(3)
    for name, *args in steps:
        getattr(store, name)(1, *args)
    assert (store.status(1), store.reason(1), store.exit_code(1)) == expected
    # the other children are untouched
    assert [(store.status(i), store.reason(i), store.exit_code(i)) for i in (0, 2)] == \
        [(None, None, None)] * 2


def test_children_outside_the_job_show_nothing_and_change_nothing():
    store = ChildStatuses(2)
    for child in (-1, 2):
        store.show(child, "RUNNING", "r", 1)
        store.set_reason(child, "r")
        store.set_exit_code(child, 1)
        assert (store.status(child), store.reason(child), store.exit_code(child)) == \
            (None, None, None)
    assert [store.status(i) for i in (0, 1)] == [None, None]


# -- the futures read it through their job --------------------------------------------------------
def array_job(size=3, items=2):
    children = [[BatchFuture() for _ in range(items)] for _ in range(size)]
    for group in children:
        for position, future in enumerate(group):
            future._set_item(position)
    return TrackedJob("array-1", "file:///nowhere", children, array=True), children


def test_every_future_of_a_child_shows_what_the_child_shows():
    job, children = array_job()
    assert [f.status for f in children[1]] == ["SUBMITTED"] * 2  # the job's default
    children[1][0]._update("FAILED", "Essential container in task exited", 3)
    for future in children[1]:
        assert (future.status, future.status_reason, future.exit_code) == \
            ("FAILED", "Essential container in task exited", 3)
    job.default_status = "RUNNABLE"
    assert [f.status for f in children[0] + children[2]] == ["RUNNABLE"] * 4
    assert [f.status for f in children[1]] == ["FAILED"] * 2  # known for this child
    # what submission.resubmit clears on the child before the retry
    job.statuses.forget_ending(1)
    assert (children[1][0].status_reason, children[1][0].exit_code) == (None, None)
    assert "batch_status='FAILED'" in repr(children[1][0])


def test_a_rebound_future_shows_its_new_job_not_its_old_one():
    job, children = array_job()
    job.statuses.show(2, "FAILED", "OutOfMemoryError", 137)
    moved = children[2]
    retry = TrackedJob("retry-1", "file:///retry", [moved], array=False)
    for future in moved:
        assert (future.status, future.status_reason, future.exit_code) == ("SUBMITTED", None, None)
        assert future.job_id == "retry-1"
    retry.statuses.show(0, "RUNNING")
    assert [f.status for f in moved] == ["RUNNING"] * 2
    assert job.statuses.status(2) == "FAILED"  # the old job's record is its own


def test_a_future_without_a_job_shows_what_it_was_told():
    future = BatchFuture()
    assert (future.status, future.status_reason, future.exit_code) == (None, None, None)
    future._update("SUCCEEDED")  # resolved from the cache (session.settle_cached)
    assert (future.status, future.status_reason, future.exit_code) == ("SUCCEEDED", None, None)
    assert not future.cached  # the verdict is its own field


def test_waiting_children_show_pending_without_the_failed_try():
    job, children = array_job()
    job.statuses.show(0, "FAILED", "Dependent Job failed", 1)
    job.statuses.wait_again(0)
    assert [(f.status, f.status_reason, f.exit_code) for f in children[0]] == \
        [("PENDING", None, None)] * 2


def test_usage_is_read_per_item_once_resolved_and_not_for_a_future_already_done():
    job, children = array_job(size=2, items=3)
    aborted = children[1][2]
    aborted.set_exception(RuntimeError("aborted before its result was read"))
    outcomes = [wire.encode_ok(i) for i in range(3)]
    usage = [[0.5, 0.25, 300.0], [1.0, 0.0, None], None]
    job._settle_child(1, wire.pack_result(outcomes, {"index": 1, "usage": usage}))
    assert [f.result() for f in children[1][:2]] == [0, 1]
    assert [f.usage for f in children[1]] == [Usage(0.5, 0.25, 300.0), Usage(1.0, 0.0, None),
                                              None]
    assert (children[1][0].status, children[1][0].exit_code) == ("SUCCEEDED", 0)
    assert [f.usage for f in children[0]] == [None] * 3  # not resolved, nothing measured
    children[0][0].set_result(1)
    assert children[0][0].usage is None  # resolved, but not from a result that had usage


def test_futures_stay_real_futures():
    job, children = array_job(size=1, items=2)
    future = children[0][0]
    assert isinstance(future, concurrent.futures.Future)
    future.set_result(5)
    done, _ = concurrent.futures.wait(children[0], timeout=0)
    assert done == {future}
