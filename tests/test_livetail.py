"""echo_output="live": running calls' output on the client while they run (batchfutures.livetail)."""

import os
import time
from collections import Counter

import pytest

from batchfutures import BatchExecutor, livetail


@pytest.mark.parametrize("keys, start, budget, chosen, next_start", [
    ([], 0, 5, [], 0),
    (["a", "b"], 1, 5, ["a", "b"], 0),              # all fit: all, every round
    (["a", "b", "c", "d"], 0, 3, ["a", "b", "c"], 3),
    (["a", "b", "c", "d"], 3, 3, ["d", "a", "b"], 2),  # turns wrap around
    (["a", "b", "c"], 7, 2, ["b", "c"], 0),          # a start past the end (fewer keys now)
    (["a", "b"], 0, 0, [], 0),
])
def test_choose_takes_turns(keys, start, budget, chosen, next_start):
    assert livetail.choose(keys, start, budget) == (chosen, next_start)


@pytest.mark.parametrize("line, expected", [
    ("working on 3", True), ("", True),
    ("batchfutures.worker: child 0: the call raised ValueError", False),
    ("batchfutures.log: INFO:app:kept for the client", False),
    ("  batchfutures.worker: indented is the user's", True),
])
def test_shown(line, expected):
    assert livetail.shown(line) is expected


def test_prefixed():
    assert livetail.prefixed("abc:3", "hello") == "[abc:3] hello"


def test_echo_at_end_and_streaming_exclude_each_other(local_env):
    tail = livetail.LiveTail(local_env, lambda: [])
    assert tail.echo_at_end("job:1") is True  # echoed as it resolved: never followed after
    tail._streamed.add("job:2")
    assert tail.echo_at_end("job:2") is False  # followed: not echoed again


def test_echo_output_must_be_true_false_or_live(local_env):
    with pytest.raises(ValueError, match="'live'"):
        BatchExecutor(local_env, echo_output="stream")


def _talk_then_wait(flag_path):
    print("first line", flush=True)
    deadline = time.time() + 120
    while not os.path.exists(flag_path) and time.time() < deadline:
        time.sleep(0.05)
    print("second line")
    return "done"


@pytest.mark.slow
def test_prints_reach_the_client_while_the_call_runs(local_env, tmp_path, capsys):
    flag = tmp_path / "go"
    seen = []

    def output():
        seen.append(capsys.readouterr().out)
        return "".join(seen)

    with BatchExecutor(local_env, echo_output="live") as ex:
        future = ex.submit(_talk_then_wait, str(flag))
        deadline = time.time() + 120
        while "first line" not in output() and time.time() < deadline:
            time.sleep(0.05)
        assert not future.done()  # streamed while the call still runs
        first = [line for line in output().splitlines() if line.endswith("] first line")]
        assert first == [f"[{future.job_id}] first line"]
        flag.write_text("go")
        assert future.result(timeout=120) == "done"
    text = output()  # the executor's exit waits for the last round: the call's last lines
    assert f"[{future.job_id}] second line" in text.splitlines()
    assert text.count("first line") == 1 and text.count("second line") == 1  # not echoed again


def _quick(x):
    print(f"quick {x}")
    return x


@pytest.mark.slow
def test_calls_that_ended_before_a_round_are_echoed_once(local_env, capsys):
    with BatchExecutor(local_env, echo_output="live") as ex:
        assert list(ex.map(_quick, range(4))) == [0, 1, 2, 3]
    text = capsys.readouterr().out
    for x in range(4):  # each line once: streamed, or echoed as the call resolved
        assert sum(line.endswith(f"quick {x}") for line in text.splitlines()) == 1


# -- the StartLiveTail reader's decisions ------------------------------------------------------
AWS_SUFFIXES = ("amazonaws.com", "api.aws", "amazonaws.com.cn")


