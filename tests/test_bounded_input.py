"""Bounded input (issue 19, point 4): pagination stops on a repeated token or a page limit, the
CLI streams a log, a log tail in an error message is cut, and no setting's value is echoed.

Real parts: the emulator's LogsService over a log file, a LocalEnvironment job for the CLI and
for a failed job's tail, `classify_failure`, `JobSettings`. Stand-ins only where nothing real
can misbehave: the emulator's own ListJobs and GetLogEvents never return a token twice, so a
small boto3-shaped client object (`LoopingBatch`, `LoopingLogs`) plays a service whose tokens
loop or never end.
"""

import io
import os
import sys
import tracemalloc

import pytest

from batchfutures import BatchExecutor, LocalEnvironment, batchapi, logs
from batchfutures.cli import app as cli
from batchfutures.emulator.logservice import LogsService
from batchfutures.errors import LOG_TAIL_BYTES, ConfigurationError, JobFailedError, classify_failure
from batchfutures.settings import JobSettings

GROUP, STREAM = "/aws/batch/job", "def/default/task"


class LoopingBatch:
    """ListJobs / DescribeJobDefinitions whose nextToken is ``tokens(call number)``."""

    def __init__(self, tokens):
        self.tokens = tokens
        self.calls = []

    def list_jobs(self, **request):
        self.calls.append(request)
        assert len(self.calls) < 1000, "pagination never ended"
        n = len(self.calls)
        return {"jobSummaryList": [{"jobId": f"j:{n}", "jobName": "x"}], "nextToken": self.tokens(n)}

    def describe_job_definitions(self, **request):
        self.calls.append(request)
        assert len(self.calls) < 1000, "pagination never ended"
        return {"jobDefinitions": [], "nextToken": self.tokens(len(self.calls))}


class LoopingLogs:
    """GetLogEvents whose forward and backward tokens are ``tokens(call number)``."""

    def __init__(self, tokens):
        self.tokens = tokens
        self.calls = []

    def get_log_events(self, **params):
        self.calls.append(params)
        assert len(self.calls) < 1000, "the read never ended"
        token = self.tokens(len(self.calls))
        return {"events": [{"message": f"line {len(self.calls)}"}],
                "nextForwardToken": token, "nextBackwardToken": token}


# -- pagination ----------------------------------------------------------------------------------
def test_a_repeated_next_token_raises_after_two_calls():
    client = LoopingBatch(lambda n: "the-same-token")
    seen = []
    with pytest.raises(batchapi.PaginationError, match="already followed"):
        for child in batchapi.list_children(client, "job", "FAILED"):
            seen.append(child["jobId"])
    assert len(client.calls) == 2
    assert seen == ["j:1", "j:2"]  # what was read was yielded; the error says it is incomplete
    assert client.calls[1]["nextToken"] == "the-same-token"


def test_a_token_loop_longer_than_one_page_is_caught_too():
    client = LoopingBatch(lambda n: ["a", "b", "c"][(n - 1) % 3])
    with pytest.raises(batchapi.PaginationError):
        list(batchapi.list_children(client, "job", "FAILED"))
    assert len(client.calls) == 4  # a, b, c, then a again


def test_pagination_stops_at_its_page_limit(monkeypatch):
    client = LoopingBatch(lambda n: f"token-{n}")  # always one more page
    with pytest.raises(batchapi.PaginationError, match="limit is 5"):
        list(batchapi.list_children(client, "job", "FAILED", max_pages=5))
    assert len(client.calls) == 5
    assert batchapi.MAX_PAGES == 10_000  # the documented default
    monkeypatch.setattr(batchapi, "MAX_PAGES", 3)  # the default is read at each read
    other = LoopingBatch(lambda n: f"token-{n}")
    with pytest.raises(batchapi.PaginationError):
        list(batchapi.paginate(other.describe_job_definitions, jobDefinitionName="d"))
    assert len(other.calls) == 3


