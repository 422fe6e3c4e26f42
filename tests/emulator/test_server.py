"""The emulator over HTTP, driven by stock boto3 clients (batch, logs) on 127.0.0.1."""

import http.client
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError, EndpointConnectionError

from batchfutures.emulator import BatchEmulator
from batchfutures.emulator.server import EmulatorServer

QUEUE, DEFINITION, GROUP = "batchfutures", "batchfutures-worker", "/aws/batch/job"
REPO = Path(__file__).resolve().parents[2]
NO_RETRIES = Config(retries={"mode": "standard", "max_attempts": 0})


def client(name, endpoint_url, config=None):
    return boto3.client(name, endpoint_url=endpoint_url, region_name="us-east-1",
                        aws_access_key_id="x", aws_secret_access_key="x", config=config)


@pytest.fixture(scope="module")
def emulator(tmp_path_factory):
    service = BatchEmulator(tmp_path_factory.mktemp("emulator"), max_vcpus=2)
    yield service
    service.close()


@pytest.fixture(scope="module")
def server(emulator):
    with EmulatorServer(emulator) as running:
        yield running


@pytest.fixture
def batch(server):
    return client("batch", server.endpoint_url, NO_RETRIES)


@pytest.fixture
def no_faults(emulator):
    yield emulator
    emulator.inject_faults(0)


def submit(batch, command, **extra):
    return batch.submit_job(jobName="server-test", jobQueue=QUEUE, jobDefinition=DEFINITION,
                            containerOverrides={"command": command}, **extra)["jobId"]


def wait_for(batch, job_id, statuses, limit=30.0):
    deadline = time.monotonic() + limit
    while True:
        job = batch.describe_jobs(jobs=[job_id])["jobs"][0]
        if job["status"] in statuses or time.monotonic() > deadline:
            return job
        time.sleep(0.02)


def raw_request(server, method, path, body=b"", headers=None):
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), json.loads(response.read() or b"{}")
    finally:
        connection.close()


def test_job_runs_and_its_log_reads_through_the_logs_client(server, batch):
    job_id = submit(batch, ["python", "-c", "print('hi')"])
    job = wait_for(batch, job_id, ("SUCCEEDED", "FAILED"))
    assert job["status"] == "SUCCEEDED"
    assert job["attempts"][-1]["container"]["exitCode"] == 0
    logs = client("logs", server.endpoint_url, NO_RETRIES)
    stream = job["attempts"][-1]["container"]["logStreamName"]
    messages, token = [], None
    for _ in range(100):  # follow nextForwardToken until it comes back unchanged
        page = logs.get_log_events(logGroupName=GROUP, logStreamName=stream, startFromHead=True,
                                   **({"nextToken": token} if token else {}))
        messages += [event["message"] for event in page["events"]]
        if page["nextForwardToken"] == token:
            break
        token = page["nextForwardToken"]
    assert messages == ["hi"]
    with pytest.raises(ClientError) as missing:
        logs.get_log_events(logGroupName=GROUP, logStreamName="no/such/stream")
    assert missing.value.response["Error"]["Code"] == "ResourceNotFoundException"


def test_array_children_are_listed_by_status(batch):
    job_id = submit(batch, ["python", "-c", "print(1)"], arrayProperties={"size": 3})
    assert wait_for(batch, job_id, ("SUCCEEDED", "FAILED"))["status"] == "SUCCEEDED"
    listed = batch.list_jobs(arrayJobId=job_id, jobStatus="SUCCEEDED")["jobSummaryList"]
    assert sorted(s["arrayProperties"]["index"] for s in listed) == [0, 1, 2]
    assert {s["jobId"] for s in listed} == {f"{job_id}:{i}" for i in range(3)}
    pages = batch.get_paginator("list_jobs").paginate(
        arrayJobId=job_id, jobStatus="SUCCEEDED", PaginationConfig={"PageSize": 2})
    assert sorted(s["jobId"] for page in pages for s in page["jobSummaryList"]) == \
        sorted(s["jobId"] for s in listed)


def test_validation_error_is_a_client_exception_with_http_400(server, batch):
    with pytest.raises(ClientError) as error:
        submit(batch, ["python", "-c", "pass"], arrayProperties={"size": 1})
    assert error.value.response["Error"]["Code"] == "ClientException"
    assert error.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
    # a request botocore would have refused (jobName missing) is refused by the server too
    status, headers, body = raw_request(server, "POST", "/v1/submitjob", json.dumps({"jobQueue": QUEUE}))
    assert status == 400 and headers["x-amzn-ErrorType"] == "ClientException"
    assert "jobName" in body["message"]
    status, _, body = raw_request(server, "POST", "/", json.dumps({"logGroupName": GROUP}),
                                  {"X-Amz-Target": "Logs_20140328.GetLogEvents",
                                   "Content-Type": "application/x-amz-json-1.1"})
    assert status == 400 and body["__type"] == "InvalidParameterException"
    assert "logStreamName" in body["message"]


