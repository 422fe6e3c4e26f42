"""The emulator over HTTP, driven by stock boto3 clients (batch, logs) on 127.0.0.1.

First the protocol against a stub service that records its calls (routing, parameters, error
encoding, retries, logs, 404/500), then the real `BatchEmulator` end to end, then
`python -m batchfutures.emulator` in a subprocess.
"""

import copy
import datetime
import decimal
import http.client
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import boto3
import botocore.retries.standard
import botocore.retryhandler
import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials
from botocore.exceptions import ClientError, EndpointConnectionError, ParamValidationError
from model_check import Checked, check_output

from batchfutures.emulator import BatchEmulator
from batchfutures.emulator.server import EmulatorServer

QUEUE, DEFINITION, GROUP = "batchfutures", "batchfutures-worker", "/aws/batch/job"
REPO = Path(__file__).resolve().parents[2]
NO_RETRIES = Config(retries={"mode": "standard", "max_attempts": 0})
LOGS_JSON = "application/x-amz-json-1.1"
# every server here serves requests signed with this pair (test_server_auth.py: nothing else)
KEYS = {"access_key_id": "AKIDEMULATORTEST", "secret_access_key": "emulator-test-secret"}


def client(name, endpoint_url, config=NO_RETRIES):
    return boto3.client(name, endpoint_url=endpoint_url, region_name="us-east-1",
                        aws_access_key_id=KEYS["access_key_id"],
                        aws_secret_access_key=KEYS["secret_access_key"], config=config)


def client_error(code, message, status=None):
    response = {"Error": {"Code": code, "Message": message}}
    if status is not None:
        response["ResponseMetadata"] = {"HTTPStatusCode": status}
    return ClientError(response, "Stubbed")


def raw_request(server, method, path, body=b"", headers=None):
    """A request made by hand, SigV4-signed with KEYS as botocore signs (JSON when it has a body)."""
    headers = dict(headers or {})
    if body:
        headers.setdefault("Content-Type", "application/json")
    body = body.encode() if isinstance(body, str) else body
    request = AWSRequest(method=method, url=f"http://127.0.0.1:{server.port}{path}", data=body,
                         headers=headers)
    service = "logs" if "X-Amz-Target" in headers else "batch"
    SigV4Auth(Credentials(KEYS["access_key_id"], KEYS["secret_access_key"]), service,
              "us-east-1").add_auth(request)
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        connection.request(method, path, body=body, headers=dict(request.headers.items()))
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), json.loads(response.read() or b"{}")
    finally:
        connection.close()


def logs_request(server, operation, document):
    return raw_request(server, "POST", "/", json.dumps(document),
                       {"X-Amz-Target": f"Logs_20140328.{operation}", "Content-Type": LOGS_JSON})


@pytest.fixture
def no_backoff(monkeypatch):
    """botocore's retry decisions as they are, without their sleeps (patch before making clients)."""
    monkeypatch.setattr(botocore.retries.standard.ExponentialBackoff, "delay_amount",
                        lambda self, context: 0)
    monkeypatch.setattr(botocore.retryhandler, "delay_exponential",
                        lambda base, growth_factor, attempts: 0)


# -- the protocol, against a stub service -----------------------------------------------------
JOB = {"jobArn": "arn:aws:batch:us-east-1:000000000000:job/id-1", "jobName": "j", "jobId": "id-1",
       "jobQueue": "arn:aws:batch:us-east-1:000000000000:job-queue/q", "status": "SUCCEEDED",
       "createdAt": 1700000000000, "startedAt": 1700000001000, "stoppedAt": 1700000002000,
       "jobDefinition": "arn:aws:batch:us-east-1:000000000000:job-definition/d:1",
       "attempts": [{"container": {"exitCode": 0, "logStreamName": "d/default/id-1"},
                     "startedAt": 1700000001000, "stoppedAt": 1700000002000, "statusReason": "ok"}],
       "arrayProperties": {"statusSummary": {"SUCCEEDED": 2}, "size": 2}}
