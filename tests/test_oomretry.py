"""retry_on_oom: the pure policy (table tests) and, on the emulator, children retried with more memory."""

import pytest

from batchfutures import BatchExecutor, LocalEnvironment, MemoryLimitExceeded
from batchfutures.errors import BatchError, ConfigurationError, JobFailedError, classify_failure
from batchfutures.futures import BatchFuture
from batchfutures.jobs import Actions, TrackedJob
from batchfutures.oomretry import ChildHistory, Decision, OomRetry, Try, Verdict, decide, final_error
from batchfutures.settings import JobSettings


@pytest.mark.parametrize("tried, retry_on_oom, placeable, expected", [
    # off: never
    ([256], 0, None, Decision(Verdict.GIVE_UP, why="retry_on_oom=0")),
    ([256], 0, 100_000, Decision(Verdict.GIVE_UP, why="retry_on_oom=0")),
    # doubling, up to K times
    ([256], 1, None, Decision(Verdict.RESUBMIT, memory_mib=512)),
    ([256, 512], 1, None, Decision(Verdict.GIVE_UP, why="retry_on_oom=1 allows no further try")),
    ([256, 512], 3, None, Decision(Verdict.RESUBMIT, memory_mib=1024)),
    ([256, 512, 1024], 3, 8192, Decision(Verdict.RESUBMIT, memory_mib=2048)),
    ([256, 512, 1024, 2048], 3, None,
     Decision(Verdict.GIVE_UP, why="retry_on_oom=3 allows no further try")),
    # capped at what the queue can place, then no further try
    ([2048], 2, 3000, Decision(Verdict.RESUBMIT, memory_mib=3000)),
    ([2048, 3000], 2, 3000, Decision(Verdict.GIVE_UP, why="the queue can place at most 3000 MiB")),
    ([4096], 5, 4096, Decision(Verdict.GIVE_UP, why="the queue can place at most 4096 MiB")),
    ([1024], 1, 2048, Decision(Verdict.RESUBMIT, memory_mib=2048)),
])
def test_decide(tried, retry_on_oom, placeable, expected):
    assert decide(tried, retry_on_oom, placeable) == expected


def test_final_error_says_what_was_tried():
    last = MemoryLimitExceeded("Batch job B was killed for using more than 512 MiB of memory",
                               memory_mib=512, job_id="B", status_reason="OutOfMemoryError: x",
                               exit_code=137, log_tail="tail")
    tries = [Try(256, "A:3"), Try(512, "B")]
    error = final_error(last, tries, "retry_on_oom=1 allows no further try")
    assert isinstance(error, MemoryLimitExceeded)
    text = str(error)
    assert "256 MiB (Batch job A:3), 512 MiB (Batch job B)" in text
    assert "retry_on_oom=1 allows no further try" in text
    assert "more than 512 MiB" in text  # the last try's own account is kept
    assert error.tried_mib == (256, 512)
    assert (error.memory_mib, error.job_id, error.exit_code, error.log_tail) == (512, "B", 137, "tail")
    assert error.status_reason == "OutOfMemoryError: x"


# -- the hook in TrackedJob.apply, with a real TrackedJob and real futures ---------------------
_OOM = {"status": "FAILED", "statusReason": "Essential container in task exited",
        "attempts": [{"container": {"exitCode": 137,
                                    "reason": "OutOfMemoryError: Container killed due to memory usage"}}]}
_CRASH = {"status": "FAILED", "statusReason": "Essential container in task exited",
          "attempts": [{"container": {"exitCode": 3}}]}


def _apply_failures(job, failed):
    job.apply(Actions(failed=failed, changed=True),
              failure_for=lambda index, d: classify_failure(d, job_id=job.child_id(index),
                                                            memory_mib=job.memory_mib),
              no_result_error=BatchError, expired_error=BatchError,
              unplaceable_error=lambda index, reason: BatchError(reason))


def _job_with(resubmit, retry_on_oom=2):
    futures = [[BatchFuture()], [BatchFuture(), BatchFuture()], [BatchFuture()]]
    job = TrackedJob("J", "file:///store/runs/r/jobs/k", futures, array=True, memory_mib=256)
    job.retry = OomRetry(JobSettings(memory=256, retry_on_oom=retry_on_oom), placeable_mib=None,
                         resubmit=resubmit)
    return job, futures


