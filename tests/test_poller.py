"""The poller end to end (slow tier): real jobs on the emulator, real processes, real storage.

The reasoning itself is table-tested in tests/test_reconcile.py; these check that the thread
running it resolves every future under faults the emulator injects (`inject_faults`), survives a
result that raises SystemExit when loaded, reports its own death instead of hanging, and cancels
a job Batch cannot place after `runnable_timeout` (the AWS path: boto3 against the emulator's
HTTP endpoint, S3 on moto).
"""

import concurrent.futures
import logging
import os
import sys
import threading
import time

import boto3
import pytest
from s3server import emulator_endpoint, emulator_environment, new_bucket

from batchfutures import BatchExecutor, JobFailedError, LocalEnvironment
from batchfutures.errors import JobUnplaceableError, PollerStoppedError

pytestmark = pytest.mark.slow

REGION = "us-east-1"


def crash_some(x):
    if x % 20 == 3:
        raise SystemExit(3)  # an outcome: comes back as itself
    if x % 20 == 13:
        os._exit(3)  # the container exits 3: a JobFailedError
    return x * 2


class ExitsWhenLoaded:
    """Pickles fine in the worker; unpickling it on the client raises SystemExit."""

    def __reduce__(self):
        return (sys.exit, (5,))


def exits_when_loaded_on(bad):
    def f(x):
        return ExitsWhenLoaded() if x == bad else x
    return f


def test_a_map_with_crashes_and_90_percent_of_listjobs_throttled_ends_with_every_outcome(tmp_path):
    """Issue 11, point 1: this left all 60 futures pending after 120 s in one run of three."""
    env = LocalEnvironment(tmp_path, max_vcpus=4)
    try:
        env.emulator.inject_faults(0.9, operations={"ListJobs"}, seed=11)
        with BatchExecutor(env) as executor:
            futures = executor.map_futures(crash_some, range(60))
            done, pending = concurrent.futures.wait(futures, timeout=420)
            assert not pending, f"{len(pending)} futures still pending"
        assert env.emulator.faults.injected > 0
        outcomes = [f.exception() or f.result() for f in futures]
        results = {i: o for i, o in enumerate(outcomes) if not isinstance(o, BaseException)}
        assert results == {i: i * 2 for i in range(60) if i % 20 not in (3, 13)}
        assert len(results) == 54
        for i in (3, 23, 43):
            assert type(outcomes[i]) is SystemExit and outcomes[i].code == 3
        for i in (13, 33, 53):
            assert type(outcomes[i]) is JobFailedError and outcomes[i].exit_code == 3
    finally:
        env.emulator.inject_faults(0)
        env.emulator.close()


def test_listjobs_failing_past_its_retries_until_the_job_ended_strands_nothing(tmp_path):
    """Every ListJobs fails (past batchapi's retries) while the array runs and ends; once Batch
    answers again, the next poll settles everything. The poller before reconcile.py had saved
    the final summary before the failed listing, saw "no change" from then on, and hung."""
    env = LocalEnvironment(tmp_path, max_vcpus=4)
    try:
        env.emulator.inject_faults(1.0, operations={"ListJobs"})
        executor = BatchExecutor(env)
        futures = executor.map_futures(crash_some, range(20))
        job_id = futures[0].job_id.split(":")[0]
        deadline = time.monotonic() + 120
        while env.batch.describe_jobs(jobs=[job_id])["jobs"][0]["status"] not in ("SUCCEEDED", "FAILED"):
            assert time.monotonic() < deadline, "the array did not end"
            time.sleep(0.2)
        # two more examinations fail after the end (each gives up after batchapi's 8 attempts),
        # so at least one of them saw the ended job's final summary
        failed_at_end = env.emulator.faults.injected
        while env.emulator.faults.injected < failed_at_end + 16:
            assert time.monotonic() < deadline + 120, "the poller stopped trying ListJobs"
            time.sleep(0.2)
        env.emulator.inject_faults(0)
        done, pending = concurrent.futures.wait(futures, timeout=120)
        assert not pending, f"{len(pending)} futures still pending after ListJobs recovered"
        assert [futures[i].result() for i in range(20) if i not in (3, 13)] == \
            [i * 2 for i in range(20) if i not in (3, 13)]
        assert type(futures[3].exception()) is SystemExit
        assert type(futures[13].exception()) is JobFailedError
        executor.shutdown(wait=True)
    finally:
        env.emulator.inject_faults(0)
        env.emulator.close()


