"""Issue 20 point 3: a MemoryError is an out-of-memory failure on AWS too.

The worker exits 137 on a MemoryError without a kernel kill, so ECS writes no OutOfMemoryError
reason; before it exits it records a signed marker at <job>/oom/<i>. The client classifies on the
kernel's reason or that marker (MemoryLimitExceeded with .memory_mib), and retry_on_oom acts on
both. Table tests of the marker object, the classification and reconcile's reads; then real jobs
on the local emulator and on the AWS path (the emulator's endpoint and moto's S3) under cgroups,
where only a real kill has the reason.
"""

import os

import pytest
import s3server

from batchfutures import BatchExecutor, JobFailedError, MemoryLimitExceeded
from batchfutures.errors import (
    OOM_MARKER_FIELD,
    IntegrityError,
    JobTimeoutError,
    classify_failure,
    wants_oom_marker,
)
from batchfutures.jobs import JobFacts, JobStatus
from batchfutures.reconcile import Reads, reconcile
from batchfutures.storage import Storage

aws_env = s3server.aws_env  # the s3 storage fixture's (conftest's `storage`)
EXITED = "Essential container in task exited"
OOM_REASON = "OutOfMemoryError: Container killed due to memory usage"


# -- the marker object ----------------------------------------------------------------------------
def test_the_marker_is_signed_listed_apart_and_never_a_result(storage):
    job_url = storage.job_url("run1", "job1")
    assert storage.read_oom_marker(job_url, 3) is None
    storage.write_oom_marker(job_url, 3, "2")
    assert storage.read_oom_marker(job_url, 3)["attempt"] == "2"
    assert storage.list_oom_markers(job_url) == {3}
    # beside the results, never one of them
    assert storage.list_results(job_url) == set()
    assert not storage.has_result(job_url, 3) and storage.read_result(job_url, 3) is None
    storage.write_result(job_url, 4, b"a result")
    storage.write_oom_marker(job_url, 4, "1")
    assert bytes(storage.read_result(job_url, 4)) == b"a result"
    assert storage.list_results(job_url) == {4} and storage.list_oom_markers(job_url) == {3, 4}
    # signed like every object: an unsigned or foreign marker is refused, and counts as none
    storage.put_bytes(storage.oom_marker_url(job_url, 5), b'{"attempt": "1"}')
    with pytest.raises(IntegrityError):
        storage.read_oom_marker(job_url, 5)
    other = Storage(storage.root_url, signer=type(storage.signer).from_key("another-key-" + "x" * 40))
    other.write_oom_marker(job_url, 6, "1")
    with pytest.raises(IntegrityError):
        storage.read_oom_marker(job_url, 6)
    found = storage.oom_markers(job_url, [3, 5, 6, 7])
    assert found[3]["attempt"] == "2" and found[5] is None and found[6] is None and found[7] is None
    many = storage.oom_markers(job_url, list(range(20)))  # past a few: listed first
    assert {i for i, marker in many.items() if marker} == {3, 4}


# -- classification ---------------------------------------------------------------------------------
def _failed(exit_code=137, reason=None, status_reason=EXITED, attempts=1, memory=512, **extra):
    attempt = {"container": {"exitCode": exit_code, **({"reason": reason} if reason else {})},
               "statusReason": status_reason}
    return {"jobId": "job-1", "status": "FAILED", "statusReason": status_reason,
            "attempts": [attempt] * attempts,
            "container": {"exitCode": exit_code,
                          "resourceRequirements": [{"type": "MEMORY", "value": str(memory)}]},
            **extra}


MARKER = {"attempt": "1", "time": 0.0}


def test_exit_137_with_the_marker_is_memory_limit_exceeded():
    error = classify_failure(_failed(), oom_marker=MARKER)
    assert type(error) is MemoryLimitExceeded
    assert error.memory_mib == 512 and error.exit_code == 137
    assert "MemoryError" in str(error) and "1GiB" in str(error)
    # reconcile hands the marker over inside the description
    error = classify_failure({**_failed(), OOM_MARKER_FIELD: MARKER})
    assert type(error) is MemoryLimitExceeded and error.memory_mib == 512