RESPONSES = {
    "submit_job": {"jobArn": JOB["jobArn"], "jobName": "j", "jobId": "id-1"},
    "describe_jobs": {"jobs": [JOB]},
    "list_jobs": {"jobSummaryList": [{"jobId": "id-1", "jobName": "j", "status": "SUCCEEDED",
                                      "createdAt": 1700000000000}], "nextToken": "page-2"},
    "cancel_job": {},
    "terminate_job": {},
    "describe_job_queues": {"jobQueues": [{
        "jobQueueName": "q", "jobQueueArn": JOB["jobQueue"], "state": "ENABLED", "status": "VALID",
        "priority": 1, "computeEnvironmentOrder": [{"order": 1, "computeEnvironment": "ce"}]}]},
    "update_job_queue": {"jobQueueName": "q", "jobQueueArn": JOB["jobQueue"]},
    "register_job_definition": {"jobDefinitionName": "d", "jobDefinitionArn": JOB["jobDefinition"],
                                "revision": 1},
    "describe_job_definitions": {"jobDefinitions": [{
        "jobDefinitionName": "d", "jobDefinitionArn": JOB["jobDefinition"], "revision": 1,
        "type": "container", "status": "ACTIVE",
        "containerProperties": {"command": ["python"], "resourceRequirements": [
            {"type": "VCPU", "value": "1"}, {"type": "MEMORY", "value": "2048"}]}}]},
    "list_tags_for_resource": {"tags": {"team": "x"}},
    "tag_resource": {},
    "untag_resource": {},
}
ARN = "arn:aws:batch:us-east-1:000000000000:job-queue/my queue"  # ':' '/' ' ' in a URI label
REQUESTS = [  # (operation, request members): every operation the stub implements
    ("submit_job", {"jobName": "j", "jobQueue": "q", "jobDefinition": "d",
                    "arrayProperties": {"size": 3}, "parameters": {"a": "b"},
                    "containerOverrides": {"command": ["python", "-c", "print('hi')"],
                                           "environment": [{"name": "X", "value": "1"}]},
                    "retryStrategy": {"attempts": 2, "evaluateOnExit": [
                        {"onExitCode": "137", "action": "RETRY"}]},
                    "timeout": {"attemptDurationSeconds": 60}, "tags": {"k": "v"}}),
    ("describe_jobs", {"jobs": ["id-1", "id-2:0"]}),
    ("list_jobs", {"arrayJobId": "id-1", "jobStatus": "SUCCEEDED", "maxResults": 2,
                   "nextToken": "page-1"}),
    ("cancel_job", {"jobId": "id-1", "reason": "because"}),
    ("terminate_job", {"jobId": "id-1", "reason": "because"}),
    ("describe_job_queues", {"jobQueues": ["q"]}),
    ("update_job_queue", {"jobQueue": "q", "state": "DISABLED"}),
    ("register_job_definition", {"jobDefinitionName": "d", "type": "container",
                                 "containerProperties": {"image": "python:3.11", "command": ["x"]}}),
    ("describe_job_definitions", {"jobDefinitionName": "d", "status": "ACTIVE"}),
    ("list_tags_for_resource", {"resourceArn": ARN}),
    ("tag_resource", {"resourceArn": ARN, "tags": {"team": "x"}}),
    ("untag_resource", {"resourceArn": ARN, "tagKeys": ["team", "other key"]}),
]


class StubLogs:
    def __init__(self):
        self.calls = []

    def get_log_events(self, **params):
        self.calls.append(("get_log_events", params))
        stream = params["logStreamName"]
        if stream == "missing":
            raise client_error("ResourceNotFoundException", "The specified log stream does not exist.")
        if stream == "invalid":
            raise ParamValidationError(report="logStreamName is not a stream")
        start = datetime.datetime(2023, 11, 14, 22, 13, 20, tzinfo=datetime.timezone.utc)
        return {"events": [  # a datetime, a Decimal and a float where the model has longs
            {"timestamp": start, "message": "hi", "ingestionTime": decimal.Decimal(1700000000500)},
            {"timestamp": 1700000001000.0, "message": "there", "ingestionTime": 1700000001500}],
            "nextForwardToken": "f/2", "nextBackwardToken": "b/0"}


class Stub:
    """Records every call; answers from RESPONSES; `throttle` calls first get a 429."""

    def __init__(self):
        self.calls = []
        self.throttle = 0
        self.failure = None
        self.logs = StubLogs()
        self._lock = threading.Lock()


