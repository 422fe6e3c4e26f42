"""Progress (issue 14.4): Batch's counts per status, drawn from what the poller already read.

The rendering and the counting are pure and tested on tables (real TrackedJob and BatchFuture
objects, no emulator); the end-to-end tests run real maps on the emulator, draw to in-memory
streams (one that says it is a terminal, one that does not) and count every request the client
sends to the emulator and to storage, by thread.
"""

from __future__ import annotations

import collections
import gc
import io
import re
import sys
import threading

import pytest

import batchfutures
from batchfutures import BatchExecutor, BatchFuture
from batchfutures import progress as progress_module
from batchfutures.costs import usd_text
from batchfutures.jobs import TrackedJob
from batchfutures.progress import (
    UNSENT,
    _counts_of,
    _Display,
    render_counts,
    render_line,
)

THREAD_NAME = "batchfutures-progress"


class TerminalStream(io.StringIO):
    """An in-memory stream that says it is a terminal, as sys.stderr on a console does."""

    def isatty(self) -> bool:
        return True


class BrokenStream(TerminalStream):
    def write(self, text: str) -> int:
        raise OSError("the terminal went away")


def square(x):
    return x * x


def slow_square(x):
    import time

    time.sleep(0.2)
    return x * x


def wait_for(path):
    import os
    import time

    while not os.path.exists(path):
        time.sleep(0.05)
    return "released"


def progress_threads():
    return [thread for thread in threading.enumerate() if thread.name == THREAD_NAME]


@pytest.fixture
def no_tqdm(monkeypatch):
    monkeypatch.setitem(sys.modules, "tqdm", None)  # `import tqdm` now raises ImportError


# -- rendering: a table --------------------------------------------------------------------------
@pytest.mark.parametrize("counts, desc, line", [
    ({}, None, "0/0 children"),
    ({}, "square", "square: 0/0 children"),
    ({"SUCCEEDED": 4}, "square", "square: 4/4 children | SUCCEEDED 4"),
    # Batch's order whatever the dict's order; zero counts left out
    ({"FAILED": 1, "RUNNING": 2, "RUNNABLE": 3, "SUCCEEDED": 4, "STARTING": 0}, None,
     "5/10 children | RUNNABLE 3, RUNNING 2, SUCCEEDED 4, FAILED 1"),
    ({"SUBMITTED": 1, "PENDING": 2, "STARTING": 3}, "f",
     "f: 0/6 children | SUBMITTED 1, PENDING 2, STARTING 3"),
    # calls the client holds come first; a status this version does not know goes last
    ({"SUCCEEDED": 1, UNSENT: 2, "PAUSED": 1}, None, "1/4 children | unsent 2, SUCCEEDED 1, PAUSED 1"),
])
def test_render_line(counts, desc, line):
    assert render_line(counts, desc) == line


def test_render_counts_is_the_line_without_its_head():
    assert render_counts({"RUNNING": 1, "SUCCEEDED": 2}) == "RUNNING 1, SUCCEEDED 2"
    assert render_counts({}) == ""


# -- counting: what the poller recorded, read as Batch's counts ----------------------------------
def _show(job, index, status):
    """What the poller shows on a child's futures (jobs.TrackedJob.apply does the same)."""
    for future in job.children[index]:
        future._update(status)


def array_job(size, items_per_child=1, job_id="array-1"):
    children = [[BatchFuture() for _ in range(items_per_child)] for _ in range(size)]
    return TrackedJob(job_id, "file:///nowhere", children, array=True)


def test_counts_of_a_whole_array_are_its_status_summary():
    job = array_job(10)
    job.summary = {"RUNNABLE": 3, "RUNNING": 2, "SUCCEEDED": 4, "FAILED": 1, "STARTING": 0}
    assert _counts_of(job.futures()) == {"RUNNABLE": 3, "RUNNING": 2, "SUCCEEDED": 4, "FAILED": 1}


def test_counts_of_an_array_before_its_first_describe_are_all_submitted():
    job = array_job(5)
    assert _counts_of(job.futures()) == {"SUBMITTED": 5}


