"""Warm workers on the AWS path: stock boto3 against the emulator's Batch endpoint, S3 and SQS on
moto's server (issue 31). The pool's queues are moto's; the workers (jobs of the emulator behind
its endpoint) reach the same queues and bucket through boto3 and s3fs."""

import boto3
import pytest
from s3server import emulator_endpoint, emulator_environment, new_bucket

from batchfutures import BatchExecutor

pytestmark = pytest.mark.slow


def square(x):
    print("square", x)
    return x * x


def fails(x):
    raise KeyError(x)


@pytest.fixture(scope="module")
def aws(tmp_path_factory, s3_endpoint):
    with emulator_endpoint(tmp_path_factory.mktemp("aws-warm"), max_vcpus=2) as emulator:
        yield emulator


def test_warm_workers_on_the_aws_path(aws, s3_endpoint):
    bucket = new_bucket()
    sqs = boto3.client("sqs", region_name="us-east-1")
    before = set(sqs.list_queues().get("QueueUrls", []))
    with BatchExecutor(emulator_environment(bucket), keepalive=30, max_workers=2,
                       echo_output=False) as ex:
        assert list(ex.map(square, range(12))) == [x * x for x in range(12)]
        future = ex.submit(square, 5)
        assert future.result(timeout=120) == 25
        assert future.log() == "square 5\n"
        with pytest.raises(KeyError):
            ex.submit(fails, 1).result(timeout=120)
        pool = next(iter(ex._session.warm_pools.values()))
        made = set(sqs.list_queues().get("QueueUrls", [])) - before
        assert {pool.queue, pool.completions} <= made  # moto's queues, not a folder's
        tags = sqs.list_queue_tags(QueueUrl=pool.queue)["Tags"]
        assert tags["batchfutures:run"] == ex._session.run_id
        assert pool.requests["batch:SubmitJob"] == len(pool.workers) <= 2
    left = set(sqs.list_queues().get("QueueUrls", []))
    assert not {pool.queue, pool.completions} & left  # deleted at shutdown
