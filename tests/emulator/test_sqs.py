"""The emulator's SQS (emulator/sqs.py): SQS's API shape over a folder, shared across processes."""

import multiprocessing
import os
import stat
import threading
import time
import uuid

import pytest
from botocore.exceptions import ClientError, ParamValidationError
from s3server import aws_env  # noqa: F401  (a fixture)

from batchfutures.emulator import sqs as sqs_module
from batchfutures.emulator.sqs import QUEUE_GONE, LocalSQS, wait_steps
from batchfutures.sqsapi import is_queue_gone


@pytest.fixture
def sqs(tmp_path):
    return LocalSQS(tmp_path / "sqs")


@pytest.fixture
def queue(sqs):
    return sqs.create_queue(QueueName="q-1", Attributes={"VisibilityTimeout": "30"})["QueueUrl"]


def code_of(error):
    return error.value.response["Error"]["Code"]


@pytest.mark.parametrize("waited, step", [
    (0.0, 0.001), (0.05, 0.001), (0.1, 0.003), (0.5, 0.011), (10.0, 0.02), (1000.0, 0.02)])
def test_long_polling_looks_often_at_first_then_backs_off(waited, step):
    assert wait_steps(waited) == pytest.approx(step)


def test_a_message_is_received_deleted_and_gone(sqs, queue):
    sent = sqs.send_message(QueueUrl=queue, MessageBody="hello")
    got = sqs.receive_message(QueueUrl=queue, AttributeNames=["All"])["Messages"]
    assert [m["Body"] for m in got] == ["hello"]
    assert got[0]["MessageId"] == sent["MessageId"]
    assert got[0]["MD5OfBody"] == sent["MD5OfMessageBody"] == "5d41402abc4b2a76b9719d911017c592"
    assert got[0]["Attributes"]["ApproximateReceiveCount"] == "1"
    assert sqs.receive_message(QueueUrl=queue) == {}  # in flight: hidden
    sqs.delete_message(QueueUrl=queue, ReceiptHandle=got[0]["ReceiptHandle"])
    with pytest.raises(ClientError) as error:  # deleted: no longer in flight
        sqs.change_message_visibility(QueueUrl=queue, ReceiptHandle=got[0]["ReceiptHandle"],
                                      VisibilityTimeout=5)
    assert code_of(error) == "AWS.SimpleQueueService.MessageNotInflight"


def test_a_message_not_deleted_comes_back_after_its_visibility_timeout(sqs, queue):
    sqs.send_message(QueueUrl=queue, MessageBody="again")
    first = sqs.receive_message(QueueUrl=queue, VisibilityTimeout=1)["Messages"][0]
    started = time.monotonic()
    second = sqs.receive_message(QueueUrl=queue, WaitTimeSeconds=5,
                                 MessageSystemAttributeNames=["ApproximateReceiveCount"])
    assert time.monotonic() - started > 0.8  # hidden until its visibility timeout ran out
    message = second["Messages"][0]
    assert message["Attributes"] == {"ApproximateReceiveCount": "2"}
    assert message["ReceiptHandle"] != first["ReceiptHandle"]
    # the old handle deletes nothing, and says nothing (as AWS)
    sqs.delete_message(QueueUrl=queue, ReceiptHandle=first["ReceiptHandle"])
    sqs.change_message_visibility(QueueUrl=queue, ReceiptHandle=message["ReceiptHandle"],
                                  VisibilityTimeout=0)
    third = sqs.receive_message(QueueUrl=queue)["Messages"][0]
    assert third["Body"] == "again"


