"""SQS on the emulator's HTTP endpoint: a stock boto3 SQS client (JSON 1.0, `AmazonSQS.<Op>`)
against EmulatorServer's LocalSQS, the errors as botocore raises them for this
query-compatible service, the long poll against the request deadline, and which SQS
operations may repeat a signature (auth.may_repeat)."""

import http.client
import json
import threading
import time

import boto3
import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials

from batchfutures import sqsapi
from batchfutures.emulator.auth import may_repeat
from batchfutures.emulator.server import EmulatorServer

KEYS = {"access_key_id": "AKIDEMULATORSQS", "secret_access_key": "emulator-sqs-secret"}
NO_RETRIES = Config(retries={"mode": "standard", "max_attempts": 0})
SQS_JSON = "application/x-amz-json-1.0"


class NoBatch:
    """A service with no Batch or Logs operations: only SQS is served."""


@pytest.fixture
def server(tmp_path):
    with EmulatorServer(NoBatch(), sqs_folder=tmp_path / "sqs", request_deadline=0.5,
                        **KEYS) as running:
        yield running


def sqs_client(server):
    return boto3.client("sqs", endpoint_url=server.endpoint_url, region_name="us-east-1",
                        aws_access_key_id=KEYS["access_key_id"],
                        aws_secret_access_key=KEYS["secret_access_key"], config=NO_RETRIES)


def signed_request(server, operation, document, when):
    """One SQS request signed once, at ``when`` (a fixed date: the same signature each time)."""
    body = json.dumps(document).encode()
    headers = {"X-Amz-Target": f"AmazonSQS.{operation}", "Content-Type": SQS_JSON,
               "X-Amz-Date": when}
    request = AWSRequest(method="POST", url=f"http://127.0.0.1:{server.port}/", data=body,
                         headers=headers)
    request.context["timestamp"] = when
    SigV4Auth(Credentials(KEYS["access_key_id"], KEYS["secret_access_key"]), "sqs",
              "us-east-1").add_auth(request)
    return body, dict(request.headers.items())


def send(server, body, headers):
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        connection.request("POST", "/", body=body, headers=headers)
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), json.loads(response.read() or b"{}")
    finally:
        connection.close()


def test_a_stock_boto3_client_runs_a_queue_through_its_life(server):
    sqs = sqs_client(server)
    url = sqs.create_queue(QueueName="bf-warm-run1-work", tags={"batchfutures:run": "run1"},
                           Attributes={"VisibilityTimeout": "30"})["QueueUrl"]
    assert url == f"{server.endpoint_url}/123456789012/bf-warm-run1-work"
    assert sqs.get_queue_url(QueueName="bf-warm-run1-work")["QueueUrl"] == url
    assert sqs.list_queues(QueueNamePrefix="bf-warm")["QueueUrls"] == [url]
    sqs.tag_queue(QueueUrl=url, Tags={"owner": "tests"})
    assert sqs.list_queue_tags(QueueUrl=url)["Tags"] == {"batchfutures:run": "run1",
                                                         "owner": "tests"}

    # a long poll that a send from another client ends
    sender = threading.Timer(0.3, lambda: sqs_client(server).send_message(
        QueueUrl=url, MessageBody="call 1"))
    started = time.monotonic()
    sender.start()
    answer = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=5, VisibilityTimeout=30,
                                 MessageSystemAttributeNames=["ApproximateReceiveCount"])
    sender.join()
    (message,) = answer["Messages"]
    assert message["Body"] == "call 1"
    assert time.monotonic() - started >= 0.3  # the poll waited for the send
    assert message["Attributes"] == {"ApproximateReceiveCount": "1"}

    # in flight: hidden until its visibility is changed to 0, then received again
    assert "Messages" not in sqs.receive_message(QueueUrl=url, WaitTimeSeconds=0)
    sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"],
                                  VisibilityTimeout=0)
    (again,) = sqs.receive_message(QueueUrl=url, AttributeNames=["All"])["Messages"]
    assert again["MessageId"] == message["MessageId"]
    assert again["Attributes"]["ApproximateReceiveCount"] == "2"

    sqs.delete_message(QueueUrl=url, ReceiptHandle=again["ReceiptHandle"])
    assert "Messages" not in sqs.receive_message(QueueUrl=url, WaitTimeSeconds=0)
    with pytest.raises(sqs.exceptions.MessageNotInflight):
        sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=again["ReceiptHandle"],
                                      VisibilityTimeout=5)

    sqs.delete_queue(QueueUrl=url)
    assert "QueueUrls" not in sqs.list_queues(QueueNamePrefix="bf-warm")


