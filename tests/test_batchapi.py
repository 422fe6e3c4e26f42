"""Batch API calls: which failures are retried or resubmitted, and SubmitJob exactly once.

The decisions are pure functions of the exception (table tests, milliseconds). The end-to-end
tests drive a stock boto3 client against the emulator's HTTP endpoint through a loopback proxy
(tests/loopback_proxy.py) that gives AWS's ambiguous answers: the job is created, and the client
is told 500, or its connection is closed before the answer.
"""

import json
import os
import time
import uuid

import boto3
import pytest
from botocore.exceptions import (
    ClientError,
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    ParamValidationError,
    ReadTimeoutError,
)
from loopback_proxy import Answer, Forward, ForwardThen, ForwardThenClose, LoopbackProxy
from s3server import emulator_endpoint

from batchfutures import AWSBatchEnvironment, BatchExecutor, JobAbortedError, batchapi
from batchfutures.batchapi import (
    SUBMISSION_TAG,
    RetryBudget,
    SubmitVerdict,
    call,
    is_retryable,
    is_safe_to_resubmit,
    submission_jobs,
    submit_exactly_once,
    submit_verdict,
    with_submission_token,
)

REGION = "us-east-1"
NO_WAIT = RetryBudget(attempts=4, seconds=60, first_wait=0, max_wait=0)


def client_error(status, code="ServerException"):
    return ClientError({"Error": {"Code": code, "Message": "m"},
                        "ResponseMetadata": {"HTTPStatusCode": status}}, "SubmitJob")


URL = "http://127.0.0.1:1/v1/submitjob"
CASES = [
    # (failure, retryable, safe to resubmit, verdict)
    (client_error(429, "TooManyRequestsException"), True, True, SubmitVerdict.RESUBMIT),
    (client_error(400, "ThrottlingException"), True, True, SubmitVerdict.RESUBMIT),
    (client_error(500, "ServerException"), True, False, SubmitVerdict.LOOK_UP),
    (client_error(502, "BadGateway"), True, False, SubmitVerdict.LOOK_UP),
    (client_error(503, "ServiceUnavailable"), True, False, SubmitVerdict.LOOK_UP),
    (client_error(504, "GatewayTimeout"), True, False, SubmitVerdict.LOOK_UP),
    (ReadTimeoutError(endpoint_url=URL), True, False, SubmitVerdict.LOOK_UP),
    (ConnectionClosedError(endpoint_url=URL), True, False, SubmitVerdict.LOOK_UP),
    (EndpointConnectionError(endpoint_url=URL), True, True, SubmitVerdict.RESUBMIT),
    (ConnectTimeoutError(endpoint_url=URL), True, True, SubmitVerdict.RESUBMIT),
    (client_error(400, "ClientException"), False, False, SubmitVerdict.GIVE_UP),
    (client_error(403, "AccessDeniedException"), False, False, SubmitVerdict.GIVE_UP),
    (ParamValidationError(report="bad"), False, False, SubmitVerdict.GIVE_UP),
    (ValueError("not an API failure"), False, False, SubmitVerdict.GIVE_UP),
]


@pytest.mark.parametrize("failure, retryable, safe, verdict", CASES,
                         ids=[type(c[0]).__name__ + "-" + str(i) for i, c in enumerate(CASES)])
def test_failure_decisions(failure, retryable, safe, verdict):
    assert is_retryable(failure) is retryable
    assert is_safe_to_resubmit(failure) is safe
    assert submit_verdict(failure) is verdict


def test_every_submission_is_marked_uniquely():
    request = {"jobName": "bf-" + "x" * 200, "jobQueue": "q", "tags": {"team": "a"}}
    first, second = (with_submission_token(request, uuid.uuid4().hex) for _ in range(2))
    assert first["jobName"] != second["jobName"]
    assert len(first["jobName"]) <= 128 and first["jobName"].startswith("bf-xxx")
    assert first["tags"]["team"] == "a" and len(first["tags"][SUBMISSION_TAG]) == 32
    assert request["tags"] == {"team": "a"}  # the caller's request is left alone


class Scripted:
    """A stand-in for a Batch client whose methods answer from a script (exceptions or values)."""

    def __init__(self, **scripts):
        self.scripts = {name: list(answers) for name, answers in scripts.items()}
        self.calls = []

    def __getattr__(self, name):
        def method(**params):
            self.calls.append((name, params))
            answer = self.scripts[name].pop(0)
            if isinstance(answer, BaseException):
                raise answer
            return answer(params) if callable(answer) else answer
        return method


def test_one_budget_per_call_not_one_per_layer():
    throttled = Scripted(describe_jobs=[client_error(429, "TooManyRequestsException")] * 20)
    with pytest.raises(ClientError):
        call(throttled.describe_jobs, budget=RetryBudget(attempts=3, first_wait=0, max_wait=0),
             jobs=["a"])
    assert len(throttled.calls) == 3
    with pytest.raises(ClientError):  # a narrower budget for one call
        call(throttled.describe_jobs, budget=RetryBudget(first_wait=0, max_wait=0), attempts=2,
             jobs=["a"])
    assert len(throttled.calls) == 5