@pytest.mark.parametrize("is_local, endpoint, inject, reader", [
    (True, "https://logs.us-east-1.amazonaws.com", True, livetail.POLL),  # the emulator's logs
    (False, "https://logs.us-east-1.amazonaws.com", True, livetail.LIVE_TAIL),
    (False, "https://logs.cn-north-1.amazonaws.com.cn", True, livetail.LIVE_TAIL),
    (False, "https://logs.us-east-1.api.aws", True, livetail.LIVE_TAIL),  # dual-stack
    (False, "https://vpce-1.logs.us-east-1.vpce.amazonaws.com", True, livetail.LIVE_TAIL),
    (False, "http://127.0.0.1:5000", True, livetail.POLL),  # stream-127.0.0.1 is no host
    (False, "http://127.0.0.1:5000", False, livetail.LIVE_TAIL),  # AWS_DISABLE_HOST_PREFIX_INJECTION
    (False, "https://logs.example.amazonaws.com.evil.test", True, livetail.POLL),
])
def test_reader_for(is_local, endpoint, inject, reader):
    assert livetail.reader_for(is_local, endpoint, inject, AWS_SUFFIXES)[0] == reader


def test_the_aws_suffixes_come_from_botocores_partitions():
    assert {"amazonaws.com", "api.aws", "amazonaws.com.cn"} <= set(livetail._aws_suffixes())


@pytest.mark.parametrize("stream, prefix", [
    ("bf-worker/default/0123abcd", "bf-worker/"),
    ("bf_0123456789abcdef01234567/default/ab", "bf_0123456789abcdef01234567/"),
    ("no-slash", "no-slash"),
])
def test_stream_prefix(stream, prefix):
    assert livetail.stream_prefix(stream) == prefix


@pytest.mark.parametrize("job_arn, arn", [
    ("arn:aws:batch:eu-west-1:123456789012:job/6e6c6b1c",
     "arn:aws:logs:eu-west-1:123456789012:log-group:/aws/batch/bf"),
    ("arn:aws:batch:eu-west-1:123456789012:job/6e6c6b1c:3",  # an array child
     "arn:aws:logs:eu-west-1:123456789012:log-group:/aws/batch/bf"),
    ("arn:aws-cn:batch:cn-north-1:123456789012:job/x",
     "arn:aws-cn:logs:cn-north-1:123456789012:log-group:/aws/batch/bf"),
    ("", None), ("6e6c6b1c", None), ("arn:aws:batch::123456789012:job/x", None),
])
def test_group_arn(job_arn, arn):
    assert livetail.group_arn(job_arn, "/aws/batch/bf") == arn


ARN = "arn:aws:logs:us-east-1:123456789012:log-group:g"


def test_session_request_names_at_most_five_prefixes():
    assert livetail.session_request(ARN, ["b/", "a/", "a/"]) == {
        "logGroupIdentifiers": [ARN], "logStreamNamePrefixes": ["a/", "b/"]}
    assert livetail.session_request(ARN, [f"d{i}/" for i in range(6)]) == {
        "logGroupIdentifiers": [ARN]}  # the whole group, filtered on the client


def _request(*prefixes):
    return livetail.session_request(ARN, prefixes)


@pytest.mark.parametrize("open_request, arn, prefixes, plan", [
    (None, ARN, {"a/"}, "open"),
    (None, ARN, set(), "keep"),             # nothing followed, nothing open
    (None, None, {"a/"}, "keep"),           # no ARN (not an ARN job id): GetLogEvents
    (_request("a/"), ARN, {"a/"}, "keep"),
    (_request("a/", "b/"), ARN, {"a/"}, "keep"),   # a definition no longer in use: no reopen
    (_request("a/"), ARN, {"a/", "b/"}, "reopen"),  # a new definition's streams
    (_request("a/"), ARN, set(), "close"),   # no child followed: stop paying for it
    (_request(*[f"d{i}/" for i in range(6)]), ARN, {f"d{i}/" for i in range(7)}, "keep"),
    (_request(*[f"d{i}/" for i in range(6)]), ARN, {"d0/"}, "reopen"),  # narrowed again
    (_request("a/"), ARN.replace("us-east-1", "eu-west-1"), {"a/"}, "reopen"),
])
def test_session_plan(open_request, arn, prefixes, plan):
    assert livetail.session_plan(open_request, arn, prefixes) == plan