def test_counts_of_items_count_each_child_once():
    job = array_job(3, items_per_child=4)  # map_futures with chunksize=4: 12 futures, 3 children
    job.summary = {"RUNNING": 1, "SUCCEEDED": 2}
    assert _counts_of(job.futures()) == {"RUNNING": 1, "SUCCEEDED": 2}


def test_counts_of_part_of_an_array_come_from_each_child():
    # futures of 2 of a coalesced array's 4 children: the summary speaks of all 4, so each
    # given child's own status is counted instead
    job = array_job(4)
    job.summary = {"RUNNING": 1, "SUCCEEDED": 3}
    _show(job, 0, "SUCCEEDED")
    _show(job, 2, "RUNNING")
    given = job.children[0] + job.children[2]
    assert _counts_of(given) == {"SUCCEEDED": 1, "RUNNING": 1}


def test_counts_of_plain_jobs_unsent_and_cancelled_calls():
    plain = TrackedJob("plain-1", "file:///nowhere", [[BatchFuture()]], array=False)
    _show(plain, 0, "RUNNING")
    unsent, cancelled = BatchFuture(), BatchFuture()
    cancelled.cancel()  # cancelled before it was sent: Batch never hears of it
    array = array_job(2, job_id="array-2")
    array.summary = {"SUCCEEDED": 2}
    futures = plain.futures() + [unsent, cancelled] + array.futures()
    assert _counts_of(futures) == {"RUNNING": 1, UNSENT: 1, "SUCCEEDED": 2}


# -- drawing on each kind of stream --------------------------------------------------------------
def test_not_a_terminal_and_asked_writes_plain_lines_on_change(monkeypatch):
    monkeypatch.setattr(progress_module, "LINE_INTERVAL", 0.0)
    stream = io.StringIO()
    display = _Display.create(True, "f", stream)
    display.refresh({})  # nothing submitted yet: nothing written
    display.refresh({"RUNNABLE": 2})
    display.refresh({"RUNNABLE": 2})  # unchanged: no new line
    display.refresh({"RUNNING": 1, "SUCCEEDED": 1})
    display.close({"SUCCEEDED": 2})
    assert stream.getvalue().splitlines() == [
        "f: 0/2 children | RUNNABLE 2",
        "f: 1/2 children | RUNNING 1, SUCCEEDED 1",
        "f: 2/2 children | SUCCEEDED 2",
    ]
    assert "\r" not in stream.getvalue()


def test_not_a_terminal_lines_are_spaced_but_the_final_one_is_written():
    stream = io.StringIO()  # LINE_INTERVAL as shipped: a few seconds between lines
    display = _Display.create(True, "f", stream)
    display.refresh({"RUNNABLE": 2})
    display.refresh({"RUNNING": 2})
    display.close({"SUCCEEDED": 2})
    assert stream.getvalue().splitlines() == ["f: 0/2 children | RUNNABLE 2",
                                              "f: 2/2 children | SUCCEEDED 2"]


def test_auto_is_silent_off_a_terminal_and_false_is_off():
    assert _Display.create("auto", "f", io.StringIO()) is None
    assert _Display.create(False, "f", TerminalStream()) is None
    assert _Display.create("auto", "f", TerminalStream()) is not None


def test_an_unknown_show_value_is_refused():
    with pytest.raises(ValueError, match="progress must be True, False or 'auto'"):
        _Display.create("yes", None, io.StringIO())


def test_terminal_without_tqdm_rewrites_one_line(no_tqdm):
    stream = TerminalStream()
    display = _Display.create(True, "f", stream)
    display.refresh({"RUNNABLE": 10})
    display.refresh({"RUNNING": 1, "SUCCEEDED": 9})
    display.close({"SUCCEEDED": 10})
    text = stream.getvalue()
    assert text.count("\n") == 1 and text.endswith("\n")  # one line, redrawn in place
    frames = text[:-1].split("\r")[1:]
    assert [frame.rstrip() for frame in frames] == [
        "f: 0/10 children | RUNNABLE 10",
        "f: 9/10 children | RUNNING 1, SUCCEEDED 9",
        "f: 10/10 children | SUCCEEDED 10",
    ]
    assert len(frames[2]) == len(frames[1])  # the longer line before it is blanked out