def test_terminate_a_running_job(batch):
    job_id = submit(batch, ["python", "-c", "import time; time.sleep(60)"])
    assert wait_for(batch, job_id, ("RUNNING", "SUCCEEDED", "FAILED"))["status"] == "RUNNING"
    batch.terminate_job(jobId=job_id, reason="stopped by test_server")
    job = wait_for(batch, job_id, ("SUCCEEDED", "FAILED"))
    assert job["status"] == "FAILED"
    assert job["statusReason"] == "stopped by test_server"


def test_throttling_is_answered_by_botocore_retries(server, no_faults):
    emulator = no_faults
    before = emulator.faults.injected
    # seed 55 throttles the 1st and 3rd draws only: two calls each retried once
    emulator.inject_faults(0.5, seed=55, operations={"DescribeJobQueues"})
    patient = client("batch", server.endpoint_url, Config(retries={"mode": "standard", "max_attempts": 10}))
    retried = 0
    for _ in range(4):
        answer = patient.describe_job_queues(jobQueues=[QUEUE])
        assert answer["jobQueues"][0]["jobQueueName"] == QUEUE
        retried += answer["ResponseMetadata"]["RetryAttempts"]
    assert emulator.faults.injected > before
    assert retried > 0


def test_throttling_past_the_retries_is_too_many_requests(server, no_faults):
    no_faults.inject_faults(1.0, operations={"DescribeJobQueues"})
    impatient = client("batch", server.endpoint_url,
                       Config(retries={"mode": "standard", "total_max_attempts": 2}))
    with pytest.raises(ClientError) as error:
        impatient.describe_job_queues()
    response = error.value.response
    assert response["Error"]["Code"] == "TooManyRequestsException"
    assert response["ResponseMetadata"]["HTTPStatusCode"] == 429
    assert response["ResponseMetadata"]["RetryAttempts"] > 0


def test_unknown_routes_are_404(server):
    status, headers, body = raw_request(server, "POST", "/v1/nosuchoperation", b"{}")
    assert status == 404 and headers["x-amzn-ErrorType"] == "UnknownOperationException"
    assert "message" in body
    status, _, body = raw_request(server, "POST", "/", b"{}",
                                  {"X-Amz-Target": "Logs_20140328.NoSuchOperation",
                                   "Content-Type": "application/x-amz-json-1.1"})
    assert status == 404 and body["__type"] == "UnknownOperationException"
    # an operation of the model that the emulator does not implement
    with pytest.raises(ClientError) as error:
        client("batch", server.endpoint_url, NO_RETRIES).list_tags_for_resource(resourceArn="arn:x")
    assert error.value.response["Error"]["Code"] == "UnknownOperationException"
    assert error.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404


class Broken:
    def describe_job_queues(self, **params):
        raise RuntimeError("broken on purpose")

    def describe_jobs(self, **params):
        return {"jobs": []}


def test_an_unexpected_exception_is_a_logged_500_and_the_server_goes_on(caplog):
    with EmulatorServer(Broken()) as server:
        batch = client("batch", server.endpoint_url, NO_RETRIES)
        with caplog.at_level(logging.ERROR, logger="batchfutures"):
            with pytest.raises(ClientError) as error:
                batch.describe_job_queues()
        assert error.value.response["Error"]["Code"] == "ServerException"
        assert error.value.response["ResponseMetadata"]["HTTPStatusCode"] == 500
        assert any("broken on purpose" in (r.exc_text or "") for r in caplog.records)
        assert batch.describe_jobs(jobs=["a"])["jobs"] == []


def test_stop_closes_the_endpoint(emulator):
    server = EmulatorServer(emulator).start()
    url = server.endpoint_url
    batch = client("batch", url, Config(retries={"mode": "standard", "max_attempts": 0}, connect_timeout=2))
    batch.describe_job_queues()  # a kept-alive connection that stop() must close
    server.stop()
    with pytest.raises((EndpointConnectionError, ClientError, ConnectionError)):
        batch.describe_job_queues()


def test_python_m_batchfutures_emulator(tmp_path):
    path = [str(REPO), os.environ.get("PYTHONPATH")]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in path if p))
    process = subprocess.Popen(
        [sys.executable, "-m", "batchfutures.emulator", "--port", "0", "--folder", str(tmp_path),
         "--max-vcpus", "2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        url = process.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:"), process.stderr.read() if not url else url
        queues = client("batch", url, NO_RETRIES).describe_job_queues()["jobQueues"]
        assert [q["jobQueueName"] for q in queues] == [QUEUE]
    finally:
        process.terminate()
        out, err = process.communicate(timeout=30)
    assert process.returncode == 0, err
    assert out == ""  # exactly one line: the URL
