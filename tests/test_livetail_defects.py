"""echo_output="live": defects found in review (batchfutures.livetail), each shown failing first.

- The emulator stamps every event of a stream with its file's modification time, which moves in
  coarse steps: a line equal to the last one read, written before the file's time moved on, was
  taken for that line again and never shown. A read that goes on from its forward token brings
  only lines not read before: with GetLogEvents as the one reader nothing is de-duplicated.
- One child whose GetLogEvents always fails (a log group the client's policy may not read: the
  definition's own awslogs-group) stopped every other child's live output for the rest of the
  run: its error left the round before the others' reads, round after round.
- A running job with no log stream of its own (a multi-node job: its nodes have the streams)
  was taken as streamed, so its call's output was neither streamed nor echoed as it resolved.
- ``fresh`` copied what was seen for every part of a read (quadratic: a 200,000-line catch-up
  read of a chatty call took seconds of the round thread, under the lock the session threads
  wait on), and a read's counts kept every line of it: the read was held whole after all.
- A script that ends without shutting its executor down: the interpreter's exit waits for its
  calls, but the LiveTail never read them to their end (no last round), and a streamed call is
  not echoed as it resolves: its last lines were lost.
- A call Batch retried between two rounds (the emulator starts the next attempt at once) stayed
  followed on its first attempt's stream: the next attempt's lines were never shown, neither
  streamed nor echoed as it resolved.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
import uuid
from collections import Counter
from typing import Any, Dict, List

import pytest
import s3server
from botocore.awsrequest import AWSResponse

from batchfutures import BatchExecutor, batchapi, livetail
from batchfutures.environments import AWSBatchEnvironment

moto_server, aws_env = s3server.moto_server, s3server.aws_env  # fixtures


def lines_of(written: List[str]) -> List[str]:
    return [line for text in written for line in text.splitlines()]


def test_an_equal_line_written_in_the_same_instant_as_the_last_read_one_shows(local_env):
    """GetLogEvents on the emulator: the file's time stays the same (one tick of the kernel's
    coarse clock) across a read; the equal line written after it still shows."""
    stream = "bf-review/default/equal-lines"
    path = local_env.logs.folder / stream
    path.parent.mkdir(parents=True, exist_ok=True)
    tick = (time.time_ns() // 1_000_000) * 1_000_000  # a whole millisecond, as stamps are
    written: List[str] = []
    tail = livetail.LiveTail(local_env, lambda: [], write=written.append)
    tail.follow("job:0", local_env.log_group, stream)
    tail.set_running({"job:0"})
    path.write_text("-----\n")
    os.utime(path, ns=(tick, tick))
    tail.read_round()
    with open(path, "a") as handle:
        handle.write("-----\n")
    os.utime(path, ns=(tick, tick))  # the same tick: written in the instant of the read
    tail.read_round()
    assert lines_of(written) == ["[job:0] -----", "[job:0] -----"]


REGION = "us-east-1"


def deny_group(client: Any, group: str) -> None:
    """What CloudWatch answers a policy without logs:GetLogEvents on ``group`` (moto does not
    scope its IAM checks to a log group): botocore's own parsing of a 400 AccessDeniedException,
    sent for that group's reads only; every other request reaches moto."""

    def before_send(request: Any, **_: Any) -> Any:
        body = request.body.decode() if isinstance(request.body, bytes) else str(request.body or "")
        if f'"logGroupName": "{group}"' not in body:
            return None
        return AWSResponse(request.url, 400, {"x-amzn-RequestId": "denied",
                                              "Content-Type": "application/x-amz-json-1.1"},
                           _Raw(b'{"__type":"AccessDeniedException","message":"User is not '
                                b'authorized to perform: logs:GetLogEvents"}'))

    client.meta.events.register("before-send.cloudwatch-logs.GetLogEvents", before_send)


class _Raw:
    def __init__(self, content: bytes) -> None:
        self.content = content

    def stream(self, **_: Any) -> Any:
        yield self.content


def test_a_child_whose_reads_fail_holds_up_no_other(aws_env):
    """The thread's rounds (a custom endpoint: GetLogEvents): the child of the denied group
    ends first and its read fails each time; the other child's lines still show, and both are
    dropped once read."""
    run = uuid.uuid4().hex[:8]
    env = AWSBatchEnvironment("q", "some-bucket", "worker-definition:1", region_name=REGION)
    logs = env.logs
    names: Dict[str, str] = {"denied": f"/bf-review/denied-{run}", "allowed": f"/bf-review/ok-{run}"}
    for group in names.values():
        logs.create_log_group(logGroupName=group)
        logs.create_log_stream(logGroupName=group, logStreamName="d/default/t")
        logs.put_log_events(logGroupName=group, logStreamName="d/default/t", logEvents=[
            {"timestamp": int(time.time() * 1000), "message": "one"}])
    deny_group(logs, names["denied"])
    written: List[str] = []
    tail = livetail.LiveTail(env, lambda: [], write=written.append, interval=0.05)
    tail.follow("denied:0", names["denied"], "d/default/t")
    tail.follow("allowed:0", names["allowed"], "d/default/t")
    tail.start()
    tail.stop()  # a last round at least: both children ended (no job outstanding)
    assert tail.reader == livetail.POLL
    assert lines_of(written) == ["[allowed:0] one"]
    assert not tail._followed


