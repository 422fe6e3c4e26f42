"""The log reader: tail, full read and follow, against CloudWatch's paging and the emulator's logs.

`CloudWatchStream` models GetLogEvents as AWS documents it and as it behaves where it is harsh:
a page may be empty or partly full while more events lie beyond its token, the end of a stream
is reached when the token comes back unchanged, ``endTime`` bounds a read, and a stream being
written keeps growing between calls. The emulator's LogsService is the real part for the rest.
"""

import time

import pytest
from botocore.exceptions import ClientError

from batchfutures.emulator.logservice import LogsService
from batchfutures.logs import (
    follow,
    follow_job,
    job_log_tail,
    log_group_of,
    log_stream,
    read_all,
    tail,
)


class CloudWatchStream:
    """One log stream's GetLogEvents: tokens are positions, pages sized by ``page_sizes``."""

    def __init__(self, lines, *, page_sizes=(), grow=False, missing_calls=0, max_calls=2000):
        self.events = [(i, line) for i, line in enumerate(lines)]  # (timestamp, message)
        self.page_sizes = list(page_sizes)  # per call; afterwards 10,000 (the API's maximum)
        self.grow = grow  # one new event per call: a stream still being written
        self.missing_calls = missing_calls  # calls answered "stream does not exist" first
        self.max_calls = max_calls  # a read that never ends fails the test instead of hanging
        self.calls = []

    def append(self, *lines):
        start = len(self.events)
        self.events += [(start + i, line) for i, line in enumerate(lines)]

    def get_log_events(self, **params):
        self.calls.append(params)
        assert len(self.calls) <= self.max_calls, "the read never ended"
        if self.missing_calls:
            self.missing_calls -= 1
            raise ClientError({"Error": {"Code": "ResourceNotFoundException",
                                         "Message": "The specified log stream does not exist."},
                               "ResponseMetadata": {"HTTPStatusCode": 400}}, "GetLogEvents")
        if self.grow:
            self.append(f"written during the read {len(self.calls)}")
        end_time = params.get("endTime")
        visible = [e for e in self.events if end_time is None or e[0] < end_time]
        size = min(params.get("limit") or 10_000,
                   self.page_sizes.pop(0) if self.page_sizes else 10_000)
        token = params.get("nextToken")
        if token:
            forward, position = token[0] == "f", int(token[2:])
        else:
            forward = bool(params.get("startFromHead"))
            position = 0 if forward else len(visible)
        if forward:
            page = visible[position:position + size]
            start, end = position, position + len(page)
        else:
            page = visible[max(0, position - size):position] if size else []
            start, end = position - len(page), position
        return {"events": [{"timestamp": t, "message": m} for t, m in page],
                "nextForwardToken": f"f/{end}", "nextBackwardToken": f"b/{start}"}


LINES = [f"line {i}" for i in range(50)]


def test_tail_reads_past_empty_and_partial_pages():
    stream = CloudWatchStream(LINES, page_sizes=[0, 2, 3])
    assert tail(stream, "g", "s", lines=10) == LINES[-10:]
    assert len(stream.calls) == 4


def test_tail_of_a_short_stream_stops_at_its_start():
    stream = CloudWatchStream(LINES[:4], page_sizes=[1, 1])
    assert tail(stream, "g", "s", lines=20) == LINES[:4]


def test_a_full_read_ends_while_the_stream_is_still_written():
    stream = CloudWatchStream(LINES, page_sizes=[7] * 100, grow=True)
    stream.events = [(0, line) for line in LINES]  # written before the read began
    lines = read_all(stream, "g", "s", end_time_ms=1)
    assert lines == LINES
    assert all(call["endTime"] == 1 for call in stream.calls)


def test_follow_keeps_its_place_and_ends_after_until():
    stream = CloudWatchStream(LINES[:5], page_sizes=[2] * 50, missing_calls=1)
    finished = []
    reader = follow(stream, "g", "s", poll=0, until=lambda: bool(finished), sleep=lambda _: None)
    seen = [next(reader) for _ in range(5)]
    stream.append("six", "seven")
    seen += [next(reader), next(reader)]
    stream.append("eight")
    finished.append(True)  # the job ended: what it wrote before is still yielded
    seen += list(reader)
    assert seen == LINES[:5] + ["six", "seven", "eight"]
    from_head = [c for c in stream.calls if "nextToken" not in c]
    assert len(from_head) == 2  # the missing stream, then one read from the start; never again


def test_where_a_job_logs():
    config = {"logDriver": "awslogs", "options": {"awslogs-group": "/g"}}
    attempts = [{"container": {"logStreamName": "first"}},
                {"container": {"logStreamName": "second"}}, {"container": {}}]
    # a retry runs: `container` is the attempt of now, `attempts` the finished ones
    description = {"jobId": "j", "container": {"logStreamName": "third",
                                               "logConfiguration": config},
                   "attempts": attempts}
    assert log_stream(description) == "third"
    # waiting for its retry, with no stream of its own: the latest attempt that has one
    waiting = {"jobId": "j", "container": {"logConfiguration": config}, "attempts": attempts}
    assert log_stream(waiting) == "second"
    assert log_group_of(description, "/aws/batch/job") == "/g"
    assert log_stream({"jobId": "j"}) is None
    assert job_log_tail(CloudWatchStream(LINES), {"jobId": "j"}, "/aws/batch/job") is None


def test_tail_on_the_emulators_logs_crosses_one_megabyte_pages(tmp_path):
    lines = [f"{i:06d} " + "x" * 1000 for i in range(3000)]  # 3 MB: three 1 MB pages at least
    path = tmp_path / "def" / "default" / "task"
    path.parent.mkdir(parents=True)
    path.write_text("\n".join(lines) + "\n")
    service = LogsService(tmp_path)
    assert tail(service, "/aws/batch/job", "def/default/task", lines=2500) == lines[-2500:]
    assert read_all(service, "/aws/batch/job", "def/default/task") == lines


def chatty(count):
    for i in range(count):
        print(f"tick {i}", flush=True)
        time.sleep(0.05)


@pytest.mark.slow
def test_follow_a_running_job_on_the_emulator(executor, local_env):
    future = executor.submit(chatty, 40)
    stream = None
    deadline = time.monotonic() + 60
    while stream is None and time.monotonic() < deadline:
        if future.job_id:
            (description,) = local_env.batch.describe_jobs(jobs=[future.job_id])["jobs"]
            stream = log_stream(description)
        time.sleep(0.05)
    assert stream, "the job never started"
    lines = list(follow(local_env.logs, local_env.log_group, stream, poll=0.1, until=future.done))
    assert lines == [f"tick {i}" for i in range(40)]
    assert future.result(timeout=10) is None


@pytest.mark.slow
def test_follow_job_waits_for_the_stream_and_ends_with_the_job(executor, local_env):
    future = executor.submit(chatty, 30)
    deadline = time.monotonic() + 60
    while future.job_id is None and time.monotonic() < deadline:
        time.sleep(0.02)  # submitted once the coalescing window closes
    lines = list(follow_job(local_env.batch, local_env.logs, future.job_id, local_env.log_group,
                            poll=0.1))
    assert lines == [f"tick {i}" for i in range(30)]
    assert future.result(timeout=10) is None