def test_terminal_with_tqdm_draws_a_bar_with_the_counts():
    # tqdm is in the `test` extra (users get it with the `progress` extra)
    stream = TerminalStream()
    display = _Display.create(True, "f", stream)
    display.refresh({"RUNNING": 2, "SUCCEEDED": 2})
    display.close({"SUCCEEDED": 4})
    last = stream.getvalue().rstrip("\n").split("\r")[-1]
    assert last.startswith("f: 100%")
    assert "4/4" in last and "SUCCEEDED 4" in last


def test_a_broken_stream_never_raises(no_tqdm):
    display = _Display.create(True, "f", BrokenStream())
    display.refresh({"RUNNING": 1})
    display.close({"SUCCEEDED": 1})


def test_progress_is_callable_as_the_package_attribute_after_its_module_is_imported():
    # importing batchfutures.progress makes the package attribute the module: it still calls
    import batchfutures.progress  # noqa: F401

    done = BatchFuture()
    done.set_result(1)
    assert batchfutures.progress([done], show=False) == [done]
    assert progress_module([done], file=io.StringIO()) == [done]


def test_map_refuses_an_unknown_progress_value_before_submitting(executor):
    with pytest.raises(ValueError, match="progress must be"):
        executor.map(square, range(3), progress="yes")
    assert not progress_threads()


# -- end to end on the emulator ------------------------------------------------------------------
class CallLog:
    """Every emulator API call and storage call the client makes, as (thread name, operation)."""

    def __init__(self, monkeypatch, env) -> None:
        self.calls: collections.Counter = collections.Counter()
        emulator = env.batch
        for name in dir(type(emulator)):
            method = getattr(type(emulator), name)
            if getattr(method, "operation", None):  # the emulator's Batch API operations
                monkeypatch.setattr(emulator, name, self._wrap(getattr(emulator, name), method.operation))
        storage = env.storage
        for name in dir(type(storage)):
            if not name.startswith("_") and callable(getattr(type(storage), name)):
                monkeypatch.setattr(storage, name, self._wrap(getattr(storage, name), f"storage.{name}"))

    def _wrap(self, call, operation):
        def counted(*args, **kwargs):
            self.calls[(threading.current_thread().name, operation)] += 1
            return call(*args, **kwargs)
        return counted

    def on(self, thread_name):
        return {op: n for (name, op), n in self.calls.items() if name == thread_name}


@pytest.mark.slow
def test_progress_of_a_real_map_reaches_succeeded_and_sends_nothing(local_env, monkeypatch):
    log = CallLog(monkeypatch, local_env)
    with BatchExecutor(local_env) as ex:
        futures = ex.map_futures(square, range(8), chunksize=2)  # 4 children
        sent_by_submitting = log.on("MainThread")
        stream = io.StringIO()
        returned = batchfutures.progress(futures, file=stream, desc="square")
        # progress drew from this thread: it sent nothing to Batch or storage
        assert log.on("MainThread") == sent_by_submitting
        assert returned == futures and all(future.done() for future in futures)
        assert [future.result() for future in futures] == [x * x for x in range(8)]
        assert _counts_of(futures) == {"SUCCEEDED": 4}
        # the final line ends with the calls' estimated cost (future.cost summed, issue 33)
        assert stream.getvalue().splitlines()[-1] == \
            "square: 4/4 children | SUCCEEDED 4 | " + usd_text(sum(f.cost for f in futures))
    assert not progress_threads()


@pytest.mark.slow
def test_map_with_progress_sends_what_map_without_it_sends(local_env, monkeypatch, no_tqdm):
    with BatchExecutor(local_env) as ex:  # once per environment: the job definition looked up
        assert list(ex.map(square, range(2))) == [0, 1]
    log = CallLog(monkeypatch, local_env)
    stream = TerminalStream()  # a terminal: the thread redraws the line every REFRESH_INTERVAL
    monkeypatch.setattr(sys, "stderr", stream)
    with BatchExecutor(local_env) as ex:
        assert list(ex.map(slow_square, range(6), progress=True)) == [x * x for x in range(6)]
    with_progress = log.on("MainThread")
    assert log.on("batchfutures-poller").get("DescribeJobs")  # the log sees every thread
    assert not progress_threads()  # the map's end joined it
    log.calls.clear()
    with BatchExecutor(local_env) as ex:
        assert list(ex.map(slow_square, range(6))) == [x * x for x in range(6)]
    without_progress = log.on("MainThread")

    assert log.on(THREAD_NAME) == {}  # the drawing thread never asks Batch or storage
    assert with_progress == without_progress  # the consumer's thread sends the same either way
    assert with_progress.get("SubmitJob") == 1
    text = stream.getvalue()
    assert text.count("\r") >= 2 and text.endswith("\n")
    assert re.fullmatch(r"slow_square: 6/6 children \| SUCCEEDED 6 \| [~<]\$[0-9.,]+",
                        text.split("\r")[-1].rstrip())  # then the calls' cost (issue 33)