def _print_then_wait(flag: str) -> int:
    print("hello from a node", flush=True)
    deadline = time.time() + 120
    while not os.path.exists(flag) and time.time() < deadline:
        time.sleep(0.05)
    return 1


@pytest.mark.slow
def test_a_multinode_calls_output_is_echoed_as_it_resolves(local_env, tmp_path, capsys):
    """Its job, RUNNING, has no stream (its nodes have): a round sees it running (one run here,
    on this thread, once Batch says RUNNING), and its output is echoed when it resolves."""
    flag = tmp_path / "go"
    with BatchExecutor(local_env, echo_output="live") as ex:
        future = ex.with_settings(nodes=2).submit(_print_then_wait, str(flag))
        deadline = time.monotonic() + 120
        while batchapi.describe_jobs(local_env.batch, [future.job_id])[0]["status"] != "RUNNING":
            assert time.monotonic() < deadline, "the job did not start"
            time.sleep(0.05)
        ex._session.live_tail.round()
        flag.write_text("go")
        assert future.result(timeout=120) == [1, 1]
    assert capsys.readouterr().out.count("hello from a node") == 2  # each node's call


def _event(ts: int, message: str) -> Dict[str, Any]:
    return {"timestamp": ts, "ingestionTime": ts + 5, "message": message}


def test_fresh_keeps_a_long_reads_lines_for_its_window_only_and_copies_nothing():
    """A read of three windows' lines, part by part: what is kept (seen, and the read's counts)
    is about one window's, and ``seen`` is updated where it is (no copy a part)."""
    seen: Dict[Any, int] = {}
    counts: Counter = Counter()
    per_window, shown = 1000, 0
    step = livetail.SEEN_WINDOW_MS // per_window
    for part in range(30):
        events = [_event((part * 100 + i) * step, f"line {part * 100 + i}") for i in range(100)]
        new, after = livetail.fresh(events, seen, counts)
        assert after is seen
        shown += len(new)
    assert shown == 3000
    assert len(seen) <= per_window + 100 and len(counts) <= per_window + 100
    again, _ = livetail.fresh([_event(2999 * step, "line 2999")], seen)  # streamed as well
    assert again == []


@pytest.mark.slow
def test_a_streamed_calls_last_lines_show_at_interpreter_exit(tmp_path):
    """The call is followed (its first line shown), the rounds then wait an hour; its last
    line, printed after that, shows only if the exit reads it to its end."""
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(f"""
        import os, sys, time
        from batchfutures import BatchExecutor

        def talk(flag):
            print("first", flush=True)
            deadline = time.time() + 120
            while not os.path.exists(flag) and time.time() < deadline:
                time.sleep(0.05)
            print("last", flush=True)
            return 1

        ex = BatchExecutor(echo_output="live")
        tail = ex._session.live_tail
        rounds = []
        plain_round = tail.round
        def counted(final=False):
            plain_round(final)
            rounds.append(final)
        tail.round = counted  # the rounds are counted, not changed
        future = ex.submit(talk, {str(tmp_path / "go")!r})
        deadline = time.time() + 120
        while tail.counts["lines by GetLogEvents"] < 1 and time.time() < deadline:
            time.sleep(0.05)
        tail._interval = 3600  # no round after the next one (until the exit's)
        seen = len(rounds)
        while len(rounds) <= seen and time.time() < deadline:
            time.sleep(0.05)
        open({str(tmp_path / "go")!r}, "w").close()
        print("script ends", flush=True)
    """))
    environment = {**os.environ, "BATCHFUTURES_WORKDIR": str(tmp_path / "work")}
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=environment,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    shown = [line.split("] ", 1)[1] for line in done.stdout.splitlines() if line.startswith("[")]
    assert shown == ["first", "last"], done.stdout


def _fail_once(folder: str) -> int:
    attempt = os.environ.get("AWS_BATCH_JOB_ATTEMPT")
    print(f"attempt {attempt} starts", flush=True)
    deadline = time.time() + 120
    while not os.path.exists(os.path.join(folder, f"go{attempt}")) and time.time() < deadline:
        time.sleep(0.05)
    if attempt == "1":
        os._exit(3)  # a crash: Batch's next attempt
    print(f"attempt {attempt} ends", flush=True)
    return 1


@pytest.mark.slow
def test_a_call_retried_between_two_rounds_shows_its_next_attempt(local_env, tmp_path, capsys):
    written: List[str] = []

    def shown_until(line: str) -> None:
        deadline = time.monotonic() + 60
        while not any(text.endswith(f"] {line}") for text in lines_of(written)):
            written.append(capsys.readouterr().out)
            assert time.monotonic() < deadline, f"{line!r} was not shown: {written}"
            time.sleep(0.05)

    with BatchExecutor(local_env, echo_output="live", retries=2) as ex:
        future = ex.submit(_fail_once, str(tmp_path))
        shown_until("attempt 1 starts")
        (tmp_path / "go1").touch()
        shown_until("attempt 2 starts")  # streamed while it runs
        (tmp_path / "go2").touch()
        assert future.result(timeout=120) == 1
    written.append(capsys.readouterr().out)
    lines = [line.split("] ", 1)[1] for line in lines_of(written) if line.startswith("[")]
    assert lines == ["attempt 1 starts", "attempt 2 starts", "attempt 2 ends"]