def _stub_operation(name):
    def operation(self, **params):
        with self._lock:
            self.calls.append((name, params))
            throttled = self.throttle > 0
            self.throttle -= throttled
        if throttled:
            raise client_error("TooManyRequestsException", "Rate exceeded", 429)
        if self.failure is not None:
            raise self.failure
        return copy.deepcopy(RESPONSES[name])

    operation.__name__ = name
    return operation


for _name in RESPONSES:
    setattr(Stub, _name, _stub_operation(_name))


@pytest.fixture
def stub():
    return Stub()


@pytest.fixture
def stub_server(stub):
    with EmulatorServer(stub, **KEYS) as server:
        yield server


@pytest.mark.parametrize("operation", sorted(RESPONSES))
def test_the_stub_answers_fit_the_model(operation):
    check_output("batch", "".join(p.capitalize() for p in operation.split("_")), RESPONSES[operation])


def test_every_operation_is_routed_with_its_members_as_keyword_arguments(stub, stub_server):
    batch = client("batch", stub_server.endpoint_url)
    for operation, params in REQUESTS:
        answer = getattr(batch, operation)(**copy.deepcopy(params))
        assert stub.calls[-1] == (operation, params)
        assert answer["ResponseMetadata"]["HTTPStatusCode"] == 200
        assert answer["ResponseMetadata"]["RequestId"]
        answer.pop("ResponseMetadata")
        assert answer == RESPONSES[operation]
    assert [call[0] for call in stub.calls] == [operation for operation, _ in REQUESTS]


def test_the_paginator_follows_next_token(stub, stub_server):
    page_2 = {"jobSummaryList": [{"jobId": "id-2", "jobName": "j", "status": "SUCCEEDED"}]}
    original = Stub.list_jobs

    def list_jobs(self, **params):
        answer = original(self, **params)
        return answer if "nextToken" not in params else page_2

    stub.list_jobs = list_jobs.__get__(stub)
    pages = client("batch", stub_server.endpoint_url).get_paginator("list_jobs").paginate(jobQueue="q")
    assert [s["jobId"] for page in pages for s in page["jobSummaryList"]] == ["id-1", "id-2"]
    assert stub.calls == [("list_jobs", {"jobQueue": "q"}),
                          ("list_jobs", {"jobQueue": "q", "nextToken": "page-2"})]


@pytest.mark.parametrize("failure, code, status", [
    (client_error("ClientException", "no such queue", 400), "ClientException", 400),
    (client_error("ServerException", "it broke", 500), "ServerException", 500),
    (client_error("ClientException", "no status given"), "ClientException", 400),
    (client_error("ServerException", "no status given"), "ServerException", 500),
    (client_error("TooManyRequestsException", "no status given"), "TooManyRequestsException", 429),
    (client_error("SomeOtherException", "a code the model lacks", 409), "SomeOtherException", 409),
    (ParamValidationError(report="Invalid length for parameter jobName"), "ClientException", 400),
])
def test_service_errors_reach_boto3_with_their_code_message_and_status(
        stub, stub_server, failure, code, status):
    stub.failure = failure
    with pytest.raises(ClientError) as raised:
        client("batch", stub_server.endpoint_url).describe_jobs(jobs=["id-1"])
    response = raised.value.response
    assert response["Error"]["Code"] == code
    assert response["ResponseMetadata"]["HTTPStatusCode"] == status
    expected = failure.response["Error"]["Message"] if isinstance(failure, ClientError) else \
        "Invalid length for parameter jobName"
    assert expected in response["Error"]["Message"]
    if code == "ClientException":  # the modeled exception class of the batch client
        assert isinstance(raised.value, client("batch", stub_server.endpoint_url).exceptions.ClientException)


def test_rest_json_errors_are_a_status_an_error_type_header_and_a_message(stub, stub_server):
    stub.failure = client_error("ClientException", "no such queue", 400)
    status, headers, body = raw_request(stub_server, "POST", "/v1/describejobs",
                                        json.dumps({"jobs": ["id-1"]}))
    assert (status, headers["x-amzn-ErrorType"]) == (400, "ClientException")
    assert body == {"message": "no such queue"}
    assert headers["Content-Type"] == "application/json"
    # a request botocore would have refused (a required member missing) is refused here too
    status, headers, body = raw_request(stub_server, "POST", "/v1/submitjob", json.dumps({"jobQueue": "q"}))
    assert status == 400 and headers["x-amzn-ErrorType"] == "ClientException"
    assert "jobName" in body["message"]
    status, headers, body = raw_request(stub_server, "POST", "/v1/submitjob", b"{not json")
    assert status == 400 and headers["x-amzn-ErrorType"] == "SerializationException"