def submit_job(client, request):
    """SubmitJob exactly once, with no waits and a look-up that looks once."""
    return submit_exactly_once(client, request, budget=NO_WAIT, grace=0)


def test_a_refused_submission_is_not_sent_again():
    client = Scripted(submit_job=[client_error(400, "ClientException")])
    with pytest.raises(ClientError):
        submit_job(client, {"jobName": "bf-f", "jobQueue": "q"})
    assert [name for name, _ in client.calls] == ["submit_job"]


def test_a_throttled_submission_is_sent_again_without_a_look_up():
    client = Scripted(submit_job=[client_error(429, "TooManyRequestsException"), {"jobId": "j1"}])
    assert submit_job(client, {"jobName": "bf-f", "jobQueue": "q"})["jobId"] == "j1"
    assert [name for name, _ in client.calls] == ["submit_job", "submit_job"]
    first, second = (params for _, params in client.calls)
    assert first == second  # the same name and tag: one submission, sent twice


def test_an_ambiguous_failure_is_looked_up_before_anything_is_sent_again():
    made = {}

    def listing(params):
        (name,) = params["filters"][0]["values"]
        return {"jobSummaryList": [{"jobId": "other", "jobName": name}, {"jobId": "j1", "jobName": name}]}

    def describe(params):
        return {"jobs": [{"jobId": "other", "tags": {SUBMISSION_TAG: "someone else"}},
                         {"jobId": "j1", "jobName": made["name"], "tags": made["tags"]}]}

    def created_then_500(params):
        made.update(name=params["jobName"], tags=params["tags"])
        raise client_error(500)

    client = Scripted(submit_job=[created_then_500], list_jobs=[listing], describe_jobs=[describe])
    response = submit_job(client, {"jobName": "bf-f", "jobQueue": "q"})
    assert response["jobId"] == "j1"
    assert [name for name, _ in client.calls] == ["submit_job", "list_jobs", "describe_jobs"]


def test_an_ambiguous_failure_that_created_nothing_is_sent_again():
    client = Scripted(submit_job=[ReadTimeoutError(endpoint_url=URL), {"jobId": "j2"}],
                      list_jobs=[{"jobSummaryList": []}] * 3, describe_jobs=[])
    assert submit_job(client, {"jobName": "bf-f", "jobQueue": "q"})["jobId"] == "j2"
    # looked for once (the grace is 0), sent again, then looked for extras (and once more later)
    assert [name for name, _ in client.calls][:4] == ["submit_job", "list_jobs", "submit_job",
                                                      "list_jobs"]


def test_a_failed_look_up_never_resubmits():
    client = Scripted(submit_job=[client_error(503, "ServiceUnavailable")],
                      list_jobs=[client_error(403, "AccessDeniedException")])
    with pytest.raises(Exception, match=SUBMISSION_TAG):
        submit_job(client, {"jobName": "bf-f", "jobQueue": "q"})
    assert [name for name, _ in client.calls].count("submit_job") == 1


# -- end to end: stock boto3, the emulator's HTTP endpoint, a proxy giving AWS's bad answers ----
def square(x):
    return x * x


@pytest.fixture(scope="module")
def endpoint(tmp_path_factory, s3_endpoint):
    with emulator_endpoint(tmp_path_factory.mktemp("batchapi-emulator"), max_vcpus=2) as emulator:
        yield emulator, os.environ["AWS_ENDPOINT_URL_BATCH"]


@pytest.fixture
def bucket(s3_endpoint):
    name = f"bf-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", region_name=REGION).create_bucket(Bucket=name)
    return name


def first_submit_only(action):
    """A proxy rule: the first SubmitJob gets ``action``, everything else is passed on."""
    seen = []

    def rule(request):
        if request.method == "POST" and request.path.startswith("/v1/submitjob") and not seen:
            seen.append(request)
            return action
        return Forward()
    return rule


def jobs_named(batch, prefix):
    found = batch.list_jobs(jobQueue="batchfutures",
                            filters=[{"name": "JOB_NAME", "values": [prefix + "*"]}])
    return found["jobSummaryList"]


@pytest.mark.slow
@pytest.mark.parametrize("action", [ForwardThen(500, b'{"message": "internal"}',
                                                {"x-amzn-ErrorType": "ServerException"}),
                                    ForwardThenClose(),
                                    Answer(429, b'{"message": "Rate exceeded"}',
                                           {"x-amzn-ErrorType": "TooManyRequestsException"})],
                         ids=["created-then-500", "created-then-closed", "throttled"])