@pytest.mark.parametrize("description, marker, expected", [
    (_failed(), None, JobFailedError),                         # a plain SIGKILL: no marker
    (_failed(exit_code=1), MARKER, JobFailedError),            # not the worker's exit on MemoryError
    (_failed(attempts=2), MARKER, JobFailedError),             # an earlier attempt's marker
    (_failed(attempts=2), {"attempt": "2"}, MemoryLimitExceeded),
    (_failed(), {"attempt": None}, MemoryLimitExceeded),       # attempt unknown: it counts
    (_failed(status_reason="Job attempt duration exceeded timeout"), MARKER, JobTimeoutError),
    (_failed(reason=OOM_REASON), None, MemoryLimitExceeded),   # the kernel's kill, as before
])
def test_the_marker_counts_only_for_the_last_attempts_own_exit_137(description, marker, expected):
    assert type(classify_failure(description, oom_marker=marker)) is expected


def test_only_an_unexplained_exit_137_asks_for_the_marker():
    assert wants_oom_marker(_failed())
    assert not wants_oom_marker(_failed(reason=OOM_REASON))   # the reason says it already
    assert not wants_oom_marker(_failed(exit_code=1))
    assert not wants_oom_marker(_failed(status_reason="batchfutures: aborted by the user"))
    assert not wants_oom_marker(_failed(status_reason="Host EC2 (instance i-0abc) terminated."))
    assert not wants_oom_marker(_failed(isTerminated=True))


# -- reconcile reads the marker of a failed child with exit 137 and no reason ---------------------
def _view(array):
    size = 3 if array else 1
    return JobFacts(job_id="job-1", array=array, size=size, open=frozenset(range(size)),
                   started=frozenset(), status=JobStatus.RUNNING,
                   summary={"RUNNING": size} if array else {}, submitted_at=0.0, now=100.0)


def test_a_plain_job_reads_its_marker_before_it_fails():
    view, reads = _view(False), Reads(_failed())
    assert reconcile(view, reads).needs.markers == (0,)
    reads.markers[0] = MARKER
    step = reconcile(view, reads)
    assert not step.needs
    assert type(classify_failure(step.actions.failed[0])) is MemoryLimitExceeded
    # no marker: the same exit 137 is a plain failure
    reads = Reads(_failed())
    reads.markers[0] = None
    failed = reconcile(view, reads).actions.failed[0]
    assert type(classify_failure(failed)) is JobFailedError
    # the kernel's reason: no read at all
    assert not reconcile(view, Reads(_failed(reason=OOM_REASON))).needs


def test_an_array_reads_the_markers_of_its_unexplained_137s_only():
    description = {"jobId": "job-1", "status": "RUNNING",
                   "arrayProperties": {"size": 3, "statusSummary": {"RUNNING": 1, "FAILED": 2}},
                   "container": {"resourceRequirements": [{"type": "MEMORY", "value": "512"}]}}
    reads = Reads(description)
    reads.listings[JobStatus.FAILED] = [
        {"jobId": "job-1:0", "arrayProperties": {"index": 0}, "status": "FAILED"},
        {"jobId": "job-1:2", "arrayProperties": {"index": 2}, "status": "FAILED"}]
    reads.children = {0: {**_failed(), "jobId": "job-1:0"},
                      2: {**_failed(exit_code=3), "jobId": "job-1:2"}}
    view = _view(True)
    assert reconcile(view, reads).needs.markers == (0,)
    reads.markers[0] = MARKER
    reads.stored = frozenset()
    actions = reconcile(view, reads).actions
    assert type(classify_failure(actions.failed[0])) is MemoryLimitExceeded
    assert type(classify_failure(actions.failed[2])) is JobFailedError


# -- real jobs ------------------------------------------------------------------------------------
def raise_memory_error(x):
    raise MemoryError("the function says it is out of memory")


def memory_error_once(flag):
    """MemoryError on the first try, a value on the next (the retry_on_oom one)."""
    if not os.path.exists(flag):
        open(flag, "w").close()
        raise MemoryError
    return "fits now"


def _description(job_id):
    import boto3

    (description,) = boto3.client("batch", region_name="us-east-1").describe_jobs(
        jobs=[job_id])["jobs"]
    return description