@pytest.mark.parametrize("mode", ["standard", "legacy"])
def test_429_is_answered_by_botocore_retries(stub, stub_server, no_backoff, mode):
    stub.throttle = 3
    batch = client("batch", stub_server.endpoint_url, Config(retries={"mode": mode, "max_attempts": 5}))
    answer = batch.describe_job_queues(jobQueues=["q"])
    assert answer["jobQueues"] == RESPONSES["describe_job_queues"]["jobQueues"]
    assert answer["ResponseMetadata"]["RetryAttempts"] == 3
    assert stub.calls == [("describe_job_queues", {"jobQueues": ["q"]})] * 4


def test_429_past_the_retries_is_too_many_requests(stub, stub_server, no_backoff):
    stub.throttle = 10
    batch = client("batch", stub_server.endpoint_url, Config(retries={"mode": "standard", "max_attempts": 2}))
    with pytest.raises(ClientError) as raised:
        batch.describe_jobs(jobs=["id-1"])
    response = raised.value.response
    assert response["Error"]["Code"] == "TooManyRequestsException"
    assert response["ResponseMetadata"]["HTTPStatusCode"] == 429
    assert response["ResponseMetadata"]["RetryAttempts"] == 2
    assert len(stub.calls) == 3


def test_get_log_events_through_a_stock_logs_client(stub, stub_server):
    logs = client("logs", stub_server.endpoint_url)
    page = logs.get_log_events(logGroupName=GROUP, logStreamName="d/default/id-1", startFromHead=True,
                               nextToken="f/0", limit=10)
    assert stub.logs.calls == [("get_log_events", {
        "logGroupName": GROUP, "logStreamName": "d/default/id-1", "startFromHead": True,
        "nextToken": "f/0", "limit": 10})]
    assert page["events"] == [
        {"timestamp": 1700000000000, "message": "hi", "ingestionTime": 1700000000500},
        {"timestamp": 1700000001000, "message": "there", "ingestionTime": 1700000001500}]
    assert all(type(e[k]) is int for e in page["events"] for k in ("timestamp", "ingestionTime"))
    assert (page["nextForwardToken"], page["nextBackwardToken"]) == ("f/2", "b/0")
    for stream, code in (("missing", "ResourceNotFoundException"), ("invalid", "InvalidParameterException")):
        with pytest.raises(ClientError) as raised:
            logs.get_log_events(logGroupName=GROUP, logStreamName=stream)
        assert raised.value.response["Error"]["Code"] == code
        assert raised.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400


def test_json_errors_are_a_status_and_a_type(stub_server):
    status, headers, body = logs_request(stub_server, "GetLogEvents",
                                         {"logGroupName": GROUP, "logStreamName": "missing"})
    assert status == 400 and headers["Content-Type"] == LOGS_JSON
    assert body == {"__type": "ResourceNotFoundException",
                    "message": "The specified log stream does not exist."}
    status, _, body = logs_request(stub_server, "GetLogEvents", {"logGroupName": GROUP})
    assert status == 400 and body["__type"] == "InvalidParameterException"
    assert "logStreamName" in body["message"]


def test_unknown_routes_and_unimplemented_operations_are_404(stub_server):
    status, headers, body = raw_request(stub_server, "POST", "/v1/nosuchoperation", b"{}")
    assert status == 404 and headers["x-amzn-ErrorType"] == "UnknownOperationException"
    assert "/v1/nosuchoperation" in body["message"]
    status, _, _ = raw_request(stub_server, "GET", "/v1/submitjob")  # the right path, the wrong method
    assert status == 404
    status, _, body = logs_request(stub_server, "NoSuchOperation", {})
    assert status == 404 and body["__type"] == "UnknownOperationException"
    status, _, body = logs_request(stub_server, "DescribeLogGroups", {})  # in the model, not the stub
    assert status == 404 and body["__type"] == "UnknownOperationException"
    with pytest.raises(ClientError) as raised:
        client("batch", stub_server.endpoint_url).create_compute_environment(
            computeEnvironmentName="ce", type="MANAGED")
    assert raised.value.response["Error"]["Code"] == "UnknownOperationException"
    assert raised.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404


