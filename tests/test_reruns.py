"""A dependent whose upstream was retried with more memory runs again on the retry's result.

Pure parts first (the plan, which failures qualify, the redirects, the waiting child in a
TrackedJob, the worker's Resolver following a redirect), then pipelines on the emulator whose
first stage is killed for memory once.
"""

import concurrent.futures

import pytest

from batchfutures import BatchExecutor, DependencyFailedError, MemoryLimitExceeded, wire
from batchfutures.dependencies import FutureRef, Resolver
from batchfutures.errors import JobFailedError
from batchfutures.futures import BatchFuture
from batchfutures.jobs import Actions, ChildState, TrackedJob
from batchfutures.reruns import Plan, plan, redirects_of, wants_rerun


def done(value=None, error=None):
    future = concurrent.futures.Future()
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(value)
    return future


def pending():
    return concurrent.futures.Future()


def cancelled():
    future = concurrent.futures.Future()
    future.cancel()
    return future


OOM = MemoryLimitExceeded("killed", memory_mib=512)


# -- plan ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("upstreams, expected", [
    ([[pending()]], Plan(wait=True)),
    ([[done(1)], [pending()]], Plan(wait=True)),             # every item's upstreams first
    ([[done(1)], [done(2)]], Plan(rerun=True)),
    ([[done(1), done(2)]], Plan(rerun=True)),
    ([[done(error=OOM)], [done(2)]], Plan(failed={0: OOM}, rerun=True)),
    ([[done(error=OOM)]], Plan(failed={0: OOM}, rerun=False)),  # nothing left to run
    ([[done(1), done(error=OOM)]], Plan(failed={0: OOM}, rerun=False)),
    ([], Plan(rerun=False)),                                  # every item already done
])
def test_plan(upstreams, expected):
    assert plan(upstreams) == expected


def test_a_cancelled_upstream_fails_its_item():
    step = plan([[cancelled()], [done(1)]])
    assert set(step.failed) == {0} and step.rerun
    assert isinstance(step.failed[0], concurrent.futures.CancelledError)


# -- which failures wait for a rerun ---------------------------------------------------------------
def dependent(*upstreams):
    future = BatchFuture()
    future._set_upstream(list(upstreams), [("", None)] * len(upstreams))
    return future


@pytest.mark.parametrize("error, upstreams, expected", [
    (DependencyFailedError("Dependent Job failed"), [pending()], True),  # being retried
    (DependencyFailedError("Dependent Job failed"), [done(1)], True),    # retried and done
    (DependencyFailedError("Dependent Job failed"), [done(error=OOM)], False),  # it failed
    (DependencyFailedError("Dependent Job failed"), [done(error=OOM), pending()], True),
    (JobFailedError("Essential container in task exited"), [pending()], False),
    (DependencyFailedError("Dependent Job failed"), [], False),  # no futures as arguments
])
def test_wants_rerun(error, upstreams, expected):
    assert wants_rerun(error, [dependent(*upstreams)]) is expected


def test_a_done_dependent_never_wants_a_rerun():
    future = dependent(pending())
    future.set_result(1)
    assert not wants_rerun(DependencyFailedError("x"), [future])


# -- redirects -------------------------------------------------------------------------------------
class _Job:
    def __init__(self, job_url):
        self.job_url = job_url


def moved_upstream(first, now):
    """An upstream future whose FutureRef said ``first`` (job_url, child); now at ``now``."""
    upstream = BatchFuture()
    upstream._bind(_Job(now[0]), now[1])
    return upstream, first


def test_redirects_name_only_the_upstreams_that_moved_once_each():
    a, a_first = moved_upstream(("s3://b/runs/r/jobs/first", 2), ("s3://b/runs/r/jobs/retry", 0))
    b, b_first = moved_upstream(("s3://b/runs/r/jobs/first", 1), ("s3://b/runs/r/jobs/first", 1))
    one, two = BatchFuture(), BatchFuture()
    one._set_upstream([a, b], [a_first, b_first])
    two._set_upstream([a], [a_first])
    assert redirects_of([one, two]) == [
        ("s3://b/runs/r/jobs/first", 2, "s3://b/runs/r/jobs/retry", 0)]
    assert redirects_of([BatchFuture()]) == []


def test_the_resolver_follows_a_redirect(local):
    first, retry = local.job_url("run", "first"), local.job_url("run", "retry")
    local.write_result(retry, 0, wire.pack_result([wire.encode_ok(41)], {}))
    ref = FutureRef(first, 3, 0, "first:3")  # the first try (killed) wrote nothing
    assert Resolver(local, [[first, 3, retry, 0]]).resolve((ref,), {}) == ((41,), {})
    with pytest.raises(Exception) as failed:
        Resolver(local).resolve((ref,), {})
    assert type(failed.value).__name__ == "UpstreamFailed"


# -- the waiting child in its TrackedJob -----------------------------------------------------------
def tracked_dependent(upstreams_per_child):
    futures = [[dependent(*ups)] for ups in upstreams_per_child]
    job = TrackedJob("dep", "mem://run/dep", futures, array=len(futures) > 1)
    sent = []
    job.rerun = lambda job, children: sent.append(list(children)) or _Job("mem://run/rerun")
    return job, futures, sent