def _memory_of(description):
    return int(next(r["value"] for r in description["container"]["resourceRequirements"]
                    if r["type"] == "MEMORY"))


@pytest.mark.slow
def test_a_memory_error_is_an_oom_locally_and_retry_on_oom_retries_it(local_env, tmp_path):
    # cgroups here (root on Linux): a MemoryError is no kernel kill, only the marker says it;
    # under RLIMIT the emulator's reason says it too. Either way: MemoryLimitExceeded.
    with BatchExecutor(local_env, memory=256) as ex:
        error = ex.submit(raise_memory_error, 1).exception(timeout=120)
        retried = ex.with_settings(retry_on_oom=1).submit(memory_error_once,
                                                          str(tmp_path / "flag"))
        assert retried.result(timeout=120) == "fits now"
    assert type(error) is MemoryLimitExceeded and error.memory_mib == 256
    assert error.exit_code == 137


@pytest.mark.slow
def test_on_aws_a_memory_error_fails_as_memory_limit_exceeded_and_is_retried(tmp_path,
                                                                              s3_endpoint):
    from s3server import emulator_endpoint, emulator_environment, new_bucket

    from batchfutures.emulator.runtime import cgroups

    if cgroups.detect() is None:
        pytest.skip("needs cgroups (root on Linux): under RLIMIT the emulator gives the reason")
    with emulator_endpoint(tmp_path / "emulator", max_vcpus=2, isolation="cgroups"):
        env = emulator_environment(new_bucket())
        with BatchExecutor(env, memory=400) as ex:
            failed = ex.submit(raise_memory_error, 1)
            error = failed.exception(timeout=180)
            # Batch sees exit 137 and no reason: a crash to it, retried when retries > 1
            twice = ex.with_settings(retries=2).submit(raise_memory_error, 2)
            twice_error = twice.exception(timeout=180)
            retried = ex.with_settings(retry_on_oom=1).submit(memory_error_once,
                                                              str(tmp_path / "flag"))
            assert retried.result(timeout=180) == "fits now"
            first = _description(failed.job_id)
            again = _description(retried.job_id)
            batch_tries = len(_description(twice.job_id)["attempts"])
    # the kernel killed nothing: Batch's account has no OutOfMemoryError reason...
    container = first["attempts"][-1]["container"]
    assert container["exitCode"] == 137 and not container.get("reason")
    assert not (first.get("statusReason") or "").startswith("OutOfMemoryError")
    # ...and the marker makes it the out-of-memory failure it is
    assert type(error) is MemoryLimitExceeded and error.memory_mib == 400
    assert error.job_id == failed.job_id
    assert type(twice_error) is MemoryLimitExceeded and batch_tries == 2
    # retry_on_oom resubmitted it with more memory (EC2 doubling: 400 -> 800)
    assert retried.job_id != failed.job_id and _memory_of(again) == 800
    assert _oom_keys(env.io_bucket)  # the markers, in the bucket beside the results


def _oom_keys(bucket):
    import boto3

    pages = boto3.client("s3", region_name="us-east-1").get_paginator("list_objects_v2")
    return [item["Key"] for page in pages.paginate(Bucket=bucket)
            for item in page.get("Contents", []) if "/oom/" in item["Key"]]


def allocate(mib):
    return len(bytearray(mib * 1024 * 1024)) // (1024 * 1024)


@pytest.mark.slow
def test_on_aws_a_real_rlimit_shortage_still_records_the_marker(tmp_path, s3_endpoint):
    # RLIMIT_DATA: the allocation over the limit raises MemoryError and the emulator gives the
    # reason; the marker is written all the same, in the attempt that just ran out
    from s3server import emulator_endpoint, emulator_environment, new_bucket

    with emulator_endpoint(tmp_path / "emulator", max_vcpus=2, isolation="rlimit"):
        env = emulator_environment(new_bucket())
        with BatchExecutor(env, memory=256) as ex:
            future = ex.submit(allocate, 600)
            error = future.exception(timeout=180)
            reason = _description(future.job_id)["attempts"][-1]["container"].get("reason")
    assert type(error) is MemoryLimitExceeded and error.memory_mib == 256
    assert reason.startswith("OutOfMemoryError")
    assert len(_oom_keys(env.io_bucket)) == 1