@pytest.mark.slow
def test_map_progress_ends_when_its_iterator_is_closed(executor, monkeypatch):
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    results = executor.map(slow_square, range(6), progress=True)
    assert next(results) == 0
    assert len(progress_threads()) == 1
    results.close()  # the rest are cancelled; close() joins the drawing thread
    assert not progress_threads()
    assert re.fullmatch(r"slow_square: \d/6 children \| .*", sys.stderr.getvalue().splitlines()[-1])


@pytest.mark.slow
def test_map_progress_ends_when_its_iterator_is_garbage_collected(executor, monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    release = tmp_path / "release"
    futures = executor.map_futures(wait_for, [str(release)])  # keeps the emulator busy
    results = executor.map(wait_for, [str(release)] * 2, progress=True)  # never iterated
    (thread,) = progress_threads()
    del results
    gc.collect()
    thread.join(10)
    assert not thread.is_alive()
    assert not futures[0].done()  # the thread ended with the iterator, not with the work
    release.touch()
    assert futures[0].result(60) == "released"


# -- warm pools (keepalive=): counted from the pool's own state ----------------------------------
@pytest.mark.parametrize("calls, workers, counts", [
    ([], [], {}),
    (["SUBMITTED"] * 3, [], {"unsent": 3}),  # in the pool's deque: not sent yet
    (["RUNNABLE"] * 5, ["RUNNING", "RUNNING"], {"RUNNING": 2, "RUNNABLE": 3}),  # one call a worker
    (["RUNNABLE"] * 2, ["RUNNING"] * 4, {"RUNNING": 2}),  # more workers than calls sent
    (["RUNNABLE"] * 3, ["STARTING", "SUBMITTED"], {"RUNNABLE": 3}),  # no worker is up yet
    (["RUNNABLE", "RUNNABLE", "SUBMITTED"], ["RUNNING", "SUCCEEDED"], {"unsent": 1, "RUNNING": 1,
                                                                       "RUNNABLE": 1}),
    (["SUCCEEDED", "FAILED", "SUCCEEDED", "RUNNABLE"], ["RUNNING"], {"SUCCEEDED": 2, "FAILED": 1,
                                                                     "RUNNING": 1}),
])
def test_warm_counts(calls, workers, counts):
    assert progress_module.warm_counts(calls, workers) == counts


@pytest.mark.slow
def test_progress_of_a_warm_map_counts_its_calls(local_env, no_tqdm):
    with BatchExecutor(local_env, keepalive=30, max_workers=2) as ex:
        futures = ex.map_futures(square, range(6), chunksize=2)  # 3 calls
        seen = _counts_of(futures)
        assert sum(seen.values()) == 3 and set(seen) <= {"unsent", "RUNNABLE", "RUNNING",
                                                         "SUCCEEDED"}
        stream = io.StringIO()
        batchfutures.progress(futures, file=stream, desc="square")
        assert [future.result() for future in futures] == [x * x for x in range(6)]
        assert _counts_of(futures) == {"SUCCEEDED": 3}
        assert stream.getvalue().splitlines()[-1] == "square: 3/3 children | SUCCEEDED 3"
        stream = TerminalStream()
        import contextlib

        with contextlib.redirect_stderr(stream):
            assert list(ex.map(square, range(4), chunksize=1, progress=True)) == [
                x * x for x in range(4)]
        assert "4/4 children | SUCCEEDED 4" in stream.getvalue()
    assert not progress_threads()
