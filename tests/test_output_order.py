"""A call's prints and its logging records reach the client in the order the call made them
(issue 34, point 2), as a ProcessPoolExecutor's worker writes them to the terminal as they happen.

The worker keeps, with each item's stdout, stderr and records, runs of ``[source, count]``
(calls._Order, cut to what was kept: calls.tail_runs); the client turns them back into writes and
replays (outputorder.steps, pure), falling back to stdout, stderr, records for anything malformed.
"""

import io
import logging
import os
import subprocess
import sys
import time
import warnings

import pytest

from batchfutures import BatchExecutor, outputorder, wire
from batchfutures.outputorder import MAX_RUNS, RECORDS, STDERR, STDOUT
from batchfutures.worker import calls, logrecords

slow = pytest.mark.slow

R1, R2, R3 = ({"name": "app", "levelno": 20, "msg": f"r{i}"} for i in (1, 2, 3))


@pytest.fixture
def clean_logging():
    root = logging.getLogger()
    saved_handlers, saved_level = list(root.handlers), root.level
    yield
    root.handlers[:] = saved_handlers
    root.setLevel(saved_level)


def test_the_worker_and_the_client_read_the_same_sources():
    assert (calls._STDOUT, calls._STDERR, calls._RECORDS) == (STDOUT, STDERR, RECORDS)
    assert calls.MAX_RUNS == MAX_RUNS


# -- the client: steps --------------------------------------------------------------------------
GROUPED = [(STDOUT, "a\nb\n"), (STDERR, "E\n"), (RECORDS, [R1, R2])]


@pytest.mark.parametrize("out, err, records, order, expected", [
    # interleaved as made
    ("a\nb\n", "E\n", [R1, R2], [[0, 2], [2, 1], [1, 2], [0, 2], [2, 1]],
     [(STDOUT, "a\n"), (RECORDS, [R1]), (STDERR, "E\n"), (STDOUT, "b\n"), (RECORDS, [R2])]),
    # one source only
    ("a\nb\n", "", [], [[0, 4]], [(STDOUT, "a\nb\n")]),
    ("", "", [R1, R2, R3], [[2, 3]], [(RECORDS, [R1, R2, R3])]),
    # no order (an entry written before it was kept): grouped
    ("a\nb\n", "E\n", [R1, R2], None, GROUPED),
    # the runs cover the end: what was kept before them (cut from the front, the cut note) first
    ("a\nb\n", "E\n", [R1, R2], [[1, 2], [0, 2], [2, 1]],
     [(STDOUT, "a\n"), (RECORDS, [R1]), (STDERR, "E\n"), (STDOUT, "b\n"), (RECORDS, [R2])]),
    ("xa\n", "", [R1], [[0, 2], [2, 1], [0, 1]],
     [(STDOUT, "xa"), (RECORDS, [R1]), (STDOUT, "\n")]),  # a prefix joins the first run
    # malformed or hostile: grouped, never raised
    ("a\nb\n", "E\n", [R1, R2], "0,2", GROUPED),
    ("a\nb\n", "E\n", [R1, R2], [], GROUPED),
    ("a\nb\n", "E\n", [R1, R2], [[0, 5]], GROUPED),  # more than was kept
    ("a\nb\n", "E\n", [R1, R2], [[2, 3]], GROUPED),
    ("a\nb\n", "E\n", [R1, R2], [[3, 1]], GROUPED),  # no such source
    ("a\nb\n", "E\n", [R1, R2], [[-1, 1]], GROUPED),
    ("a\nb\n", "E\n", [R1, R2], [[True, 1]], GROUPED),
    ("a\nb\n", "E\n", [R1, R2], [[1.0, 1]], GROUPED),
    ("a\nb\n", "E\n", [R1, R2], [["0", 1]], GROUPED),
    ("a\nb\n", "E\n", [R1, R2], [[[0], 1]], GROUPED),
    ("a\nb\n", "E\n", [R1, R2], [[0, 0]], GROUPED),
    ("a\nb\n", "E\n", [R1, R2], [[0, -2], [0, 6]], GROUPED),
    ("a\nb\n", "E\n", [R1, R2], [[0, 1.5]], GROUPED),
    ("a\nb\n", "E\n", [R1, R2], [[0, 1, 2]], GROUPED),
    ("a\nb\n", "E\n", [R1, R2], [[0]], GROUPED),
    ("a\nb\n", "E\n", [R1, R2], [None], GROUPED),
    ("a\nb\n", "E\n", [R1, R2], {"0": 2}, GROUPED),
    ("a\nb\n", "E\n", [R1, R2], [[0, 1]] * (MAX_RUNS + 1), GROUPED),  # too long: not read
    (7, ["E"], "records", [[0, 1]], []),  # nothing of the right type
])
def test_steps(out, err, records, order, expected):
    assert outputorder.steps(out, err, records, order) == expected


