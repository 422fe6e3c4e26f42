"""No secret in requests, records or logs (issue 13.3), on the AWS path.

A signing key and a planted credential-like value live in the client's process environment;
a job runs with `secrets=` (an ARN) and an ordinary `environment=` value. Neither planted value
may appear in any request body the client sends to Batch or Logs, in the emulator's stored job
records, in any object written to the bucket, or in any log line of client or worker.
"""

import logging
from pathlib import Path

import boto3
import pytest
from s3server import emulator_endpoint

from batchfutures import AWSBatchEnvironment, BatchExecutor

REGION = "us-east-1"
PLANTED = "planted-value-Zx81kq0w-must-never-travel"

pytestmark = pytest.mark.slow


def _shout(x):
    logging.getLogger("batchfutures").warning("worker item %s", x)
    print("item", x)
    return x + 1


@pytest.fixture
def bodies(monkeypatch):
    """The body of every request boto3's Batch, Logs and Secrets Manager clients send."""
    seen = []
    original = boto3.session.Session.client

    def capture(request, **_):
        body = request.body
        seen.append(body if isinstance(body, bytes) else (body or "").encode())

    def client(self, service, *args, **kwargs):
        made = original(self, service, *args, **kwargs)
        made.meta.events.register("before-send", capture)
        return made

    monkeypatch.setattr(boto3.session.Session, "client", client)
    return seen


def test_planted_values_never_leave_the_client(tmp_path, s3_endpoint, bodies, monkeypatch, caplog):
    key_value = "aws-path-tests-" + "k" * 32  # what emulator_endpoint gives the workers
    monkeypatch.setenv("BF_PLANTED_SECRET", PLANTED)
    bucket = "bf-no-leaks"
    boto3.client("s3", region_name=REGION).create_bucket(Bucket=bucket)
    caplog.set_level(logging.DEBUG, logger="batchfutures")
    folder = tmp_path / "emulator"
    with emulator_endpoint(folder, max_vcpus=2):
        env = AWSBatchEnvironment(job_queue="batchfutures", io_bucket=bucket, region_name=REGION,
                                  job_definition="batchfutures-worker")
        with BatchExecutor(env, environment={"BATCHFUTURES_LOG_LEVEL": "DEBUG"}) as ex:
            futures = ex.map_futures(_shout, range(3))
            assert [f.result(timeout=120) for f in futures] == [1, 2, 3]
            logs = "\n".join(f.log() for f in futures)
    assert "worker item 1" in logs  # the worker's log was read, at DEBUG
    assert bodies, "no request was captured"
    for secret in (PLANTED, key_value):
        token = secret.encode()
        assert not [b for b in bodies if token in b], "a request body carries a secret"
        assert secret not in logs
        assert secret not in caplog.text
        for path in Path(folder).rglob("*"):
            if path.is_file():
                assert token not in path.read_bytes(), f"{path} holds a secret"
        s3 = boto3.client("s3", region_name=REGION)
        for item in s3.list_objects_v2(Bucket=bucket).get("Contents", []):
            data = s3.get_object(Bucket=bucket, Key=item["Key"])["Body"].read()
            assert token not in data, f"s3://{bucket}/{item['Key']} holds a secret"