class PagedEC2:
    """EC2's DescribeInstanceTypes (NextToken, capitalised) over ``pages`` of (type, MiB), the
    token after page n being ``tokens(n)``."""

    def __init__(self, pages, tokens):
        self.pages, self.tokens, self.calls = pages, tokens, []

    def describe_instance_types(self, **request):
        self.calls.append(request)
        assert len(self.calls) < 1000, "pagination never ended"
        n = len(self.calls)
        page = self.pages[min(n, len(self.pages)) - 1]
        token = self.tokens(n)
        return {"InstanceTypes": [{"InstanceType": name, "MemoryInfo": {"SizeInMiB": mib}}
                                  for name, mib in page], **({"NextToken": token} if token else {})}


def test_ec2_instance_types_are_read_page_after_page_and_a_loop_stops():
    from batchfutures.environments import instance_memory_mib

    pages = [[("c5.large", 4096)], [("c5.24xlarge", 196608)]]
    ec2 = PagedEC2(pages, lambda n: "t1" if n == 1 else None)
    assert instance_memory_mib(ec2, (), ("c5",)) == 196608  # the second page's counts too
    assert ec2.calls[1]["NextToken"] == "t1" and ec2.calls[1]["Filters"] == ec2.calls[0]["Filters"]
    looping = PagedEC2(pages, lambda n: "again")
    with pytest.raises(batchapi.PaginationError, match="already followed"):
        instance_memory_mib(looping, ("c5.large",), ())
    assert len(looping.calls) == 2


def test_the_exactly_once_look_up_does_not_follow_a_loop():
    client = LoopingBatch(lambda n: "again")
    with pytest.raises(batchapi.PaginationError):
        batchapi.submission_jobs(client, {"jobQueue": "q", "jobName": "x",
                                          "tags": {batchapi.SUBMISSION_TAG: "t"}})
    assert len(client.calls) == 2


def test_log_reads_stop_on_a_token_loop_and_at_the_page_limit(monkeypatch):
    looping = LoopingLogs(lambda n: "f/1" if n % 2 else "f/2")  # f/1, f/2, f/1: a loop
    with pytest.raises(batchapi.PaginationError):
        list(logs.iter_all(looping, GROUP, STREAM))
    assert len(looping.calls) == 3
    backwards = LoopingLogs(lambda n: "b/1" if n % 2 else "b/2")
    with pytest.raises(batchapi.PaginationError):
        logs.tail(backwards, GROUP, STREAM, lines=100)
    monkeypatch.setattr(batchapi, "MAX_PAGES", 4)
    endless = LoopingLogs(lambda n: f"f/{n}")
    with pytest.raises(batchapi.PaginationError, match="limit is 4"):
        list(logs.iter_all(endless, GROUP, STREAM))
    assert len(endless.calls) == 4


def test_the_same_forward_token_still_ends_a_read_and_following_goes_on(tmp_path):
    """GetLogEvents signals the end of a stream with the token it was sent: not a loop."""
    path = tmp_path / STREAM
    path.parent.mkdir(parents=True)
    path.write_text("one\ntwo\n")
    service = LogsService(tmp_path)
    cursor = logs.Cursor()
    assert list(logs.lines_after(service, GROUP, STREAM, cursor)) == ["one", "two"]
    assert list(logs.lines_after(service, GROUP, STREAM, cursor)) == []  # the end, no error
    with path.open("a") as handle:
        handle.write("three\n")
    assert list(logs.lines_after(service, GROUP, STREAM, cursor)) == ["three"]
    assert logs.read_all(service, GROUP, STREAM) == ["one", "two", "three"]
    assert logs.tail(service, GROUP, STREAM, lines=10) == ["one", "two", "three"]


# -- the CLI streams -----------------------------------------------------------------------------
def many_lines(count):
    out = os.fdopen(os.dup(1), "w")
    for i in range(count):
        out.write(f"line {i:06d} {'x' * 50}\n")
    out.close()
    return count


class CountingSink(io.TextIOBase):
    """stdout that counts what it is given and keeps only the last line."""

    def __init__(self):
        self.chars = 0
        self.last = ""

    def write(self, text):
        self.chars += len(text)
        if text.strip():
            self.last = text
        return len(text)