def test_an_oom_killed_child_is_handed_on_and_a_crashed_one_fails():
    calls = []
    job, futures = _job_with(lambda *args: calls.append(args))
    _apply_failures(job, {1: dict(_OOM, jobId="J:1"), 2: dict(_CRASH, jobId="J:2")})
    ((source, children, memory, histories, _retry),) = calls
    assert (source, children, memory) == (job, [1], 512)
    assert histories[0].origin == ("file:///store/runs/r/jobs/k", 1)
    assert histories[0].tries == (Try(256, "J:1"),)
    assert not any(f.done() for f in futures[1])  # resolved by the retry, not here
    assert job.unresolved == frozenset({0})  # no longer this job's to settle
    error = futures[2][0].exception(timeout=0)
    assert type(error) is JobFailedError and error.exit_code == 3


def test_a_retry_that_cannot_be_submitted_fails_with_what_was_tried():
    def refuse(*args):
        raise ConfigurationError("Batch rejected the job: memory too large")

    job, futures = _job_with(refuse)
    _apply_failures(job, {1: dict(_OOM, jobId="J:1")})
    for future in futures[1]:
        error = future.exception(timeout=0)
        assert isinstance(error, MemoryLimitExceeded) and error.tried_mib == (256,)
        assert "the retry with 512 MiB could not be submitted" in str(error)
        assert "memory too large" in str(error)
    assert not futures[0][0].done()


def test_a_retry_child_with_no_try_left_fails_naming_every_try():
    job, futures = _job_with(lambda *args: None, retry_on_oom=1)
    job.retry.history[0] = ChildHistory(("file:///store/runs/r/jobs/first", 4), (Try(128, "F:4"),))
    job.memory_mib = 256
    _apply_failures(job, {0: dict(_OOM, jobId="J:0")})
    error = futures[0][0].exception(timeout=0)
    assert error.tried_mib == (128, 256)
    assert "128 MiB (Batch job F:4), 256 MiB (Batch job J:0)" in str(error)


# -- on the emulator: memory is enforced (cgroups, else RLIMIT_DATA) -----------------------------
def allocate(mib):
    """Hold ``mib`` MiB at once; return how many MiB it held."""
    return len(bytearray(mib * 1024 * 1024)) // (1024 * 1024)


def _memory_of(env, job_id):
    (description,) = env.batch.describe_jobs(jobs=[job_id])["jobs"]
    requirements = description["container"]["resourceRequirements"]
    return int(next(r["value"] for r in requirements if r["type"] == "MEMORY"))


@pytest.mark.slow
def test_only_the_oom_killed_child_is_resubmitted_with_doubled_memory(local_env):
    with BatchExecutor(local_env, memory=256, retry_on_oom=1) as ex:
        futures = ex.map_futures(allocate, [1, 2, 300, 3])
        assert [f.result(timeout=120) for f in futures] == [1, 2, 300, 3]
    first_job = futures[0].job_id.partition(":")[0]
    assert all(f.job_id.partition(":")[0] == first_job for f in (futures[0], futures[1], futures[3]))
    retried = futures[2].job_id
    assert retried.partition(":")[0] != first_job  # resolved from a second Batch job
    assert _memory_of(local_env, retried) == 512
    assert _memory_of(local_env, futures[0].job_id) == 256
    assert futures[2].status == "SUCCEEDED" and futures[2].exit_code != 137
    (retry_job,) = local_env.batch.describe_jobs(jobs=[retried.partition(":")[0]])["jobs"]
    assert retry_job["jobName"].startswith("bf-allocate")  # the retry keeps the call's job name
    # the first try of that child was killed for its memory
    (killed,) = local_env.batch.describe_jobs(jobs=[f"{first_job}:2"])["jobs"]
    assert killed["status"] == "FAILED"
    assert len(ex._session.submitted_jobs) == 2