def fail_for_dependency(job, *indices):
    job.apply(Actions(failed={i: {"statusReason": "Dependent Job failed"} for i in indices}),
              failure_for=lambda i, d: DependencyFailedError(d["statusReason"]),
              no_result_error=RuntimeError, expired_error=RuntimeError,
              unplaceable_error=lambda i, r: RuntimeError(r))


def test_a_child_failed_for_a_retried_dependency_waits_then_is_handed_to_rerun():
    upstream = pending()
    job, futures, sent = tracked_dependent([[upstream], [done(error=OOM)]])
    fail_for_dependency(job, 0, 1)
    assert type(futures[1][0].exception(timeout=0)) is DependencyFailedError  # as before
    assert not futures[0][0].done() and futures[0][0].status == "PENDING"
    assert job.states[0] is ChildState.WAITING and not job.done and job.waiting
    assert job.unresolved == frozenset()  # nothing of it is polled
    assert job.ready_reruns() == []  # its upstream still runs
    upstream.set_result(5)
    assert job.ready_reruns() == [0]
    job.rerun_sent([0])
    assert job.done and job.states[0] is ChildState.SETTLED
    assert not futures[0][0].done()  # the rerun's job settles it


def test_an_upstream_that_fails_after_all_fails_the_waiting_item_with_its_cause():
    upstream = pending()
    job, futures, _ = tracked_dependent([[upstream]])
    fail_for_dependency(job, 0)
    upstream.set_exception(OOM)
    assert job.ready_reruns() == [] and job.done
    error = futures[0][0].exception(timeout=0)
    assert type(error) is DependencyFailedError and error.__cause__ is OOM


def test_a_rerun_that_cannot_be_sent_fails_the_waiting_futures():
    upstream = done(1)
    job, futures, _ = tracked_dependent([[upstream]])
    fail_for_dependency(job, 0)
    refused = JobFailedError("SubmitJob refused")
    job.rerun_sent(job.ready_reruns(), refused)
    assert futures[0][0].exception(timeout=0) is refused and job.done


def test_without_a_rerun_hook_the_dependency_failure_settles_as_before():
    job, futures, _ = tracked_dependent([[pending()]])
    job.rerun = None
    fail_for_dependency(job, 0)
    assert type(futures[0][0].exception(timeout=0)) is DependencyFailedError and job.done


def test_a_poller_that_stops_fails_the_waiting_children_too():
    job, futures, _ = tracked_dependent([[pending()]])
    fail_for_dependency(job, 0)
    job.fail_all(lambda: RuntimeError("poller stopped"))
    assert str(futures[0][0].exception(timeout=0)) == "poller stopped" and job.done


# -- on the emulator: the first stage is killed for memory once --------------------------------
def allocate(mib):
    return len(bytearray(mib * 1024 * 1024)) // (1024 * 1024)


def plus_one(x):
    return x + 1


def add(a, b):
    return a + b


@pytest.mark.slow
def test_a_pipeline_whose_first_stage_is_retried_for_memory_gets_every_result(local_env):
    with BatchExecutor(local_env, memory=256, retry_on_oom=1) as ex:
        first = ex.map_futures(allocate, [1, 300, 2])  # 300 MiB: killed at 256, runs at 512
        second = ex.map_futures(plus_one, first)       # N_TO_N on the first stage
        total = ex.submit(add, first[1], second[1])    # a plain job on both
        assert [f.result(timeout=180) for f in second] == [2, 301, 3]
        assert total.result(timeout=180) == 601
    retried = second[1].job_id.partition(":")[0]
    assert retried != second[0].job_id.partition(":")[0]  # the dependent ran again, elsewhere
    (rerun,) = local_env.batch.describe_jobs(jobs=[retried])["jobs"]
    assert not rerun.get("dependsOn")  # its upstream was done when it was sent
    assert rerun["jobName"].startswith("bf-plus_one")  # the call's name, as the first job's


@pytest.mark.slow
def test_a_dependent_of_an_item_too_big_for_every_try_fails_with_that_cause(local_env):
    with BatchExecutor(local_env, memory=256, retry_on_oom=1) as ex:
        first = ex.map_futures(allocate, [1, 2048])
        second = ex.map_futures(plus_one, first)
        error = second[1].exception(timeout=180)
        assert second[0].result(timeout=180) == 2
    assert type(error) is DependencyFailedError
    assert type(error.__cause__) is MemoryLimitExceeded and error.__cause__.tried_mib == (256, 512)


def allocate_more(mib, extra):
    return allocate(mib + extra) - extra


@pytest.mark.slow
def test_a_rerun_killed_for_memory_in_its_turn_still_reads_the_retried_upstream(local_env):
    with BatchExecutor(local_env, memory=256, retry_on_oom=2) as ex:
        first = ex.map_futures(allocate, [1, 300])
        second = ex.map_futures(allocate_more, first, [0, 300])  # 600 MiB: killed at 256 and 512
        assert [f.result(timeout=240) for f in second] == [1, 300]