@pytest.mark.parametrize("call", [
    lambda sqs, url: sqs.get_queue_url(QueueName="never-made"),
    lambda sqs, url: sqs.send_message(QueueUrl=url, MessageBody="x"),
    lambda sqs, url: sqs.receive_message(QueueUrl=url, WaitTimeSeconds=1),
    lambda sqs, url: sqs.delete_queue(QueueUrl=url),
])
def test_a_missing_queue_is_queue_does_not_exist_as_botocore_raises_it(server, call):
    sqs = sqs_client(server)
    url = sqs.create_queue(QueueName="gone")["QueueUrl"]
    # deleted behind the endpoint: the same DeleteQueue again over HTTP in this second would be
    # a replayed change (429), which test_a_repeated_receive_... covers
    server.sqs.delete_queue(QueueUrl=url)
    with pytest.raises(sqs.exceptions.QueueDoesNotExist) as raised:
        call(sqs, url)
    error = raised.value.response["Error"]
    assert error["Code"] == "AWS.SimpleQueueService.NonExistentQueue"
    assert error["QueryErrorCode"] == "QueueDoesNotExist" and error["Type"] == "Sender"
    assert raised.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
    assert sqsapi.is_queue_gone(raised.value)


def test_the_error_is_on_the_wire_as_sqs_sends_it(server):
    when = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    status, headers, body = send(server, *signed_request(
        server, "GetQueueUrl", {"QueueName": "absent"}, when))
    assert status == 400
    assert headers["x-amzn-query-error"] == "AWS.SimpleQueueService.NonExistentQueue;Sender"
    assert body["__type"] == "com.amazonaws.sqs#QueueDoesNotExist"
    assert headers["Content-Type"] == SQS_JSON


def test_an_unmodeled_code_keeps_its_own_name(server):
    sqs = sqs_client(server)
    url = sqs.create_queue(QueueName="limits")["QueueUrl"]
    with pytest.raises(sqs.exceptions.ClientError) as raised:
        sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=11)
    assert raised.value.response["Error"]["Code"] == "InvalidParameterValue"


def test_a_long_poll_outlasts_the_request_deadline(server):
    """The deadline (0.5 s here) bounds reading the request; the 2 s poll runs after it."""
    sqs = sqs_client(server)
    url = sqs.create_queue(QueueName="quiet")["QueueUrl"]
    started = time.monotonic()
    assert "Messages" not in sqs.receive_message(QueueUrl=url, WaitTimeSeconds=2)
    # an empty answer, not a closed connection, after the whole wait: the deadline never cut it
    assert time.monotonic() - started >= 2 > server.request_deadline


@pytest.mark.parametrize("operation, repeats", [
    ("ReceiveMessage", True),  # polled in a loop: two equal receives in one second
    ("GetQueueUrl", True),
    ("GetQueueAttributes", True),
    ("ListQueues", True),
    ("ListQueueTags", True),
    ("SendMessage", False),
    ("SendMessageBatch", False),
    ("DeleteMessage", False),
    ("DeleteMessageBatch", False),
    ("ChangeMessageVisibility", False),
    ("CreateQueue", False),
    ("DeleteQueue", False),
    ("TagQueue", False),
    ("SubmitJob", False),
    ("DescribeJobs", True),
])
def test_which_operations_may_repeat_a_signature(operation, repeats):
    assert may_repeat(operation) is repeats


def test_a_repeated_receive_is_served_and_a_repeated_send_is_refused(server):
    sqs = sqs_client(server)
    url = sqs.create_queue(QueueName="replays")["QueueUrl"]
    when = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    send_request = signed_request(server, "SendMessage", {"QueueUrl": url, "MessageBody": "m"},
                                  when)
    assert send(server, *send_request)[0] == 200
    status, headers, body = send(server, *send_request)
    assert status == 429 and body["__type"] == "TooManyRequestsException"
    receive_request = signed_request(server, "ReceiveMessage",
                                     {"QueueUrl": url, "VisibilityTimeout": 0}, when)
    first = send(server, *receive_request)
    second = send(server, *receive_request)
    assert first[0] == second[0] == 200
    # the one message sent (the replayed send ran nothing), visible again each time
    assert [m["Body"] for m in first[2]["Messages"]] == ["m"]
    assert [m["Body"] for m in second[2]["Messages"]] == ["m"]
