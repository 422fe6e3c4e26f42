"""A warm pool shut down while a worker holds a call: its queues are gone before the worker
sends the call's completion or deletes its message. That is the pool's end, not the worker's
failure: the worker job ends SUCCEEDED, with no traceback in its log."""

import os
import signal
import time

import boto3
import pytest
from botocore.exceptions import ClientError

from batchfutures import BatchExecutor, jobdetail, warmpool
from batchfutures.emulator.sqs import LocalSQS
from batchfutures.logs import lines_after, log_group_of
from batchfutures.sqsapi import is_queue_gone


def _error(code):
    return ClientError({"Error": {"Code": code, "Message": "m"}}, "DeleteMessage")


def _moto_queue_gone(endpoint):
    client = boto3.client("sqs", endpoint_url=endpoint, region_name="us-east-1",
                          aws_access_key_id="testing", aws_secret_access_key="testing")
    url = client.create_queue(QueueName="gone-soon")["QueueUrl"]
    client.delete_queue(QueueUrl=url)
    try:
        client.delete_message(QueueUrl=url, ReceiptHandle="x")
    except ClientError as error:
        return error
    pytest.fail("moto deleted a message of a deleted queue")


def _local_queue_gone(folder):
    sqs = LocalSQS(folder)
    url = sqs.create_queue(QueueName="gone-soon")["QueueUrl"]
    sqs.delete_queue(QueueUrl=url)
    try:
        sqs.send_message(QueueUrl=url, MessageBody="late")
    except ClientError as error:
        return error
    pytest.fail("LocalSQS sent to a deleted queue")


@pytest.mark.parametrize("make, gone", [
    (lambda moto, tmp: _moto_queue_gone(moto), True),       # moto's server, as boto3 shows it
    (lambda moto, tmp: _local_queue_gone(tmp / "sqs"), True),  # the emulator's LocalSQS
    (lambda moto, tmp: _error("AWS.SimpleQueueService.NonExistentQueue"), True),
    (lambda moto, tmp: _error("QueueDoesNotExist"), True),
    (lambda moto, tmp: _error("ReceiptHandleIsInvalid"), False),
    (lambda moto, tmp: _error("AccessDenied"), False),
    (lambda moto, tmp: ClientError({}, "DeleteMessage"), False),  # no code at all
    (lambda moto, tmp: OSError("QueueDoesNotExist"), False),  # the words, not SQS's answer
])
def test_which_errors_say_the_queue_is_gone(moto_server, tmp_path, make, gone):
    assert is_queue_gone(make(moto_server, tmp_path)) is gone


# -- end to end: the race made to happen ------------------------------------------------------
def _waits_for(started, flag, kill):
    open(started, "w").close()
    deadline = time.time() + 120
    while not os.path.exists(flag) and time.time() < deadline:
        time.sleep(0.02)
    if kill:  # the runner dies in the call: the supervisor fails the call (no retry after it)
        os.kill(os.getpid(), signal.SIGKILL)
    return "finished"


def _until(predicate, seconds=120):
    deadline = time.monotonic() + seconds
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.05)
    return predicate()


@pytest.mark.slow
@pytest.mark.parametrize("deleted, kill, latency", [
    ("work", False, 0),  # the completion sent, then DeleteMessage refused (the race seen)
    ("both", False, 0),  # the completion refused
    ("both", True, 0),  # the runner died: the supervisor's failure of the call refused
    # SQS's round trips (as on AWS): the call's tail is sent by the runner's tail threads
    ("work", False, 0.001),
])
def test_queues_deleted_while_a_worker_holds_a_call(local_env, tmp_path, monkeypatch, deleted,
                                                     kill, latency):
    if latency:
        monkeypatch.setitem(warmpool.INJECTED_LATENCY, "sqs", latency)
    started, flag = tmp_path / "started", tmp_path / "go"
    ex = BatchExecutor(local_env, keepalive=60, max_workers=1, echo_output=False)
    try:
        future = ex.submit(_waits_for, str(started), str(flag), kill)
        assert _until(started.exists)
        pool = next(iter(ex._session.warm_pools.values()))
        queues = [pool.queue] + ([pool.completions] if deleted == "both" else [])
        for url in queues:
            pool.sqs.delete_queue(QueueUrl=url)
        flag.write_text("go")
        (worker,) = pool.workers

        def described():
            return local_env.batch.describe_jobs(jobs=[worker])["jobs"][0]

        assert _until(lambda: described()["status"] in ("SUCCEEDED", "FAILED"))
        if deleted == "work":  # its completion was sent before the queue went: it resolves
            assert future.result(timeout=60) == "finished"
    finally:
        ex.terminate_workers()
    description = described()
    log = "\n".join(lines_after(local_env.logs, log_group_of(description, local_env.log_group),
                                jobdetail.log_stream(description)))
    assert description["status"] == "SUCCEEDED", log
    assert "Traceback" not in log and "ERROR" not in log, log
