"""The AWS CLI (v1, its own botocore) against the SQS the emulator's endpoint serves: a queue
made, one message sent and received, the queue deleted, and a missing queue's error as the CLI
reports it. Configured by the environment (the endpoint's pair, AWS_ENDPOINT_URL_SQS) and
`--endpoint-url`: CLI v1 replaces an SQS endpoint it was not given on the command line by
`https://queue.amazonaws.com` in us-east-1 (awscli/customizations/overridesslcommonname.py), so
AWS_ENDPOINT_URL_SQS alone reaches AWS, not the emulator (CLI v2 and boto3 honour it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # an emulator process and CLI processes


@pytest.fixture(scope="module")
def aws_sqs(endpoint):
    """`aws_sqs("send-message", ...)`: (exit status, parsed JSON output or None, stderr)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_ENDPOINT_URL_SQS=endpoint.url, AWS_ACCESS_KEY_ID=endpoint.access_key_id,
               AWS_SECRET_ACCESS_KEY=endpoint.secret_access_key, AWS_DEFAULT_REGION="us-east-1",
               AWS_CONFIG_FILE=os.devnull, AWS_SHARED_CREDENTIALS_FILE=os.devnull,
               AWS_EC2_METADATA_DISABLED="true", NO_PROXY="127.0.0.1", no_proxy="127.0.0.1")

    def run(*args):
        done = subprocess.run([sys.executable, "-m", "awscli", "sqs", *args, "--output", "json",
                               "--endpoint-url", endpoint.url],
                              capture_output=True, text=True, timeout=120, env=env)
        output = json.loads(done.stdout) if done.stdout.strip() else None
        return done.returncode, output, done.stderr

    return run


def test_the_cli_sends_and_receives_one_message(aws_sqs, endpoint):
    status, created, err = aws_sqs("create-queue", "--queue-name", "cli-queue")
    assert status == 0, err
    url = created["QueueUrl"]
    assert url == f"{endpoint.url}/123456789012/cli-queue"
    status, sent, err = aws_sqs("send-message", "--queue-url", url, "--message-body", "from the cli")
    assert status == 0, err
    status, received, err = aws_sqs("receive-message", "--queue-url", url,
                                    "--wait-time-seconds", "2", "--attribute-names", "All")
    assert status == 0, err
    (message,) = received["Messages"]
    assert message["Body"] == "from the cli" and message["MessageId"] == sent["MessageId"]
    assert message["Attributes"]["ApproximateReceiveCount"] == "1"
    status, _, err = aws_sqs("delete-message", "--queue-url", url,
                             "--receipt-handle", message["ReceiptHandle"])
    assert status == 0, err
    status, _, err = aws_sqs("delete-queue", "--queue-url", url)
    assert status == 0, err


def test_the_cli_reports_a_missing_queue(aws_sqs):
    status, _, err = aws_sqs("get-queue-url", "--queue-name", "never-made")
    assert status != 0 and "AWS.SimpleQueueService.NonExistentQueue" in err, err