def test_submit_job_exactly_once_through_bad_answers(endpoint, bucket, monkeypatch, action):
    emulator, upstream = endpoint
    with LoopbackProxy(upstream, first_submit_only(action)) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL_BATCH", proxy.url)
        env = AWSBatchEnvironment(job_queue="batchfutures", io_bucket=bucket,
                                  job_definition="batchfutures-worker", region_name=REGION)
        with BatchExecutor(env) as executor:
            future = executor.submit(square, 7)
            assert future.result(timeout=60) == 49
        submits = [r for r in proxy.requests if r.path.startswith("/v1/submitjob")]
        lookups = [r for r in proxy.requests if r.path.startswith("/v1/listjobs")]
    batch = boto3.client("batch", region_name=REGION, endpoint_url=upstream)
    (job,) = [j for j in batch.describe_jobs(jobs=[future.job_id])["jobs"]]
    name = job["jobName"]
    assert len(jobs_named(batch, name)) == 1  # exactly one job of this unique name exists
    if isinstance(action, Answer) and not isinstance(action, ForwardThen):
        assert len(submits) == 2 and not lookups  # throttled: surely not made, sent again
    else:
        assert len(submits) == 1 and lookups  # made: found by its name, never sent again


def test_found_submission_matches_the_tag_not_just_the_name(endpoint):
    _, upstream = endpoint
    batch = boto3.client("batch", region_name=REGION, endpoint_url=upstream)
    base = {"jobName": f"bf-twin-{uuid.uuid4().hex[:6]}", "jobQueue": "batchfutures",
            "jobDefinition": "batchfutures-worker",
            "containerOverrides": {"command": ["python", "-c", "pass"]}}
    ours = with_submission_token(base, uuid.uuid4().hex)
    theirs = dict(ours, tags={SUBMISSION_TAG: uuid.uuid4().hex})  # same name, another submission
    other = batch.submit_job(**theirs)["jobId"]
    assert submission_jobs(batch, ours) == []
    mine = batch.submit_job(**ours)["jobId"]
    assert [job["jobId"] for job in submission_jobs(batch, ours)] == [mine] != [other]


# -- stopping jobs in bulk -------------------------------------------------------------------------
def test_jobs_are_stopped_fifty_at_a_time_and_the_refused_ones_reported():
    ids = [f"j{i}" for i in range(120)]

    def answer(params):
        return {"successful": [j for j in params["jobs"] if j != "j7"],
                "errors": [{"job": "j7", "code": "ClientException", "message": "no such job"}]
                if "j7" in params["jobs"] else []}

    client = Scripted(cancel_jobs=[answer] * 3)
    failed = batchapi.stop_jobs(client, batchapi.Stop.CANCEL, ids, "stop")
    assert [len(params["jobs"]) for _, params in client.calls] == [50, 50, 20]
    assert all(params["reason"] == "stop" for _, params in client.calls)
    assert failed == {"j7": "ClientException: no such job"}


def test_a_client_without_the_bulk_calls_stops_each_job():
    class Older:  # a botocore model from before CancelJobs/TerminateJobs
        def __init__(self):
            self.calls = []

        def terminate_job(self, **params):
            self.calls.append(params)
            if params["jobId"] == "b":
                raise client_error(400, "ClientException")
            return {}

    client = Older()
    failed = batchapi.stop_jobs(client, batchapi.Stop.TERMINATE, ["a", "b", "c"], "why")
    assert [c["jobId"] for c in client.calls] == ["a", "b", "c"] and list(failed) == ["b"]


@pytest.mark.slow
def wait_until_running(future, timeout=60.0):
    deadline = time.monotonic() + timeout
    while not future.running():
        assert time.monotonic() < deadline, f"{future.job_id} never started"
        time.sleep(0.05)


def test_terminate_workers_stops_the_jobs_with_terminate_jobs_calls(endpoint, bucket):
    emulator, upstream = endpoint
    with LoopbackProxy(upstream, lambda request: Forward()) as proxy:
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("AWS_ENDPOINT_URL_BATCH", proxy.url)
            env = AWSBatchEnvironment(job_queue="batchfutures", io_bucket=bucket,
                                      job_definition="batchfutures-worker", region_name=REGION)
            executor = BatchExecutor(env)
            futures = [executor.with_settings(environment={"N": str(i)}).submit(time.sleep, 60)
                       for i in range(2)]  # two Batch jobs (different settings), both running
            for future in futures:
                wait_until_running(future)
            executor.terminate_workers()
        bulk = [r for r in proxy.requests if r.path.startswith("/v1/terminatejobs")]
        stopped = json.loads(bulk[0].body)["jobs"] if bulk else []
        single = [r for r in proxy.requests if r.path.startswith("/v1/terminatejob")
                  and not r.path.startswith("/v1/terminatejobs")]
    assert len(bulk) == 1 and not single
    assert sorted(stopped) == sorted(f.job_id for f in futures)
    assert all(isinstance(f.exception(timeout=60), JobAbortedError) for f in futures)
