"""SubmitJob exactly once while Batch lags: the look-up lasts the poller's describe grace.

A stock boto3 client drives the emulator's HTTP endpoint. The emulator's FaultProfile makes
DescribeJobs (describe_lag) and ListJobs (list_lag) leave out jobs created less than that many
seconds ago, as AWS's eventual consistency after SubmitJob does; its lost_reply_rate, or a
loopback proxy in front of it (tests/loopback_proxy.py), makes a SubmitJob create its job and
answer 500. The grace is the environment's `describe_grace` (shortened on the instance in the
tests that must wait it out).
"""

import os
import time
import uuid

import boto3
import pytest
from botocore.config import Config
from loopback_proxy import Forward, ForwardThen, LoopbackProxy
from s3server import emulator_endpoint

from batchfutures import AWSBatchEnvironment, BatchExecutor
from batchfutures.awsclients import CLIENT_CONFIG
from batchfutures.batchapi import DUPLICATE_REASON, submit_exactly_once
from batchfutures.emulator.faults import FaultProfile
from batchfutures.environments import BaseEnvironment

REGION = "us-east-1"
QUEUE = "batchfutures"


def square(x):
    return x * x


@pytest.fixture(scope="module")
def endpoint(tmp_path_factory, s3_endpoint):
    with emulator_endpoint(tmp_path_factory.mktemp("lag-emulator"), max_vcpus=2) as emulator:
        yield emulator, os.environ["AWS_ENDPOINT_URL_BATCH"]
        emulator.set_faults(None)


@pytest.fixture
def bucket(s3_endpoint):
    name = f"bf-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", region_name=REGION).create_bucket(Bucket=name)
    return name


def jobs_named(batch, name):
    found = batch.list_jobs(jobQueue=QUEUE, filters=[{"name": "JOB_NAME", "values": [name]}])
    return [j for j in found["jobSummaryList"] if j["jobName"] == name]


def first_submit_answers_500():
    """A proxy rule: the first SubmitJob creates its job and the client is told 500."""
    seen = []

    def rule(request):
        if request.method == "POST" and request.path.startswith("/v1/submitjob") and not seen:
            seen.append(request)
            return ForwardThen(500, b'{"message": "internal"}',
                               {"x-amzn-ErrorType": "ServerException"})
        return Forward()
    return rule


def test_the_look_up_lasts_the_pollers_grace():
    """One definition: AWSBatchEnvironment's describe_grace is the poller's (BaseEnvironment's)."""
    env = AWSBatchEnvironment(job_queue=QUEUE, io_bucket="some-bucket",
                              job_definition="batchfutures-worker", region_name=REGION)
    assert env.describe_grace == BaseEnvironment.describe_grace == 60.0


@pytest.mark.slow
def test_no_duplicate_while_describe_jobs_lags_60_seconds(endpoint, bucket):
    emulator, _ = endpoint
    # every SubmitJob creates its job and answers 500; DescribeJobs shows a job after 60 s
    emulator.set_faults(FaultProfile(describe_lag=60, lost_reply_rate=1.0))
    try:
        env = AWSBatchEnvironment(job_queue=QUEUE, io_bucket=bucket,
                                  job_definition="batchfutures-worker", region_name=REGION)
        assert env.describe_grace == 60.0  # the default: the look-up may wait this long
        with BatchExecutor(env) as executor:
            future = executor.submit(square, 7)
            deadline = time.monotonic() + 30
            while future.job_id is None and time.monotonic() < deadline:  # submitted in a moment
                time.sleep(0.05)
            assert future.job_id is not None
            assert emulator.faults.injected == 1  # one SubmitJob sent, its answer lost
            batch = boto3.client("batch", region_name=REGION)
            assert batch.describe_jobs(jobs=[future.job_id])["jobs"] == []  # still lagging
            (summary,) = [s for s in batch.list_jobs(
                jobQueue=QUEUE, filters=[{"name": "JOB_NAME", "values": ["bf-square-*"]}])[
                    "jobSummaryList"] if s["jobId"] == future.job_id]
            assert len(jobs_named(batch, summary["jobName"])) == 1  # no duplicate
            emulator.set_faults(None)  # Batch catches up: the job runs to its result
            assert future.result(timeout=60) == 49
        assert len(jobs_named(batch, summary["jobName"])) == 1
    finally:
        emulator.set_faults(None)


@pytest.mark.slow
def test_a_job_listed_late_but_within_the_grace_is_found(endpoint, bucket):
    emulator, upstream = endpoint
    emulator.set_faults(FaultProfile(describe_lag=2, list_lag=2))
    try:
        with LoopbackProxy(upstream, first_submit_answers_500()) as proxy, \
                pytest.MonkeyPatch.context() as patch:
            patch.setenv("AWS_ENDPOINT_URL_BATCH", proxy.url)
            env = AWSBatchEnvironment(job_queue=QUEUE, io_bucket=bucket,
                                      job_definition="batchfutures-worker", region_name=REGION)
            env.describe_grace = 5.0  # the look-up and the poller wait out the 2 s lag
            with BatchExecutor(env) as executor:
                future = executor.submit(square, 8)
                assert future.result(timeout=60) == 64
            submits = [r for r in proxy.requests if r.path.startswith("/v1/submitjob")]
        assert len(submits) == 1  # found, never sent again
        batch = boto3.client("batch", region_name=REGION, endpoint_url=upstream)
        (job,) = batch.describe_jobs(jobs=[future.job_id])["jobs"]
        assert len(jobs_named(batch, job["jobName"])) == 1
    finally:
        emulator.set_faults(None)


@pytest.mark.slow
def test_a_resubmission_after_the_grace_terminates_the_late_first_job(endpoint):
    emulator, upstream = endpoint
    # the first job shows in listings 1.5 s after it was made, after the 1 s look-up ended
    emulator.set_faults(FaultProfile(describe_lag=1.5, list_lag=1.5))
    try:
        with LoopbackProxy(upstream, first_submit_answers_500()) as proxy:
            client = boto3.client("batch", region_name=REGION, endpoint_url=proxy.url,
                                  config=Config(**CLIENT_CONFIG))  # botocore's retries off
            request = {"jobName": "bf-late", "jobQueue": QUEUE,
                       "jobDefinition": "batchfutures-worker",
                       # long enough to be terminated while it runs
                       "containerOverrides": {"command": ["python", "-c",
                                                          "import time; time.sleep(20)"]}}
            response = submit_exactly_once(client, request, grace=1.0)
            submits = [r for r in proxy.requests if r.path.startswith("/v1/submitjob")]
            assert len(submits) == 2  # nothing showed within the grace: sent again
            kept = response["jobId"]
            batch = boto3.client("batch", region_name=REGION, endpoint_url=upstream)
            name = response["jobName"]
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:  # the second look, a grace later
                jobs = {j["jobId"]: j for j in jobs_named(batch, name)}
                if len(jobs) == 2 and any(j["status"] == "FAILED" for j in jobs.values()):
                    break
                time.sleep(0.2)
        assert set(jobs) >= {kept} and len(jobs) == 2
        (extra,) = [j for i, j in jobs.items() if i != kept]
        assert extra["status"] == "FAILED"
        assert extra["statusReason"] == f"{DUPLICATE_REASON} {kept}"
        assert jobs[kept]["status"] != "FAILED"
        batch.terminate_job(jobId=kept, reason="test over")
    finally:
        emulator.set_faults(None)
