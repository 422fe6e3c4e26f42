"""A job's stdout and stderr, read back as CloudWatch Logs' get_log_events pages them."""

import pytest
from botocore.exceptions import ClientError
from emulator_harness import py, wait_until

GROUP = "/aws/batch/job"
PRINT_25 = ("import sys\n"
            "for i in range(25):\n"
            "    print(f'line {i}', file=sys.stderr if i % 5 == 0 else sys.stdout, flush=True)\n")


@pytest.fixture
def stream(emu):
    detail = emu.run(py(PRINT_25), name="printer")
    assert detail["status"] == "SUCCEEDED"
    assert detail["container"]["logStreamName"] == detail["attempts"][0]["container"]["logStreamName"]
    return detail["container"]["logStreamName"]


@pytest.mark.slow
def test_stdout_and_stderr_reach_the_stream_in_order(emu, stream):
    page = emu.logs.get_log_events(logGroupName=GROUP, logStreamName=stream, startFromHead=True)
    assert [e["message"] for e in page["events"]] == [f"line {i}" for i in range(25)]
    assert all(isinstance(e["timestamp"], int) and e["timestamp"] > 10**12 for e in page["events"])
    again = emu.logs.get_log_events(logGroupName=GROUP, logStreamName=stream,
                                    nextToken=page["nextForwardToken"])
    assert again["events"] == []
    assert again["nextForwardToken"] == page["nextForwardToken"]  # the end: the token repeats


@pytest.mark.slow
def test_forward_paging_with_a_limit_ends_when_the_token_repeats(emu, stream):
    messages, token, pages = [], None, 0
    while True:
        request = {"logGroupName": GROUP, "logStreamName": stream, "startFromHead": True, "limit": 10}
        if token:
            request["nextToken"] = token
        page = emu.logs.get_log_events(**request)
        pages += 1
        assert len(page["events"]) <= 10
        messages.extend(e["message"] for e in page["events"])
        if page["nextForwardToken"] == token:
            break
        token = page["nextForwardToken"]
        assert pages < 10
    assert messages == [f"line {i}" for i in range(25)]
    assert pages == 4  # 10 + 10 + 5 + the empty page that repeats the token


@pytest.mark.slow
def test_without_start_from_head_the_newest_lines_come_first_then_backward(emu, stream):
    page = emu.logs.get_log_events(logGroupName=GROUP, logStreamName=stream, limit=10)
    assert [e["message"] for e in page["events"]] == [f"line {i}" for i in range(15, 25)]
    older = emu.logs.get_log_events(logGroupName=GROUP, logStreamName=stream, limit=10,
                                    nextToken=page["nextBackwardToken"])
    assert [e["message"] for e in older["events"]] == [f"line {i}" for i in range(5, 15)]
    newer = emu.logs.get_log_events(logGroupName=GROUP, logStreamName=stream,
                                    nextToken=page["nextForwardToken"])
    assert newer["events"] == []


@pytest.mark.slow
def test_each_attempt_has_its_own_stream(emu):
    code = "import os; print('attempt', os.environ['AWS_BATCH_JOB_ATTEMPT']); raise SystemExit(1)"
    detail = emu.run(py(code), retryStrategy={"attempts": 2})
    streams = [a["container"]["logStreamName"] for a in detail["attempts"]]
    assert len(set(streams)) == 2
    assert emu.log_lines(detail, 0) == ["attempt 1"]
    assert emu.log_lines(detail, 1) == ["attempt 2"]


@pytest.mark.slow
def test_a_line_still_being_written_is_not_cut_in_two(emu, tmp_path):
    wrote, go = tmp_path / "wrote", tmp_path / "go"
    code = ("import os, sys, time\n"
            "sys.stdout.write('first half '); sys.stdout.flush()\n"
            f"open({str(wrote)!r}, 'w').close()\n"
            f"while not os.path.exists({str(go)!r}): time.sleep(0.01)\n"
            "sys.stdout.write('second half\\nlast\\n'); sys.stdout.flush()\n")
    job = emu.job(py(code))
    wait_until(wrote.exists, "the job to write half a line")
    stream = emu.detail(job)["container"]["logStreamName"]
    first = emu.logs.get_log_events(logGroupName=GROUP, logStreamName=stream, startFromHead=True)
    go.touch()
    emu.wait(job)
    rest = emu.logs.get_log_events(logGroupName=GROUP, logStreamName=stream,
                                   nextToken=first["nextForwardToken"])
    messages = [e["message"] for e in first["events"] + rest["events"]]
    assert messages == ["first half second half", "last"]


def test_an_unknown_stream_is_resource_not_found(emu):
    with pytest.raises(ClientError) as raised:
        emu.logs.get_log_events(logGroupName=GROUP, logStreamName="batchfutures-worker/default/nope")
    assert raised.value.response["Error"]["Code"] == "ResourceNotFoundException"