def test_a_result_whose_unpickling_raises_system_exit_fails_only_its_own_future(executor):
    futures = executor.map_futures(exits_when_loaded_on(2), range(5))
    concurrent.futures.wait(futures, timeout=120)
    assert type(futures[2].exception()) is SystemExit and futures[2].exception().code == 5
    assert [futures[i].result() for i in (0, 1, 3, 4)] == [0, 1, 3, 4]
    # the poller is alive and well: later work still resolves
    assert executor.submit(abs, -7).result(timeout=60) == 7
    plain = executor.submit(exits_when_loaded_on(0), 0)
    assert type(plain.exception(timeout=60)) is SystemExit


class _KillsThePollerThread(logging.Filter):
    """A logging filter that raises on the poller thread: even the poller's own error handling
    then raises, which is as close to "the thread died anyway" as a real part gets."""

    def filter(self, record):
        if threading.current_thread().name == "batchfutures-poller":
            raise SystemExit("a logging filter raised on the poller thread")
        return True


def test_a_poller_thread_that_dies_anyway_fails_every_pending_future_instead_of_hanging(local_env):
    logger = logging.getLogger("batchfutures")
    deadly, level = _KillsThePollerThread(), logger.level
    executor = BatchExecutor(local_env)
    try:
        futures = executor.map_futures(time.sleep, [0, 0, 120])
        futures[0].result(timeout=60)  # the poller runs; now make its next log record fatal
        logger.setLevel(logging.DEBUG)
        logger.disabled = False  # a library's logging.config may have disabled it earlier
        logger.addFilter(deadly)
        trigger = executor.map_futures(abs, [-1])  # settling it makes the poller log (debug)
        error = futures[2].exception(timeout=60)  # long before its 120 s sleep ends
        assert isinstance(error, PollerStoppedError), repr(error)
        assert futures[2].job_id.split(":")[0] in str(error) and "attach" in str(error)
        # the trigger may have been tracked, or still buffered, when the thread died: either
        # way a thread settles it (here by dying again), nothing waits forever
        _, pending = concurrent.futures.wait(futures + trigger, timeout=60)
        assert not pending, f"{len(pending)} futures never settled after the poller died"
    finally:
        logger.removeFilter(deadly)
        logger.setLevel(level)
    # a new job starts a new thread
    assert executor.submit(abs, -3).result(timeout=60) == 3
    executor.shutdown(wait=False, cancel_futures=True)


# -- the AWS path: a job Batch cannot place -----------------------------------------------------
@pytest.fixture(scope="module")
def aws(tmp_path_factory, s3_endpoint):
    with emulator_endpoint(tmp_path_factory.mktemp("poller-emulator"), max_vcpus=2) as emulator:
        yield emulator


@pytest.fixture
def aws_env(aws):
    return emulator_environment(new_bucket())


def test_a_job_held_runnable_past_runnable_timeout_is_cancelled_and_says_why(aws, aws_env):
    with BatchExecutor(aws_env, vcpus=64, runnable_timeout=3) as executor:
        plain = executor.submit(abs, -1)
        mapped = executor.map_futures(abs, [-1, -2, -3])
        error = plain.exception(timeout=120)
        assert type(error) is JobUnplaceableError
        assert error.status_reason.startswith("MISCONFIGURATION:")
        assert "64 vCPUs" in str(error) and "runnable_timeout=3s" in str(error)
        for future in mapped:
            assert type(future.exception(timeout=120)) is JobUnplaceableError
            assert future.status_reason.startswith("MISCONFIGURATION:")
    batch = boto3.client("batch", region_name=REGION)
    for job_id in (plain.job_id, mapped[0].job_id.split(":")[0]):
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            job = batch.describe_jobs(jobs=[job_id])["jobs"][0]
            if job["status"] == "FAILED":
                break
            time.sleep(0.2)
        assert job["status"] == "FAILED" and job.get("isCancelled")
        assert job["statusReason"].startswith("batchfutures: not placed within runnable_timeout")


def test_attach_after_shutdown_resolves_and_then_the_thread_ends(local_env):
    executor = BatchExecutor(local_env)
    first = executor.submit(abs, -4)
    assert first.result(timeout=60) == 4
    executor.shutdown(wait=True)
    job_id = first.job_id
    assert not executor._session.poller.alive
    future = executor._session.attach(job_id)[0]  # as `batchfutures result JOB` does
    assert future.result(timeout=60) == 4
    deadline = time.monotonic() + 30
    while executor._session.poller.alive:  # stop() still holds: it drains and ends
        assert time.monotonic() < deadline, "the poller thread never ended"
        time.sleep(0.05)