def test_batches_send_and_delete_up_to_ten(sqs, queue):
    answer = sqs.send_message_batch(QueueUrl=queue, Entries=[
        {"Id": f"m{i}", "MessageBody": str(i)} for i in range(10)])
    assert [e["Id"] for e in answer["Successful"]] == [f"m{i}" for i in range(10)]
    got = sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10)["Messages"]
    assert sorted(int(m["Body"]) for m in got) == list(range(10))
    deleted = sqs.delete_message_batch(QueueUrl=queue, Entries=[
        {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(got[:9])]
        + [{"Id": "bad", "ReceiptHandle": "../../etc/passwd"}])
    assert len(deleted["Successful"]) == 9
    assert deleted["Failed"][0]["Code"] == "ReceiptHandleIsInvalid"
    for entries, code in [
        ([{"Id": str(i), "MessageBody": "x"} for i in range(11)],
         "AWS.SimpleQueueService.TooManyEntriesInBatchRequest"),
        ([{"Id": "a", "MessageBody": "x"}, {"Id": "a", "MessageBody": "y"}],
         "AWS.SimpleQueueService.BatchEntryIdsNotDistinct"),
    ]:
        with pytest.raises(ClientError) as error:
            sqs.send_message_batch(QueueUrl=queue, Entries=entries)
        assert code_of(error) == code


@pytest.mark.parametrize("operation, params", [
    ("send_message", {"MessageBody": 3}),
    ("receive_message", {"MaxNumberOfMessages": "ten"}),
    ("delete_message", {}),
    ("create_queue", {"QueueName": "x", "Unknown": 1}),
])
def test_requests_are_checked_against_botocores_model(sqs, queue, operation, params):
    if operation != "create_queue":
        params = {"QueueUrl": queue, **params}
    with pytest.raises(ParamValidationError):
        getattr(sqs, operation)(**params)


@pytest.mark.parametrize("params", [{"MaxNumberOfMessages": 11}, {"WaitTimeSeconds": 21}])
def test_receive_limits_are_sqss(sqs, queue, params):
    with pytest.raises(ClientError) as error:
        sqs.receive_message(QueueUrl=queue, **params)
    assert code_of(error) == "InvalidParameterValue"


def test_a_deleted_queue_answers_queue_does_not_exist(sqs, queue):
    sqs.tag_queue(QueueUrl=queue, Tags={"batchfutures:run": "r1"})
    assert sqs.list_queue_tags(QueueUrl=queue) == {"Tags": {"batchfutures:run": "r1"}}
    assert sqs.get_queue_url(QueueName="q-1") == {"QueueUrl": queue}
    assert sqs.list_queues(QueueNamePrefix="q-") == {"QueueUrls": [queue]}
    sqs.delete_queue(QueueUrl=queue)
    for call in (lambda: sqs.receive_message(QueueUrl=queue),
                 lambda: sqs.send_message(QueueUrl=queue, MessageBody="x"),
                 lambda: sqs.get_queue_url(QueueName="q-1")):
        with pytest.raises(ClientError) as error:
            call()
        assert code_of(error) == QUEUE_GONE and is_queue_gone(error.value)
    with pytest.raises(ClientError):  # a URL outside the emulator's is no queue either
        sqs.receive_message(QueueUrl="http://sqs.localhost/123456789012/../../etc")


def test_messages_and_folders_are_private(sqs, queue):
    sqs.send_message(QueueUrl=queue, MessageBody="secret-ish")
    folder = sqs.folder / "q-1"
    for path in [folder, folder / "ready", folder / "inflight"]:
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o700
    for name in os.listdir(folder / "ready"):
        assert stat.S_IMODE(os.stat(folder / "ready" / name).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(folder / "queue.json").st_mode) == 0o600


def _long_poll_in_thread(sqs, queue, wait=5):
    answers = []
    thread = threading.Thread(target=lambda: answers.append(
        _answer_or_error(lambda: sqs.receive_message(QueueUrl=queue, WaitTimeSeconds=wait))))
    thread.start()
    bells = sqs.folder / "q-1" / "bells"
    while thread.is_alive() and not os.listdir(bells):  # its bell hung: it is waiting
        time.sleep(0.001)
    return thread, answers


def _answer_or_error(call):
    try:
        return call()
    except ClientError as error:
        return error


def test_a_long_poll_is_woken_by_its_doorbell_not_by_looking_again(sqs, queue, monkeypatch):
    monkeypatch.setattr(sqs_module, "BELL_POLL", 60.0)  # it would not look again in its 5 s
    for sender in (sqs, LocalSQS(sqs.folder)):  # this client's, and another's (process)
        thread, answers = _long_poll_in_thread(sqs, queue)
        sender.send_message_batch(QueueUrl=queue, Entries=[{"Id": "1", "MessageBody": "ring"}])
        thread.join()
        assert [m["Body"] for m in answers[0]["Messages"]] == ["ring"]
        sqs.delete_message(QueueUrl=queue, ReceiptHandle=answers[0]["Messages"][0][
            "ReceiptHandle"])
    [bell] = os.listdir(sqs.folder / "q-1" / "bells")  # kept for the next long poll
    assert stat.S_ISFIFO(os.stat(sqs.folder / "q-1" / "bells" / bell).st_mode)
    assert stat.S_IMODE(os.stat(sqs.folder / "q-1" / "bells" / bell).st_mode) == 0o600


def test_a_deleted_queue_wakes_its_long_polls_with_queue_does_not_exist(sqs, queue,
                                                                      monkeypatch):
    monkeypatch.setattr(sqs_module, "BELL_POLL", 60.0)
    thread, answers = _long_poll_in_thread(sqs, queue)
    LocalSQS(sqs.folder).delete_queue(QueueUrl=queue)
    thread.join()
    assert is_queue_gone(answers[0])
    again = sqs.create_queue(QueueName="q-1")["QueueUrl"]  # the same name, a new queue
    thread, answers = _long_poll_in_thread(sqs, again)  # a new bell: the old one is gone
    sqs.send_message(QueueUrl=again, MessageBody="new")
    thread.join()
    assert [m["Body"] for m in answers[0]["Messages"]] == ["new"]


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts open descriptors")
def test_deleting_a_queue_closes_this_clients_bells_and_their_write_ends(sqs, queue):
    before = len(os.listdir("/proc/self/fd"))
    thread, answers = _long_poll_in_thread(sqs, queue)  # a bell of this client's
    sqs.send_message(QueueUrl=queue, MessageBody="x")  # and a write end of it
    thread.join()
    assert [m["Body"] for m in answers[0]["Messages"]] == ["x"]
    assert len(os.listdir("/proc/self/fd")) == before + 3  # the bell's two ends, the ringer's
    sqs.delete_queue(QueueUrl=queue)
    assert len(os.listdir("/proc/self/fd")) == before


def test_a_bell_whose_receiver_died_is_removed_by_the_next_send(sqs, queue):
    bells = sqs.folder / "q-1" / "bells"
    os.mkfifo(bells / ("0" * 32), 0o600)  # as a receiver killed while it waited leaves it
    sqs.send_message(QueueUrl=queue, MessageBody="x")
    assert os.listdir(bells) == []
    assert [m["Body"] for m in sqs.receive_message(QueueUrl=queue)["Messages"]] == ["x"]


def _receive_all(folder, queue, count, out):
    sqs = LocalSQS(folder)
    got = []
    while len(got) < count:
        answer = sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=3, WaitTimeSeconds=1)
        messages = answer.get("Messages", [])
        if not messages:
            break
        for message in messages:
            got.append(message["Body"])
            sqs.delete_message(QueueUrl=queue, ReceiptHandle=message["ReceiptHandle"])
    out.put(got)