@pytest.mark.slow
def test_cli_logs_streams_a_big_log_with_bounded_memory(tmp_path, monkeypatch):
    workdir = tmp_path / "work"
    count = 200_000  # about 12 MB of log
    with BatchExecutor(LocalEnvironment(workdir), echo_output=False) as executor:
        future = executor.submit(many_lines, count)
        assert future.result(timeout=120) == count
        job_id = future.job_id
    sink = CountingSink()
    monkeypatch.setattr(sys, "stdout", sink)
    tracemalloc.start()
    try:
        code = cli.main(["--workdir", str(workdir), "logs", job_id])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    monkeypatch.undo()
    assert code == 0
    assert sink.last.startswith(f"line {count - 1:06d}")
    assert sink.chars >= count * 62
    # the whole log held as a list of lines peaks near 40 MB; one page (10,000 events) is held
    assert peak < 8 * 1024 * 1024, f"peak {peak:,} bytes while printing a {sink.chars:,} byte log"


# -- log tails in messages -----------------------------------------------------------------------
FAILED = {"jobId": "j", "status": "FAILED", "statusReason": "Essential container in task exited",
          "container": {"exitCode": 3}}


def test_a_ten_megabyte_log_tail_is_cut_to_64_kib_saying_so():
    tail = "\n".join(f"{i:07d} " + "y" * 92 for i in range(100_000))  # 10 MB
    error = classify_failure(FAILED, log_tail=tail)
    assert isinstance(error, JobFailedError)
    message = str(error)
    assert len(message.encode()) < LOG_TAIL_BYTES + 2048
    assert len(error.log_tail.encode()) < LOG_TAIL_BYTES + 200
    assert "bytes of the log cut" in message
    assert message.endswith(tail[-200:])  # the last lines are the ones kept
    kept = message.split("follow, future.log() has all of it]\n", 1)[1]
    assert kept.startswith("0099") and tail.endswith(kept)  # from a line's start
    small = classify_failure(FAILED, log_tail="just this")
    assert str(small).endswith("just this") and "cut" not in str(small)


def huge_lines_then_exit():
    out = os.fdopen(os.dup(1), "w")
    for i in range(20):
        out.write(f"{i:02d}" + "z" * 500_000 + "\n")  # 20 lines, 10 MB
    out.close()
    os._exit(3)


@pytest.mark.slow
def test_a_failed_jobs_error_carries_at_most_64_kib_of_its_log(tmp_path):
    with BatchExecutor(LocalEnvironment(tmp_path / "work"), echo_output=False) as executor:
        future = executor.submit(huge_lines_then_exit)
        error = future.exception(timeout=120)
    assert isinstance(error, JobFailedError), error
    assert len(str(error).encode()) < LOG_TAIL_BYTES + 4096
    assert "bytes of the log cut" in str(error)
    assert error.log_tail.endswith("z" * 1000)


# -- no value in a settings error ----------------------------------------------------------------
SECRET = "arn-ish-secret-value-123"


@pytest.mark.parametrize("kwargs", [
    {"secrets": {"X": SECRET}},
    {"secrets": {"X": [SECRET]}},
    {"environment": {"X": [SECRET]}},
    {"environment": {SECRET.upper().replace("-", "_"): "AKIAABCDEFGHIJKLMNOP"}},
    {"tags": {"team": {"v": SECRET}}},
    {"tags": {("k", SECRET): "v"}},
    {"share_id": 12345},
    {"memory": SECRET},
    {"vcpus": SECRET},
    {"timeout": SECRET},
    {"retries": SECRET},
    {"gpus": SECRET},
])
def test_a_refused_setting_names_itself_never_its_value(kwargs):
    with pytest.raises(ConfigurationError) as caught:
        JobSettings.from_kwargs(**kwargs)
    message = str(caught.value)
    assert SECRET not in message and "AKIAABCDEFGHIJKLMNOP" not in message
    assert "12345" not in message
    assert next(iter(kwargs)) in message  # the setting is named


def test_numbers_out_of_range_are_still_shown():
    with pytest.raises(ConfigurationError, match="priority=10000"):
        JobSettings.from_kwargs(priority=10_000)
    with pytest.raises(ConfigurationError, match="retries=11"):
        JobSettings.from_kwargs(retries=11)
    with pytest.raises(ConfigurationError, match="secrets"):
        JobSettings.from_kwargs(secrets={"X": SECRET})
