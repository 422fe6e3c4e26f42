"""Requests Batch refuses, refused as Batch does: ClientException, HTTP 400, nothing submitted."""

import pytest
from botocore.exceptions import ClientError
from emulator_harness import DEFINITION, QUEUE, py


def refused(call, **params):
    with pytest.raises(ClientError) as raised:
        call(**params)
    error = raised.value.response
    assert error["Error"]["Code"] == "ClientException"
    assert error["ResponseMetadata"]["HTTPStatusCode"] == 400
    assert error["Error"]["Message"]
    return error["Error"]["Message"]


def submit(emu, **changes):
    request = dict(jobName="ok", jobQueue=QUEUE, jobDefinition=DEFINITION,
                   containerOverrides={"command": py("pass")})
    request.update(changes)
    return emu.submit_job(**{k: v for k, v in request.items() if v is not None})


@pytest.mark.parametrize("size", [0, 1, 10_001])
def test_array_size_must_be_2_to_10000(emu, size):
    refused(lambda **p: submit(emu, **p), arrayProperties={"size": size})


@pytest.mark.slow
def test_array_sizes_at_the_limits_are_accepted(emu):
    two = submit(emu, arrayProperties={"size": 2})["jobId"]
    big = submit(emu, arrayProperties={"size": 10_000})["jobId"]
    emu.cancel_job(jobId=big, reason="only checking it is accepted")
    assert emu.wait(two)["status"] == "SUCCEEDED"
    assert emu.wait(big)["status"] == "FAILED"


def test_describe_jobs_takes_at_most_100_ids(emu):
    refused(emu.describe_jobs, jobs=[f"id-{i}" for i in range(101)])
    assert emu.describe_jobs(jobs=[f"id-{i}" for i in range(100)]) == {"jobs": []}


@pytest.mark.slow
def test_a_submit_request_over_30_kib_is_refused(emu):
    # the whole request counts: here a long environment value
    refused(lambda **p: submit(emu, **p), containerOverrides={
        "command": py("pass"), "environment": [{"name": "BIG", "value": "x" * 31_000}]})
    accepted = submit(emu, containerOverrides={
        "command": py("pass"), "environment": [{"name": "BIG", "value": "x" * 20_000}]})
    assert emu.wait(accepted["jobId"])["status"] == "SUCCEEDED"


@pytest.mark.parametrize("name", ["", "-starts-with-hyphen", "_underscore", "has space", "dot.ted",
                                  "x" * 129, "slash/name", "ok\n", "ünïcode"])
def test_bad_job_names_are_refused(emu, name):
    refused(lambda **p: submit(emu, **p), jobName=name)


@pytest.mark.parametrize("name", ["a", "A1", "9lives", "with-hyphen_and_underscore", "x" * 128])
def test_good_job_names_are_accepted(emu, name):
    assert submit(emu, jobName=name)["jobName"] == name


def test_an_unknown_queue_is_refused(emu):
    refused(lambda **p: submit(emu, **p), jobQueue="no-such-queue")
    refused(lambda **p: submit(emu, **p), jobQueue="arn:aws:batch:us-east-1:123456789012:job-queue/nope")
    refused(emu.list_jobs, jobQueue="no-such-queue")


@pytest.mark.slow
def test_a_queue_by_arn_is_accepted(emu):
    arn = emu.describe_job_queues(jobQueues=[QUEUE])["jobQueues"][0]["jobQueueArn"]
    assert emu.wait(submit(emu, jobQueue=arn)["jobId"])["status"] == "SUCCEEDED"


@pytest.mark.parametrize("definition", ["no-such-definition", f"{DEFINITION}:99",
                                        "arn:aws:batch:us-east-1:123456789012:job-definition/nope:1"])
def test_an_unknown_definition_is_refused(emu, definition):
    refused(lambda **p: submit(emu, **p), jobDefinition=definition)


@pytest.mark.parametrize("attempts", [0, 11])
def test_retry_attempts_must_be_1_to_10(emu, attempts):
    refused(lambda **p: submit(emu, **p), retryStrategy={"attempts": attempts})


@pytest.mark.slow
def test_a_disabled_queue_refuses_jobs_until_enabled(emu):
    emu.update_job_queue(jobQueue=QUEUE, state="DISABLED")
    assert emu.describe_job_queues(jobQueues=[QUEUE])["jobQueues"][0]["state"] == "DISABLED"
    refused(lambda **p: submit(emu, **p))
    emu.update_job_queue(jobQueue=QUEUE, state="ENABLED")
    assert emu.wait(submit(emu)["jobId"])["status"] == "SUCCEEDED"


def test_a_dependency_on_an_unknown_job_is_refused(emu):
    refused(lambda **p: submit(emu, **p), dependsOn=[{"jobId": "00000000-0000-0000-0000-000000000000"}])


def test_a_bad_list_jobs_token_is_refused(emu):
    refused(emu.list_jobs, jobQueue=QUEUE, jobStatus="SUCCEEDED", nextToken="not-a-token")


def test_refused_requests_submit_nothing(emu):
    for bad in ({"jobName": "bad name"}, {"arrayProperties": {"size": 1}}, {"jobQueue": "nope"}):
        with pytest.raises(ClientError):
            submit(emu, **bad)
    for status in ("SUBMITTED", "PENDING", "RUNNABLE", "STARTING", "RUNNING", "SUCCEEDED", "FAILED"):
        assert emu.list_jobs(jobQueue=QUEUE, jobStatus=status)["jobSummaryList"] == []