@pytest.mark.slow
def test_receivers_in_other_processes_share_the_queue_each_message_once(sqs, queue):
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    receivers = [context.Process(target=_receive_all, args=(str(sqs.folder), queue, 300, out))
                 for _ in range(3)]
    for receiver in receivers:
        receiver.start()
    for start in range(0, 300, 10):  # sent while they long-poll
        sqs.send_message_batch(QueueUrl=queue, Entries=[
            {"Id": str(i), "MessageBody": str(start + i)} for i in range(10)])
    bodies = [body for _ in receivers for body in out.get(timeout=60)]
    for receiver in receivers:
        receiver.join(timeout=30)
    assert sorted(int(b) for b in bodies) == list(range(300))  # each exactly once


def _scenario(sqs, name):
    """One sequence of requests; what came back, with what differs by nature (ids, handles,
    URLs' hosts) left out, so two services can be compared."""
    trace = []

    def keep(answer):
        answer = {k: v for k, v in answer.items() if k != "ResponseMetadata"}
        trace.append(answer)
        return answer

    url = keep(sqs.create_queue(QueueName=name, Attributes={"VisibilityTimeout": "30"}))["QueueUrl"]
    trace[-1] = {"QueueUrl": url.rsplit("/", 1)[-1]}
    sent = keep(sqs.send_message(QueueUrl=url, MessageBody="one"))
    trace[-1] = {"keys": sorted(sent), "md5": sent["MD5OfMessageBody"]}
    batch = keep(sqs.send_message_batch(QueueUrl=url, Entries=[
        {"Id": f"e{i}", "MessageBody": f"m{i}"} for i in range(3)]))
    trace[-1] = {"ids": sorted(e["Id"] for e in batch["Successful"]),
                 "failed": batch.get("Failed", [])}
    got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=1,
                              AttributeNames=["ApproximateReceiveCount"], WaitTimeSeconds=1)
    messages = got["Messages"]
    while len(messages) < 4:  # SQS may answer with fewer than are there
        more = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=1,
                                   AttributeNames=["ApproximateReceiveCount"])
        messages += more.get("Messages", [])
    trace.append({"bodies": sorted(m["Body"] for m in messages),
                  "keys": sorted({k for m in messages for k in m}),
                  "counts": sorted(m["Attributes"]["ApproximateReceiveCount"] for m in messages)})
    trace.append(keep(sqs.receive_message(QueueUrl=url)))  # all in flight: nothing
    deleted = sqs.delete_message_batch(QueueUrl=url, Entries=[
        {"Id": f"d{i}", "ReceiptHandle": m["ReceiptHandle"]}
        for i, m in enumerate(messages) if m["Body"] in ("one", "m0")])
    trace.append(sorted(e["Id"] for e in deleted["Successful"]))
    time.sleep(1.2)
    again = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=3,
                                AttributeNames=["ApproximateReceiveCount"])["Messages"]
    while len(again) < 2:
        again += sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1,
                                     AttributeNames=["ApproximateReceiveCount"]).get("Messages", [])
    again.sort(key=lambda m: m["Body"])  # SQS keeps no order: pick the same one on both
    trace.append([(m["Body"], m["Attributes"]["ApproximateReceiveCount"]) for m in again])
    sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=again[0]["ReceiptHandle"],
                                  VisibilityTimeout=0)
    back = sqs.receive_message(QueueUrl=url, AttributeNames=["ApproximateReceiveCount"],
                               WaitTimeSeconds=1)["Messages"]
    trace.append([(m["Body"], m["Attributes"]["ApproximateReceiveCount"]) for m in back])
    sqs.tag_queue(QueueUrl=url, Tags={"batchfutures:run": "r"})
    trace.append(keep(sqs.list_queue_tags(QueueUrl=url)))
    sqs.delete_queue(QueueUrl=url)
    try:
        sqs.receive_message(QueueUrl=url)
    except ClientError as error:
        trace.append(is_queue_gone(error))
    return trace


@pytest.mark.slow
def test_the_emulators_sqs_answers_as_motos(sqs, moto_server, aws_env):  # noqa: F811
    from batchfutures.sqsapi import client_for

    moto = client_for({"region": "us-east-1", "endpoint_url": moto_server})
    name = f"fidelity-{uuid.uuid4().hex[:8]}"
    assert _scenario(sqs, name) == _scenario(moto, name)