class Narrow:
    """A service without `logs`, whose one method takes fewer members than the model has."""

    def list_jobs(self, jobQueue):
        return {"jobSummaryList": []}

    def _private(self, **params):  # never reachable
        raise AssertionError("called")


def test_members_a_method_does_not_take_are_a_client_exception(caplog):
    with EmulatorServer(Narrow(), **KEYS) as server:
        batch = client("batch", server.endpoint_url)
        assert batch.list_jobs(jobQueue="q")["jobSummaryList"] == []
        with caplog.at_level(logging.ERROR, logger="batchfutures"):
            with pytest.raises(ClientError) as raised:
                batch.list_jobs(jobQueue="q", jobStatus="RUNNING")
        assert raised.value.response["Error"]["Code"] == "ClientException"
        assert raised.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
        assert "jobStatus" in raised.value.response["Error"]["Message"]
        assert not caplog.records  # the caller's mistake, not a server bug
        with pytest.raises(ClientError) as raised:
            client("logs", server.endpoint_url).get_log_events(logGroupName=GROUP, logStreamName="s")
        assert raised.value.response["Error"]["Code"] == "UnknownOperationException"


class Broken:
    def describe_job_queues(self, **params):
        raise RuntimeError("broken on purpose")

    def describe_jobs(self, **params):
        return {"jobs": []}


def test_an_unexpected_exception_is_a_logged_500_and_the_server_goes_on(caplog):
    with EmulatorServer(Broken(), **KEYS) as server:
        batch = client("batch", server.endpoint_url)
        with caplog.at_level(logging.ERROR, logger="batchfutures"):
            with pytest.raises(ClientError) as raised:
                batch.describe_job_queues()
        assert raised.value.response["Error"]["Code"] == "ServerException"
        assert raised.value.response["ResponseMetadata"]["HTTPStatusCode"] == 500
        assert any("broken on purpose" in (r.exc_text or "") for r in caplog.records)
        assert batch.describe_jobs(jobs=["a"])["jobs"] == []


def test_concurrent_calls_over_one_client(stub, stub_server):
    batch = client("batch", stub_server.endpoint_url)
    errors = []

    def work(i):
        try:
            for j in range(5):
                assert batch.describe_jobs(jobs=[f"{i}-{j}"])["jobs"][0]["jobId"] == "id-1"
        except Exception as error:  # pragma: no cover - reported below
            errors.append(error)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert sorted(call[1]["jobs"][0] for call in stub.calls) == sorted(
        f"{i}-{j}" for i in range(8) for j in range(5))


def test_lifecycle_start_stop_restart_and_context_manager(stub):
    server = EmulatorServer(stub, **KEYS)
    with pytest.raises(RuntimeError):
        print(server.endpoint_url)
    assert server.start() is server and server.start() is server  # starting twice is harmless
    assert server.endpoint_url == f"http://127.0.0.1:{server.port}"
    batch = client("batch", server.endpoint_url, Config(retries={"mode": "standard", "max_attempts": 0},
                                                        connect_timeout=2))
    batch.describe_job_queues()  # a kept-alive connection that stop() must close
    server.stop()
    server.stop()  # stopping twice is harmless
    assert not server.running
    with pytest.raises((EndpointConnectionError, ClientError, ConnectionError)):
        batch.describe_job_queues()
    with server:  # the same object serves again (on the same port if it is free)
        assert server.running
        assert client("batch", server.endpoint_url).describe_job_queues()["jobQueues"]
    assert not server.running


# -- the real emulator, end to end ---------------------------------------------------------------
@pytest.fixture(scope="module")
def emulator(tmp_path_factory):
    service = BatchEmulator(tmp_path_factory.mktemp("emulator"), max_vcpus=2)
    yield service
    service.close()


@pytest.fixture(scope="module")
def server(emulator):
    with EmulatorServer(Checked(emulator), **KEYS) as running:  # every answer checked against the model
        yield running


@pytest.fixture
def batch(server):
    return client("batch", server.endpoint_url)


@pytest.fixture
def no_faults(emulator):
    yield emulator
    emulator.inject_faults(0)


def submit(batch, command, **extra):
    return batch.submit_job(jobName="server-test", jobQueue=QUEUE, jobDefinition=DEFINITION,
                            containerOverrides={"command": command}, **extra)["jobId"]