def _client_error(code, status=400):
    from botocore.exceptions import ClientError

    return ClientError({"Error": {"Code": code, "Message": "m"},
                        "ResponseMetadata": {"HTTPStatusCode": status}}, "StartLiveTail")


def _endpoint_error():
    from botocore.exceptions import EndpointConnectionError

    return EndpointConnectionError(endpoint_url="https://stream-logs.example")


@pytest.mark.parametrize("error, refused", [
    (_client_error("AccessDeniedException"), True),
    (_client_error("403", 403), True),  # an answer botocore could not parse (moto's IAM)
    (_client_error("LimitExceededException"), True),  # the account's sessions are all in use
    (_client_error("UnknownOperationException", 404), True),  # the emulator's endpoint
    (_client_error("InvalidParameterException"), True),
    (_client_error("ResourceNotFoundException"), True),
    (AttributeError("'CloudWatchLogs' object has no attribute 'start_live_tail'"), True),
    (_endpoint_error(), True),
    (_client_error("ThrottlingException"), False),  # another session later
    (_client_error("ServiceUnavailableException", 503), False),
    (_client_error("SessionStreamingException"), False),
    (_client_error("SessionTimeoutException"), False),
    (ConnectionResetError(), False),
])
def test_refusal(error, refused):
    assert (livetail.refusal(error) is not None) is refused


@pytest.mark.parametrize("how, failures, step", [
    (livetail.ENDED, 0, livetail.REOPEN),
    (livetail.TIMED_OUT, 0, livetail.REOPEN),  # the 3-hour timeout
    (livetail.TIMED_OUT, 5, livetail.REOPEN),
    (livetail.FAILED, 1, livetail.REOPEN),
    (livetail.FAILED, livetail.MAX_FAILURES, livetail.FALL_BACK),
])
def test_after_end(how, failures, step):
    assert livetail.after_end(how, failures) == step


def _event(ts, message, ingested=None):
    return {"timestamp": ts, "ingestionTime": ingested if ingested is not None else ts + 5,
            "message": message}


@pytest.mark.parametrize("batches, shown", [
    ([[_event(1, "a"), _event(2, "b")]], ["a", "b"]),
    ([[_event(1, "a"), _event(2, "b")], [_event(1, "a"), _event(2, "b")]], ["a", "b"]),  # replay
    ([[_event(1, "a")], [_event(1, "a"), _event(2, "b")]], ["a", "b"]),  # read, then streamed
    ([[_event(1, "x"), _event(1, "x")]], ["x", "x"]),  # one line printed twice at once
    ([[_event(1, "x"), _event(1, "x")], [_event(1, "x")]], ["x", "x"]),
    ([[_event(1, "x")], [_event(1, "x"), _event(1, "x")]], ["x", "x"]),
    ([[_event(1, "x", 6)], [_event(1, "x", 9)]], ["x", "x"]),  # ingested apart: two lines
])
def test_fresh_shows_each_event_once(batches, shown):
    seen: dict = {}
    out = []
    for batch in batches:
        new, seen = livetail.fresh(batch, seen)
        out += [event["message"] for event in new]
    assert out == shown


def test_fresh_counts_a_batch_that_comes_in_parts():
    """Two equal lines printed at once, on two pages of one read: both show."""
    counts: Counter = Counter()
    first, seen = livetail.fresh([_event(1, "x")], {}, counts)
    second, seen = livetail.fresh([_event(1, "x")], seen, counts)
    assert len(first + second) == 2
    again, _ = livetail.fresh([_event(1, "x"), _event(1, "x")], seen)  # streamed too: shown
    assert again == []


def test_fresh_forgets_what_is_older_than_its_window():
    _, seen = livetail.fresh([_event(0, "old"), _event(livetail.SEEN_WINDOW_MS + 1, "new")], {})
    assert [key[2] for key in seen] == ["new"]
