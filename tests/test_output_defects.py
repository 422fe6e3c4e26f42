"""Defects found reviewing the output path (echo_output's order, records' lines, warm live)."""

import io
import logging
import os
import sys

import pytest

from batchfutures.worker import calls, logrecords


@pytest.fixture
def clean_logging():
    root = logging.getLogger()
    saved_handlers, saved_level = list(root.handlers), root.level
    root.setLevel(logging.INFO)
    yield
    root.handlers[:] = saved_handlers
    root.setLevel(saved_level)


def _log_of(stdout, stderr, body):
    """Run ``body`` under a Capture writing to ``stdout`` and ``stderr`` (the container's log)."""
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = stdout, stderr
    capture = calls.Capture(True)
    try:
        body()
        capture.take()
    finally:
        capture.close()
        sys.stdout, sys.stderr = saved


def _partial_then_record(stream_name):
    def body():
        print("Loading", end="", file=getattr(sys, stream_name), flush=True)
        logging.getLogger("glued_app").warning("a record")
        print(" done", file=getattr(sys, stream_name))
    return body


def _record_lines_start_lines(text):
    lines = text.splitlines()
    assert any(logrecords.LINE_PREFIX in line for line in lines)
    return all(line.startswith(logrecords.LINE_PREFIX) for line in lines
               if logrecords.LINE_PREFIX in line)


def test_a_record_after_a_partial_line_on_stderr_starts_its_own_line(clean_logging):
    # a progress bar (tqdm writes "\r..." without a newline) or print(..., end="") on stderr,
    # then a record: its line was glued to that text, so the client showed its JSON as output
    # (a line not starting with the prefix is not a record's) and never replayed it
    log = io.StringIO()
    _log_of(io.StringIO(), log, _partial_then_record("stderr"))
    assert _record_lines_start_lines(log.getvalue()), log.getvalue()
    assert "Loading" in log.getvalue() and " done" in log.getvalue()


def test_a_record_after_a_partial_line_on_a_shared_stdout_starts_its_own_line(clean_logging,
                                                                               tmp_path):
    # warm live: stderr is stdout's pipe (os.dup2), and print(..., flush=True) leaves it open
    path = tmp_path / "log"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT)
    second = os.dup(fd)
    out = io.TextIOWrapper(io.FileIO(fd, "w"), line_buffering=True)
    err = io.TextIOWrapper(io.FileIO(second, "w"), line_buffering=True)
    try:
        _log_of(out, err, _partial_then_record("stdout"))
    finally:
        out.close()
        err.close()
    text = path.read_text()
    assert _record_lines_start_lines(text), text


def test_full_lines_get_no_empty_line_before_a_record(clean_logging):
    log = io.StringIO()

    def body():
        print("whole", file=sys.stderr)
        logging.getLogger("glued_app").warning("a record")
        logging.getLogger("glued_app").warning("another")
    _log_of(io.StringIO(), log, body)
    assert "" not in log.getvalue().splitlines()


# -- warm live: a marker ends the line a call left open ------------------------------------------
def _ends_without_newline(_):
    print("progress 99%", end="", file=sys.stderr, flush=True)


def _logs_first(_):
    logging.getLogger("glued_app").warning("first thing")
    print("after the record")


@pytest.mark.slow
def test_a_record_first_in_a_warm_call_after_one_left_a_line_open_adds_no_empty_line(tmp_path):
    from batchfutures import BatchExecutor, LocalEnvironment, jobdetail, warmlive
    from batchfutures.logs import lines_after, log_group_of

    env = LocalEnvironment(tmp_path / "work", max_vcpus=2)
    try:
        with BatchExecutor(env, keepalive=30, max_workers=1, echo_output="live") as ex:
            ex.submit(_ends_without_newline, 0).result(timeout=120)
            ex.submit(_logs_first, 1).result(timeout=120)
            pool = next(iter(ex._session.warm_pools.values()))
            token, (worker,) = pool.live.token, list(pool.workers)
        description = env.batch.describe_jobs(jobs=[worker])["jobs"][0]
        lines = list(lines_after(env.logs, log_group_of(description, env.log_group),
                                 jobdetail.log_stream(description)))
    finally:
        env.emulator.close()
    second = [line for number, line in warmlive.CallSplitter(token).split(lines) if number == 1]
    # the end marker of call 0 ended its open line: call 1's record needs no newline before it
    assert len(second) == 2 and second[0].startswith(logrecords.LINE_PREFIX), second
    assert second[1] == "after the record"