@pytest.mark.slow
def test_map_iterator_with_chunks_gets_every_result_in_order(local_env):
    with BatchExecutor(local_env, memory=256, retry_on_oom=1) as ex:
        assert list(ex.map(allocate, [1, 300, 2, 3, 4], chunksize=2, timeout=120)) == [1, 300, 2, 3, 4]
        assert len(ex._session.submitted_jobs) == 2


@pytest.mark.slow
def test_without_retry_on_oom_the_big_item_fails_and_the_others_succeed(local_env):
    with BatchExecutor(local_env, memory=256) as ex:
        futures = ex.map_futures(allocate, [1, 2, 300, 3])
        error = futures[2].exception(timeout=120)
        assert [futures[i].result(timeout=120) for i in (0, 1, 3)] == [1, 2, 3]
    assert isinstance(error, MemoryLimitExceeded) and error.memory_mib == 256
    assert "retry_on_oom" not in str(error)
    assert len(ex._session.submitted_jobs) == 1


@pytest.mark.slow
def test_an_item_too_big_for_every_try_names_each_memory_tried(local_env):
    with BatchExecutor(local_env, memory=256, retry_on_oom=1) as ex:
        futures = ex.map_futures(allocate, [1, 2048])
        error = futures[1].exception(timeout=120)
        assert futures[0].result(timeout=120) == 1
    assert isinstance(error, MemoryLimitExceeded)
    assert error.memory_mib == 512 and error.tried_mib == (256, 512)
    text = str(error)
    assert "256 MiB" in text and "512 MiB" in text and "retry_on_oom=1" in text
    assert error.job_id == futures[1].job_id != f"{futures[0].job_id.partition(':')[0]}:1"


@pytest.mark.slow
def test_a_plain_job_is_retried_twice_reading_its_first_inputs(local_env):
    with BatchExecutor(local_env, memory=256, retry_on_oom=2) as ex:
        future = ex.submit(allocate, 600)  # killed at 256 and 512, runs at 1024
        assert future.result(timeout=180) == 600
    assert _memory_of(local_env, future.job_id) == 1024
    assert len(ex._session.submitted_jobs) == 3


class _SmallQueue(LocalEnvironment):
    """A queue whose compute environments place at most 384 MiB."""

    def max_memory_mib(self):
        return 384


@pytest.mark.slow
def test_doubling_stops_at_what_the_queue_can_place(tmp_path):
    env = _SmallQueue(tmp_path / "work", max_vcpus=2)
    try:
        with BatchExecutor(env, memory=256, retry_on_oom=3) as ex:
            error = ex.submit(allocate, 2048).exception(timeout=180)
        assert isinstance(error, MemoryLimitExceeded) and error.tried_mib == (256, 384)
        assert "the queue can place at most 384 MiB" in str(error)
    finally:
        env.emulator.close()


# -- the AWS path: a queue whose largest instance has 600 MiB, and no max_memory_mib() ----------
@pytest.mark.slow
def test_on_aws_a_retry_larger_than_any_instance_fails_for_memory_instead_of_waiting(
        tmp_path, s3_endpoint):
    import time

    import boto3
    from s3server import emulator_endpoint, emulator_environment, new_bucket

    with emulator_endpoint(tmp_path / "emulator", max_vcpus=2, max_memory_mib=600):
        env = emulator_environment(new_bucket())
        with BatchExecutor(env, memory=256, retry_on_oom=3) as ex:  # no runnable_timeout
            future = ex.submit(allocate, 700)  # killed at 256 and 512; 972 fits no instance
            error = future.exception(timeout=180)
            batch = boto3.client("batch", region_name="us-east-1")
            deadline = time.monotonic() + 60
            while True:  # CancelJob was sent; Batch moves the job to FAILED in its own time
                (unplaced,) = batch.describe_jobs(jobs=[future.job_id])["jobs"]
                if unplaced["status"] == "FAILED" or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
    assert isinstance(error, MemoryLimitExceeded) and error.tried_mib == (256, 512)
    assert "972 MiB cannot be placed" in str(error)  # 1024 less AWS's headroom
    assert error.status_reason.startswith("MISCONFIGURATION:JOB_RESOURCE_REQUIREMENT")
    assert unplaced["statusReason"].startswith("batchfutures: the retry_on_oom memory")
    assert unplaced["status"] == "FAILED" and unplaced.get("isCancelled")
