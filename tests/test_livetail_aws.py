"""echo_output="live" on AWS: StartLiveTail sessions through a real boto3 logs client against
moto's server (which implements StartLiveTail: one sessionStart, then one sessionUpdate of the
matching events, then the stream ends; the LiveTail opens it again as it does after AWS's
3-hour timeout), and the fall-back to GetLogEvents when StartLiveTail is refused (a moto IAM
user denied logs:StartLiveTail) or cannot be reached (a custom endpoint with botocore's host
prefix injection on).

The environment is a real AWSBatchEnvironment; its logs client is the one production code makes
(AWS_ENDPOINT_URL points it at moto). The children's running state is given with set_running
instead of Batch's: moto's Batch runs no containers.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Callable, List

import boto3
import pytest
import requests
import s3server
from botocore.exceptions import ClientError
from s3server import private_moto_server

from batchfutures import livetail
from batchfutures.environments import AWSBatchEnvironment
from batchfutures.logs import LiveTailAPI

moto_server, aws_env = s3server.moto_server, s3server.aws_env  # fixtures

REGION = "us-east-1"
ACCOUNT = "123456789012"  # moto's default account


def environment() -> AWSBatchEnvironment:
    return AWSBatchEnvironment("q", "some-bucket", "worker-definition:1", region_name=REGION)


def make_stream(logs, group: str, stream: str) -> None:
    try:
        logs.create_log_group(logGroupName=group)
    except ClientError as error:
        if error.response["Error"]["Code"] != "ResourceAlreadyExistsException":
            raise
    logs.create_log_stream(logGroupName=group, logStreamName=stream)


def put(logs, group: str, stream: str, messages: List[str]) -> None:
    now = int(time.time() * 1000)
    logs.put_log_events(logGroupName=group, logStreamName=stream, logEvents=[
        {"timestamp": now + i, "message": message} for i, message in enumerate(messages)])


def rounds_until(tail: livetail.LiveTail, done: Callable[[], bool], seconds: float = 30) -> None:
    """Read rounds (the LiveTail thread's second half) until ``done()``, at most ``seconds``."""
    deadline = time.monotonic() + seconds
    while not done():
        assert time.monotonic() < deadline, "the lines did not come"
        tail.read_round()
        time.sleep(0.05)


def lines_of(written: List[str]) -> List[str]:
    return [line for text in written for line in text.splitlines()]


@pytest.fixture
def names():
    run = uuid.uuid4().hex[:8]
    return {"group": f"/aws/batch/bf-live-{run}", "stream": f"bf-live-{run}-worker/default/{run}",
            "child": f"{run}-job:0"}


def follow(tail, names) -> None:
    tail.follow(names["child"], names["group"], names["stream"],
                job_arn=f"arn:aws:batch:{REGION}:{ACCOUNT}:job/{names['child']}")


def following(names, messages: List[str]):
    """An AWS environment, the child's stream with ``messages`` in it, and a LiveTail following
    the child, running (stop it when done): (env, tail, what it wrote)."""
    env = environment()
    make_stream(env.logs, names["group"], names["stream"])
    put(env.logs, names["group"], names["stream"], messages)
    written: List[str] = []
    tail = livetail.LiveTail(env, lambda: [], write=written.append, interval=0.05)
    follow(tail, names)
    tail.set_running({names["child"]})
    return env, tail, written


def test_a_start_live_tail_session_shows_each_line_once_in_order(aws_env, monkeypatch, names):
    monkeypatch.setenv("AWS_DISABLE_HOST_PREFIX_INJECTION", "true")  # botocore's own setting
    env = environment()
    logs = env.logs
    assert isinstance(logs, LiveTailAPI)  # boto3's client: the operation and its meta
    make_stream(logs, names["group"], names["stream"])
    put(logs, names["group"], names["stream"], ["one", "two"])
    written: List[str] = []
    tail = livetail.LiveTail(env, lambda: [], write=written.append, interval=0.05)
    try:
        follow(tail, names)
        tail.set_running({names["child"]})
        rounds_until(tail, lambda: len(lines_of(written)) >= 2)
        assert tail.reader == livetail.LIVE_TAIL
        put(logs, names["group"], names["stream"],
            ["three", "batchfutures.worker: a note of the worker's", "four"])
        rounds_until(tail, lambda: len(lines_of(written)) >= 4
                     and tail.counts["events streamed"] >= 5)
        tail.set_running(set())  # it ended: read to its end once more, then dropped
        put(logs, names["group"], names["stream"], ["five"])
        tail.read_round()
    finally:
        tail.stop()
    child = names["child"]
    assert lines_of(written) == [f"[{child}] {line}" for line in ("one", "two", "three", "four",
                                                                   "five")]
    assert tail.counts["sessions"] >= 1  # StartLiveTail sessions started and streamed the lines
    assert tail.counts["events streamed"] >= 5
    assert not tail._sessions  # nothing followed: no session left open (billed per minute)


def test_a_sampled_session_says_so_once(aws_env, monkeypatch, names):
    """Past 500 events, a session update is a sample (moto's too): said once, however many
    updates are sampled; the catch-up read still shows every line once."""
    monkeypatch.setenv("AWS_DISABLE_HOST_PREFIX_INJECTION", "true")
    _, tail, written = following(names, [f"line {i}" for i in range(600)])
    try:
        rounds_until(tail, lambda: len(lines_of(written)) >= 601 and tail.counts["sessions"] >= 2)
    finally:
        tail.stop()
    notes = [line for line in lines_of(written) if line.startswith("[batchfutures:")]
    assert len(notes) == 1 and "samples" in notes[0]
    assert [line for line in lines_of(written) if not line.startswith("[batchfutures:")] == [
        f"[{names['child']}] line {i}" for i in range(600)]


def test_a_custom_endpoint_with_host_prefix_injection_reads_with_get_log_events(aws_env, names):
    """StartLiveTail's host prefix would name stream-127.0.0.1: no session is tried."""
    _, tail, written = following(names, ["one", "two"])
    try:
        rounds_until(tail, lambda: len(lines_of(written)) >= 2)
    finally:
        tail.stop()
    assert tail.reader == livetail.POLL and tail.counts["sessions"] == 0
    assert lines_of(written) == [f"[{names['child']}] one", f"[{names['child']}] two"]


def test_a_stream_not_made_yet_holds_up_no_other(aws_env, names):
    """GetLogEvents' ResourceNotFoundException for a child whose stream is not there yet: the
    other children's lines still show, and both are dropped once ended."""
    env = environment()
    make_stream(env.logs, names["group"], names["stream"])
    put(env.logs, names["group"], names["stream"], ["one"])
    written: List[str] = []
    tail = livetail.LiveTail(env, lambda: [], write=written.append, interval=0.05)
    try:
        tail.follow("a-job:0", names["group"], names["stream"].replace("/default/", "/default/x"))
        follow(tail, names)
        tail.set_running({"a-job:0", names["child"]})
        tail.read_round()
        assert lines_of(written) == [f"[{names['child']}] one"]
        tail.set_running(set())
        tail.read_round()
        assert not tail._followed
    finally:
        tail.stop()


def test_an_ended_childs_lines_that_come_late_still_show(aws_env, names):
    """CloudWatch Logs may show a job's last lines a little after it ended: an ended child is
    read again until a read brings nothing (at most SETTLE_READS), then dropped."""
    env, tail, written = following(names, ["one"])
    try:
        tail.read_round()
        tail.set_running(set())  # it ended
        put(env.logs, names["group"], names["stream"], ["two"])
        tail.read_round()  # brought a line: it may have more on their way
        assert names["child"] in tail._followed
        put(env.logs, names["group"], names["stream"], ["three"])  # ingested late
        tail.read_round()
        tail.read_round()  # brought nothing: read to its end, dropped
        assert not tail._followed
    finally:
        tail.stop()
    assert lines_of(written) == [f"[{names['child']}] {line}" for line in ("one", "two", "three")]


@pytest.mark.parametrize("got, reads_after_end, done", [
    (0, 1, True),  # the read after the end brought nothing
    (3, 1, False),  # it brought lines: more may be on their way
    (3, livetail.SETTLE_READS - 1, False),
    (3, livetail.SETTLE_READS, True),  # at most SETTLE_READS reads after the end
    (0, livetail.SETTLE_READS + 2, True),
])
def test_settled(got, reads_after_end, done):
    assert livetail.settled(got, reads_after_end) is done


DENY_LIVE_TAIL = {"Version": "2012-10-17", "Statement": [
    {"Effect": "Allow", "Action": "logs:*", "Resource": "*"},
    {"Effect": "Deny", "Action": "logs:StartLiveTail", "Resource": "*"}]}


@pytest.fixture
def denied(monkeypatch, names):
    """A moto server of this test's own holding the stream with two lines, with IAM enforced,
    and the process signing as a user whose policy denies logs:StartLiveTail (and allows the
    rest of Logs); yields that user's logs client."""
    with private_moto_server() as url:
        admin = boto3.session.Session(aws_access_key_id="testing", aws_secret_access_key="testing",
                                      region_name=REGION)
        iam = admin.client("iam", endpoint_url=url)
        iam.create_user(UserName="live")
        iam.put_user_policy(UserName="live", PolicyName="no-live-tail",
                            PolicyDocument=json.dumps(DENY_LIVE_TAIL))
        key = iam.create_access_key(UserName="live")["AccessKey"]
        admin_logs = admin.client("logs", endpoint_url=url)
        make_stream(admin_logs, names["group"], names["stream"])
        put(admin_logs, names["group"], names["stream"], ["one", "two"])
        for name, value in s3server.fake_aws_variables(url).items():
            monkeypatch.setenv(name, value)
        monkeypatch.delenv("AWS_SESSION_TOKEN")
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", key["AccessKeyId"])
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", key["SecretAccessKey"])
        monkeypatch.setenv("AWS_DISABLE_HOST_PREFIX_INJECTION", "true")
        previous = requests.post(f"{url}/moto-api/reset-auth", data=b"0", timeout=10).json()[
            "PREVIOUS_INITIAL_NO_AUTH_ACTION_COUNT"]
        try:
            yield boto3.client("logs", region_name=REGION, endpoint_url=url,
                               aws_access_key_id=key["AccessKeyId"],
                               aws_secret_access_key=key["SecretAccessKey"])
        finally:  # moto's switch is the whole process's: put it back
            requests.post(f"{url}/moto-api/reset-auth", data=str(previous).encode(), timeout=10)


def test_a_refused_start_live_tail_falls_back_to_get_log_events(denied, names, caplog):
    env = environment()
    written: List[str] = []
    tail = livetail.LiveTail(env, lambda: [], write=written.append, interval=0.05)
    caplog.set_level("INFO", logger="batchfutures")
    try:
        follow(tail, names)
        tail.set_running({names["child"]})
        rounds_until(tail, lambda: names["group"] in tail._refused)
        put(denied, names["group"], names["stream"], ["three"])
        rounds_until(tail, lambda: len(lines_of(written)) >= 3)
    finally:
        tail.stop()
    assert tail.reader == livetail.LIVE_TAIL and tail.counts["sessions"] == 0
    assert "AccessDenied" in tail._refused[names["group"]]
    assert lines_of(written) == [f"[{names['child']}] {line}" for line in ("one", "two", "three")]
    assert tail.counts["lines by GetLogEvents"] == 3
    assert "StartLiveTail refused" in caplog.text


def test_boto3s_logs_client_is_the_live_tail_seam(aws_env):
    """LiveTailAPI names StartLiveTail as botocore's model does, and boto3's client has it."""
    import botocore.session
    from botocore import xform_name

    model = botocore.session.get_session().get_service_model("logs")
    assert "start_live_tail" in {xform_name(name) for name in model.operation_names}
    assert model.operation_model("StartLiveTail").endpoint["hostPrefix"] in ("stream-", "streaming-")
    assert isinstance(boto3.session.Session(region_name=REGION).client("logs"), LiveTailAPI)
    assert not isinstance(object(), LiveTailAPI)