def test_steps_of_a_long_order_within_the_cap():
    out = "o" * MAX_RUNS
    records = [dict(R1, msg=str(i)) for i in range(MAX_RUNS)]
    order = [[STDOUT, 1], [RECORDS, 1]] * (MAX_RUNS // 2)
    parts = outputorder.steps(out, "", records, order)
    # the first half of each interleaved, the rest (before the runs) grouped first
    assert parts[:2] == [(STDOUT, "o" * (MAX_RUNS // 2)), (RECORDS, records[:MAX_RUNS // 2])]
    assert parts[2:4] == [(STDOUT, "o"), (RECORDS, [records[MAX_RUNS // 2]])]
    assert len(parts) == 2 + MAX_RUNS


# -- the worker: tail_runs ----------------------------------------------------------------------
@pytest.mark.parametrize("runs, kept, expected", [
    ([[0, 3], [2, 1], [1, 2]], (3, 2, 1), [[0, 3], [2, 1], [1, 2]]),  # all kept
    ([[0, 3], [2, 1], [0, 5]], (6, 0, 1), [[0, 1], [2, 1], [0, 5]]),  # 2 chars cut from the front
    ([[0, 3], [2, 1], [0, 5]], (4, 0, 1), [[2, 1], [0, 4]]),  # a run cut whole
    ([[0, 3], [2, 1], [0, 5]], (4, 0, 0), [[0, 4]]),  # a record cut: the runs beside it join
    ([[2, 2], [1, 1], [2, 2]], (0, 1, 3), [[2, 1], [1, 1], [2, 2]]),
    ([[0, 3]], (5, 0, 0), [[0, 3]]),  # more kept than the runs cover (runs past the cap)
    ([], (1, 1, 1), []),
])
def test_tail_runs(runs, kept, expected):
    assert calls.tail_runs(runs, kept) == expected


# -- the worker's Capture, read back by the client ----------------------------------------------
def _capture_one(body):
    """Run ``body`` under a Capture; its entry."""
    capture = calls.Capture(True)
    try:
        body()
        return capture.take()
    finally:
        capture.close()


def _replayed(entry, monkeypatch):
    """What echo_output makes of ``entry`` on one combined terminal: stdout, stderr and the root
    logger's handler all write to the same stream."""
    terminal = io.StringIO()
    monkeypatch.setattr(sys, "stdout", terminal)
    monkeypatch.setattr(sys, "stderr", terminal)
    handler = logging.StreamHandler(terminal)
    handler.setFormatter(logging.Formatter("%(levelname)s:%(name)s:%(message)s"))
    logging.getLogger().handlers[:] = [handler]
    wire.echo_output(entry)
    return terminal.getvalue()


def test_capture_keeps_the_order_of_prints_records_and_warnings(clean_logging, monkeypatch):
    logging.getLogger().setLevel(logging.INFO)
    log = logging.getLogger("ordered_app")

    def call():
        print("one")
        log.info("two")
        print("three", file=sys.stderr)
        # as warnings.showwarning writes it (pytest records the real ones; the test against
        # ProcessPoolExecutor below warns for real)
        sys.stderr.write(warnings.formatwarning("four", UserWarning, "script.py", 9, line=""))
        print("five")
        log.warning("six")
        log.warning("seven")
        print("eight")

    entry = _capture_one(call)
    assert len(entry) == 6 and entry[5] == [[0, 4], [2, 1], [1, 6 + len(
        "script.py:9: UserWarning: four\n")], [0, 5], [2, 2], [0, 6]]
    assert _replayed(entry, monkeypatch).splitlines() == [
        "one", "INFO:ordered_app:two", "three", "script.py:9: UserWarning: four", "five",
        "WARNING:ordered_app:six", "WARNING:ordered_app:seven", "eight"]
    grouped = entry[:5]  # as an older entry: stdout, stderr, then the records
    assert _replayed(grouped, monkeypatch).splitlines() == [
        "one", "five", "eight", "three", "script.py:9: UserWarning: four",
        "INFO:ordered_app:two", "WARNING:ordered_app:six", "WARNING:ordered_app:seven"]


def test_one_source_keeps_no_order(clean_logging):
    assert _capture_one(lambda: print("only this")) == ["only this\n", "", 0, 0]
    logging.getLogger().setLevel(logging.INFO)
    entry = _capture_one(lambda: logging.getLogger("ordered_app").info("only a record"))
    assert len(entry) == 5 and entry[:4] == ["", "", 0, 0]


def test_cut_output_keeps_its_order_with_the_records(clean_logging, monkeypatch):
    logging.getLogger().setLevel(logging.INFO)
    log = logging.getLogger("ordered_app")
    line = "x" * 99 + "\n"
    count = 3 * calls.OUTPUT_LIMIT // len(line)

    def call():
        log.info("before")  # its stdout neighbours are cut: it still comes first
        for i in range(count):
            sys.stdout.write(line)
            if i == count - 2:
                log.info("near the end")
        print("last")

    entry = _capture_one(call)
    out, _, out_cut, _, records, order = entry
    assert len(out) == calls.OUTPUT_LIMIT and out_cut == count * 100 + 5 - calls.OUTPUT_LIMIT
    assert sum(n for source, n in order if source == STDOUT) == len(out)
    text = _replayed(entry, monkeypatch)
    lines = text.splitlines()
    assert lines[0] == "INFO:ordered_app:before"
    assert lines[1].startswith(f"[batchfutures: the first {out_cut} characters this call wrote")
    assert lines[-4:] == ["x" * 99, "INFO:ordered_app:near the end", "x" * 99, "last"]


def test_records_and_runs_past_their_caps_keep_the_order_of_those_kept(clean_logging, monkeypatch):
    logging.getLogger().setLevel(logging.INFO)
    log = logging.getLogger("ordered_app")
    calls_made = MAX_RUNS // 2 + 100  # 2 runs each: the first 100 calls' runs fall off the cap
    records_cut = calls_made - logrecords.MAX_RECORDS

    def call():
        for i in range(calls_made):
            print(f"p{i}")
            log.info("r%d", i)

    entry = _capture_one(call)
    records, order = entry[4], entry[5]
    assert len(records) == logrecords.MAX_RECORDS + 1  # the note of the cut, then the last ones
    assert len(order) <= MAX_RUNS
    assert sum(n for source, n in order if source == RECORDS) == logrecords.MAX_RECORDS
    lines = _replayed(entry, monkeypatch).splitlines()
    # before the runs: the prints they no longer cover, then the note, grouped
    assert lines[:100] == [f"p{i}" for i in range(100)]
    assert "the first %d log records of this call were cut" % records_cut in lines[100]
    # then as made: the prints beside records that were cut, then print, record, print...
    assert lines[101:101 + records_cut - 100 + 1] == [f"p{i}" for i in range(100, records_cut + 1)]
    assert lines[101 + records_cut - 100 + 1:][:3] == [
        f"INFO:ordered_app:r{records_cut}", f"p{records_cut + 1}",
        f"INFO:ordered_app:r{records_cut + 1}"]
    assert lines[-2:] == [f"p{calls_made - 1}", f"INFO:ordered_app:r{calls_made - 1}"]
    assert len(lines) == 2 * calls_made - records_cut + 1


# -- against ProcessPoolExecutor ----------------------------------------------------------------
SCRIPT = """\
import concurrent.futures, logging, sys, warnings
from batchfutures import BatchExecutor

log = logging.getLogger("app")


def work(x):
    print(f"step 1 print {x}")
    log.info("step 2 info %s", x)
    print(f"step 3 stderr {x}", file=sys.stderr)
    warnings.warn(f"step 4 careful {x}")
    print(f"step 5 print {x}")
    log.warning("step 6 warning %s", x)
    log.error("step 7 error %s", x)
    print(f"step 8 stderr {x}", file=sys.stderr)
    return x


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(levelname)s|%(name)s|%(message)s")
    kind = sys.argv[1]
    executor = (BatchExecutor() if kind == "batch" else BatchExecutor(keepalive=30)
                if kind == "warm" else concurrent.futures.ProcessPoolExecutor(1))
    with executor as ex:
        for x in range(2):
            assert ex.submit(work, x).result() == x
            print(f"step 9 resolved {x}")
        assert list(ex.map(work, [2, 3])) == [2, 3]
"""


def _terminal(tmp_path, kind):
    """The script's stdout and stderr as one terminal shows them (one pipe, unbuffered)."""
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    environment = {**os.environ, "BATCHFUTURES_WORKDIR": str(tmp_path / "work"),
                   "PYTHONUNBUFFERED": "1"}
    done = subprocess.run([sys.executable, str(script), kind], cwd=tmp_path, env=environment,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=240)
    assert done.returncode == 0, done.stdout
    return [line for line in done.stdout.splitlines() if "step " in line]


def _calls(lines):
    """The lines cut into one block per call (each starts with its first print)."""
    blocks = []
    for line in lines:
        if line.startswith("step 1 print") or not blocks:
            blocks.append([])
        blocks[-1].append(line)
    return blocks


@slow
def test_prints_records_and_warnings_interleave_as_under_process_pool(tmp_path):
    ppe, batch = _calls(_terminal(tmp_path, "ppe")), _calls(_terminal(tmp_path, "batch"))
    # submit, one call at a time: the same lines in the same order
    assert batch[:2] == ppe[:2]
    # as made: print, info, stderr, the warning (and its source line), print, warning, error, stderr
    assert [line.split("step ")[1][0] for line in batch[0]] == list("1234456789")
    assert "INFO|app|step 2 info 0" in batch[0] and "ERROR|app|step 7 error 0" in batch[0]
    # map: the calls may end in another order (they run at once), each one's lines as made
    assert sorted(batch[2:]) == sorted(ppe[2:]) and len(batch) == 4


@slow
def test_warm_workers_keep_the_order_too(tmp_path):
    ppe, warm = _calls(_terminal(tmp_path, "ppe")), _calls(_terminal(tmp_path, "warm"))
    assert warm[:2] == ppe[:2]
    assert sorted(warm[2:]) == sorted(ppe[2:]) and len(warm) == 4


# -- echo_output="live": a record's line replayed as it is read ---------------------------------
def _live_call(flag_path):
    log = logging.getLogger("live_order_app")
    print("live one", flush=True)
    log.warning("live two")
    print("live three", flush=True)
    deadline = time.time() + 120
    while not os.path.exists(flag_path) and time.time() < deadline:
        time.sleep(0.05)
    log.warning("live four")
    print("live five")
    return "done"


@slow
def test_live_records_are_replayed_as_read_in_order_with_the_prints(local_env, tmp_path, capsys):
    flag = tmp_path / "go"
    seen = []

    def output():
        seen.append(capsys.readouterr().out)
        return "".join(seen)

    logger = logging.getLogger("live_order_app")
    handler = logging.StreamHandler(sys.stdout)  # capsys's: one stream with the prints
    handler.setFormatter(logging.Formatter("RECORD %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.WARNING)
    try:
        with BatchExecutor(local_env, echo_output="live") as ex:
            future = ex.submit(_live_call, str(flag))
            deadline = time.time() + 120
            while "live three" not in output() and time.time() < deadline:
                time.sleep(0.05)
            assert not future.done()  # streamed, the record too, while the call still runs
            assert [line for line in output().splitlines() if "live " in line] == [
                f"[{future.job_id}] live one", "RECORD live two", f"[{future.job_id}] live three"]
            flag.write_text("go")
            assert future.result(timeout=120) == "done"
    finally:
        logger.removeHandler(handler)
    # the last lines come with the executor's last round; none is echoed or replayed again
    assert [line for line in output().splitlines() if "live " in line] == [
        f"[{future.job_id}] live one", "RECORD live two", f"[{future.job_id}] live three",
        "RECORD live four", f"[{future.job_id}] live five"]


@slow
def test_live_records_of_a_warm_call_are_replayed_in_order_with_its_prints(local_env, tmp_path,
                                                                            capsys):
    """The same on a warm worker (keepalive=): the worker's stream carries the call's record
    lines between its markers; LiveTail replays them where they fall, and the call, streamed,
    is neither echoed nor replayed again as it resolves."""
    flag = tmp_path / "go"
    seen = []

    def output():
        seen.append(capsys.readouterr().out)
        return "".join(seen)

    def live_lines():  # the call's prefix ([<worker> call 0] ) taken off its printed lines
        return [line.split("] ", 1)[1] if line.startswith("[") else line
                for line in output().splitlines() if "live " in line]

    logger = logging.getLogger("live_order_app")
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("RECORD %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.WARNING)
    try:
        with BatchExecutor(local_env, echo_output="live", keepalive=30) as ex:
            future = ex.submit(_live_call, str(flag))
            deadline = time.time() + 120
            while "live three" not in output() and time.time() < deadline:
                time.sleep(0.05)
            assert not future.done()
            assert live_lines() == ["live one", "RECORD live two", "live three"]
            flag.write_text("go")
            assert future.result(timeout=120) == "done"
    finally:
        logger.removeHandler(handler)
    assert live_lines() == ["live one", "RECORD live two", "live three", "RECORD live four",
                            "live five"]