def wait_for(batch, job_id, statuses, limit=60.0):
    deadline = time.monotonic() + limit
    while True:
        job = batch.describe_jobs(jobs=[job_id])["jobs"][0]
        if job["status"] in statuses:
            return job
        if time.monotonic() > deadline:
            raise AssertionError(f"job {job_id} still {job['status']} after {limit:.0f} s")
        time.sleep(0.02)


@pytest.mark.slow
def test_job_runs_and_its_log_reads_through_the_logs_client(server, batch):
    job_id = submit(batch, ["python", "-c", "print('hi')"])
    job = wait_for(batch, job_id, ("SUCCEEDED", "FAILED"))
    assert job["status"] == "SUCCEEDED"
    assert job["attempts"][-1]["container"]["exitCode"] == 0
    logs = client("logs", server.endpoint_url)
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


@pytest.mark.slow
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


def test_validation_error_is_a_client_exception_with_http_400(batch):
    with pytest.raises(ClientError) as error:
        submit(batch, ["python", "-c", "pass"], arrayProperties={"size": 1})
    assert error.value.response["Error"]["Code"] == "ClientException"
    assert error.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
    with pytest.raises(ClientError) as error:
        batch.submit_job(jobName="j", jobQueue="no-such-queue", jobDefinition=DEFINITION)
    assert error.value.response["Error"]["Code"] == "ClientException"


@pytest.mark.slow
def test_terminate_a_running_job(batch):
    job_id = submit(batch, ["python", "-c", "import time; time.sleep(60)"])
    assert wait_for(batch, job_id, ("RUNNING", "SUCCEEDED", "FAILED"))["status"] == "RUNNING"
    batch.terminate_job(jobId=job_id, reason="stopped by test_server")
    job = wait_for(batch, job_id, ("SUCCEEDED", "FAILED"))
    assert job["status"] == "FAILED"
    assert job["statusReason"] == "stopped by test_server"


def test_injected_throttling_is_answered_by_botocore_retries(server, no_faults, no_backoff):
    emulator = no_faults
    before = emulator.faults.injected
    emulator.inject_faults(0.5, seed=55, operations={"DescribeJobQueues"})
    patient = client("batch", server.endpoint_url, Config(retries={"mode": "standard", "max_attempts": 10}))
    retried = 0
    for _ in range(10):
        answer = patient.describe_job_queues(jobQueues=[QUEUE])
        assert answer["jobQueues"][0]["jobQueueName"] == QUEUE
        retried += answer["ResponseMetadata"]["RetryAttempts"]
    assert retried > 0
    assert retried == emulator.faults.injected - before  # every fault answered by one retry


def test_injected_throttling_past_the_retries_is_too_many_requests(server, no_faults, no_backoff):
    no_faults.inject_faults(1.0, operations={"DescribeJobQueues"})
    impatient = client("batch", server.endpoint_url,
                       Config(retries={"mode": "standard", "total_max_attempts": 2}))
    with pytest.raises(ClientError) as error:
        impatient.describe_job_queues()
    response = error.value.response
    assert response["Error"]["Code"] == "TooManyRequestsException"
    assert response["ResponseMetadata"]["HTTPStatusCode"] == 429
    assert response["ResponseMetadata"]["RetryAttempts"] == 1


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.slow
def test_python_m_batchfutures_emulator(tmp_path):
    port = free_port()
    path = [str(REPO), os.environ.get("PYTHONPATH")]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in path if p))
    process = subprocess.Popen(
        [sys.executable, "-m", "batchfutures.emulator", "--port", str(port), "--folder", str(tmp_path),
         "--max-vcpus", "2", "--metadata-ttl", "600", "--access-key-id", KEYS["access_key_id"]],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=dict(env, BATCHFUTURES_EMULATOR_SECRET_ACCESS_KEY=KEYS["secret_access_key"]))
    try:
        url = process.stdout.readline().strip()
        assert url == f"http://127.0.0.1:{port}", url or process.stderr.read()
        queues = client("batch", url).describe_job_queues()["jobQueues"]
        assert [q["jobQueueName"] for q in queues] == [QUEUE]
    finally:
        process.terminate()
        out, err = process.communicate(timeout=30)
    assert process.returncode == 0, err
    assert out == ""  # exactly one line: the URL
