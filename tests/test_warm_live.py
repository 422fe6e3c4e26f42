"""echo_output="live" on warm workers (batchfutures.warmlive): a worker's stream split by call,
each call's lines prefixed while it runs, none echoed twice."""

import os
import time

import pytest

from batchfutures import BatchExecutor, jobdetail, livetail, warmlive
from batchfutures.errors import MemoryLimitExceeded
from batchfutures.logs import lines_after, log_group_of
from batchfutures.warmwire import call_marker

TOKEN = "t0k3n"


def begin(n, token=TOKEN):
    return call_marker(token, n, "begin")


def end(n, token=TOKEN):
    return call_marker(token, n, "end")


@pytest.mark.parametrize("lines, expected", [
    # one call between its markers; what comes before and after belongs to nobody
    (["start-up", begin(3), "a", "b", end(3), "idle"], [(3, "a"), (3, "b")]),
    # calls one after another
    ([begin(0), "x", end(0), begin(1), "y", end(1)], [(0, "x"), (1, "y")]),
    # lines between calls (a new runner's initializer) are nobody's
    ([begin(0), end(0), "init of the next runner", begin(1), "y", end(1)], [(1, "y")]),
    # the runner died in call 4 (no end): the next begin opens the next call
    ([begin(4), "before the kill", begin(5), "next", end(5)], [(4, "before the kill"), (5, "next")]),
    # the supervisor's end after a death, then a late end of the same call: ignored
    ([begin(4), "x", end(4), end(4), "nobody's"], [(4, "x")]),
    # an end of another call closes nothing
    ([begin(2), "x", end(7), "still 2", end(2)], [(2, "x"), (2, "still 2")]),
    # an end with no call open: nothing
    ([end(1), "nobody's"], []),
    # the call's last line had no newline: the marker ends that line, the text is the call's
    ([begin(6), "progress 99%" + end(6), "after"], [(6, "progress 99%")]),
    # text before a begin (between calls) stays nobody's
    (["half a line" + begin(6), "in"], [(6, "in")]),
    # hostile or malformed markers are the call's own lines (the client hides them: shown())
    ([begin(1), "batchfutures.call: 9 begin", "z", end(1)],
     [(1, "batchfutures.call: 9 begin"), (1, "z")]),                     # no token
    ([begin(1), begin(9, "other"), "z", end(1)], [(1, begin(9, "other")), (1, "z")]),  # wrong one
    ([begin(1), f"batchfutures.call: {TOKEN} x begin", end(1)],
     [(1, f"batchfutures.call: {TOKEN} x begin")]),                      # not a number
    ([begin(1), f"batchfutures.call: {TOKEN} 2 started", end(1)],
     [(1, f"batchfutures.call: {TOKEN} 2 started")]),                    # not begin/end
    ([begin(1), begin(2) + " trailing", end(1)], [(1, begin(2) + " trailing")]),
    ([begin(1), f"batchfutures.call: {TOKEN} ٣ begin", end(1)],          # a non-ASCII digit
     [(1, f"batchfutures.call: {TOKEN} ٣ begin")]),
    ([begin(1), f"batchfutures.call: {TOKEN} -2 begin", end(1)],
     [(1, f"batchfutures.call: {TOKEN} -2 begin")]),
    # empty lines are the call's too
    ([begin(1), "", end(1)], [(1, "")]),
])
def test_splitter_table(lines, expected):
    assert warmlive.CallSplitter(TOKEN).split(lines) == expected


@pytest.mark.parametrize("cut", range(1, 7))
def test_splitter_keeps_its_place_across_reads(cut):
    lines = ["boot", begin(0), "a", "b", end(0), "between", begin(1), "c"]
    splitter = warmlive.CallSplitter(TOKEN)
    found = splitter.split(lines[:cut]) + splitter.split(lines[cut:])
    assert found == [(0, "a"), (0, "b"), (1, "c")]
    assert splitter.current == 1  # a read may end in the middle of a call


def test_no_token_no_markers():
    assert warmlive.read_marker(begin(1, ""), "") == (begin(1, ""), None)
    assert warmlive.CallSplitter("").split([begin(1, ""), "x"]) == []


@pytest.mark.parametrize("mapped, number, first, items, label", [
    (False, 12, 0, 1, "call 12"),
    (True, 12, 3, 1, "item 3"),
    (True, 12, 4, 4, "items 4-7"),
    (True, 0, 0, 0, "item 0"),
])
def test_label_for(mapped, number, first, items, label):
    assert warmlive.label_for(mapped, number, first, items) == label


def _live(statuses):
    return warmlive.WarmLive(TOKEN, lambda: dict(statuses), livetail.shown)


def test_a_worker_followed_streams_its_calls_and_they_are_not_echoed():
    statuses = {"w1": "RUNNING"}
    live = _live(statuses)
    live.label(5, "item 2")
    route = live.routes()["w1"]
    assert live.routes()["w1"] is route  # the same router every round
    assert [route(line) for line in (begin(5), "hello", "batchfutures.note: the worker's",
                                     "batchfutures.log: {}", end(5))] \
        == [None, "[w1 item 2] hello", None,  # the worker's own lines hidden
            "batchfutures.log: {}", None]  # a record's line goes on (LiveTail replays it)
    assert live.echo_at_end(5, "w1") is False


def test_calls_echoed_before_their_worker_was_followed_are_skipped_in_its_stream():
    statuses = {"w1": "STARTING"}  # the pool's watch has not seen it RUNNING yet
    live = _live(statuses)
    assert live.routes() == {}
    assert live.echo_at_end(0, "w1") is True  # echoed as it resolved
    assert live.routes() == {}  # not RUNNING yet: what was echoed is still remembered
    statuses["w1"] = "RUNNING"
    route = live.routes()["w1"]
    shown = [route(line) for line in (begin(0), "echoed already", end(0), begin(1), "new", end(1))]
    assert shown == [None, None, None, None, "[w1 call 1] new", None]  # no label kept: call n
    assert live.echo_at_end(1, "w1") is False


def test_workers_that_end_leave_the_routes_and_their_echoed_calls_are_forgotten():
    statuses = {"w1": "RUNNING", "w2": "RUNNING"}
    live = _live(statuses)
    assert set(live.routes()) == {"w1", "w2"}
    statuses["w1"] = "SUCCEEDED"
    assert set(live.routes()) == {"w2"}  # the LiveTail reads w1 to its end once more
    assert live.echo_at_end(3, "w1") is False  # it was followed: its lines came from the stream
    live.echo_at_end(4, "w3")
    statuses["w3"] = "FAILED"  # ended before it was ever followed
    live.routes()
    assert "w3" not in live._echoed
    assert live.echo_at_end(9, None) is True  # no worker said (a failure result): echoed


def test_labels_kept_are_bounded(monkeypatch):
    monkeypatch.setattr(warmlive, "LABELS_KEPT", 3)
    live = _live({})
    for n in range(5):
        live.label(n, f"item {n}")
    assert [live.label_of(n) for n in range(5)] == ["call 0", "call 1", "item 2", "item 3", "item 4"]



# -- the worker's side: each call between its markers in the worker's log ---------------------
def _talks(x):
    import sys

    print(f"out {x}")
    print(f"err {x}", file=sys.stderr)
    print(f"no newline {x}", end="")
    return x


def _dies(x):
    import signal

    print(f"dying {x}", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)  # the runner dies in the call: no end of its own


def _worker_lines(env, worker):
    description = env.batch.describe_jobs(jobs=[worker])["jobs"][0]
    return list(lines_after(env.logs, log_group_of(description, env.log_group),
                            jobdetail.log_stream(description)))


@pytest.mark.slow
def test_the_worker_writes_each_call_between_its_markers(local_env):
    with BatchExecutor(local_env, keepalive=30, max_workers=1, echo_output="live") as ex:
        assert list(ex.map(_talks, range(2))) == [0, 1]
        with pytest.raises(MemoryLimitExceeded):  # a runner killed (SIGKILL): as the OOM killer
            ex.submit(_dies, 2).result(timeout=120)
        assert ex.submit(_talks, 3).result(timeout=120) == 3
        pool = next(iter(ex._session.warm_pools.values()))
        token, (worker,) = pool.live.token, list(pool.workers)
    lines = _worker_lines(local_env, worker)
    by_call = {}
    for number, line in warmlive.CallSplitter(token).split(lines):
        by_call.setdefault(number, []).append(line)
    # stdout and stderr in the order printed (one pipe), the last line without newline kept
    assert by_call == {0: ["out 0", "err 0", "no newline 0"], 1: ["out 1", "err 1", "no newline 1"],
                       2: ["dying 2"], 3: ["out 3", "err 3", "no newline 3"]}
    assert sum(line.endswith(f"{token} 2 end") for line in lines) == 1  # by the supervisor


# -- end to end: a warm pool on the emulator, the session's one LiveTail -----------------------
def _wait_for(path, seconds=120):
    deadline = time.time() + seconds
    while not os.path.exists(path) and time.time() < deadline:
        time.sleep(0.05)


def _talk_then_wait(flag_path):
    print("first line", flush=True)
    _wait_for(flag_path)  # the test writes it once it has seen the first line
    print("second line")
    return "done"


def _item_then_wait(x, flag_path):
    print(f"item {x} started")
    _wait_for(flag_path)
    return x


def _output_reader(capsys):
    seen = []

    def output():
        seen.append(capsys.readouterr().out)
        return "".join(seen)

    return output


def _until(output, text, seconds=120):
    deadline = time.time() + seconds
    while text not in output() and time.time() < deadline:
        time.sleep(0.05)
    return output()


@pytest.mark.slow
def test_a_warm_call_streams_while_it_runs_and_is_not_echoed_again(local_env, tmp_path, capsys):
    flag = tmp_path / "go"
    output = _output_reader(capsys)
    with BatchExecutor(local_env, keepalive=30, max_workers=1, echo_output="live") as ex:
        future = ex.submit(_talk_then_wait, str(flag))
        text = _until(output, "first line")
        assert not future.done()  # streamed while the call still runs
        first = [line for line in text.splitlines() if line.endswith("first line")]
        assert len(first) == 1 and first[0].endswith(" call 0] first line"), text
        flag.write_text("go")
        assert future.result(timeout=120) == "done"
        worker = future.job_id
    text = output()  # the executor's exit waits for the LiveTail's last round
    assert first == [f"[{worker} call 0] first line"]  # prefixed by the worker and the call
    assert f"[{worker} call 0] second line" in text.splitlines()
    assert text.count("first line") == 1 and text.count("second line") == 1  # not echoed again


@pytest.mark.slow
def test_a_warm_maps_lines_name_their_items(local_env, tmp_path, capsys):
    flag = tmp_path / "go"
    output = _output_reader(capsys)
    with BatchExecutor(local_env, keepalive=30, max_workers=2, echo_output="live") as ex:
        futures = ex.map_futures(_item_then_wait, [0, 1], [str(flag)] * 2)
        _until(output, "item 0 started")
        text = _until(output, "item 1 started")
        assert not any(future.done() for future in futures)
        flag.write_text("go")
        assert [future.result(timeout=120) for future in futures] == [0, 1]
        workers = [future.job_id for future in futures]
    text = output()
    for x in (0, 1):
        assert text.splitlines().count(f"[{workers[x]} item {x}] item {x} started") == 1, text
        assert text.count(f"item {x} started") == 1


def _quick(x):
    print(f"quick {x}")
    return x


@pytest.mark.slow
def test_warm_calls_print_once_whether_echoed_or_streamed(local_env, tmp_path, capsys):
    flag = tmp_path / "go"
    output = _output_reader(capsys)
    with BatchExecutor(local_env, keepalive=30, max_workers=1, echo_output="live") as ex:
        # done before the LiveTail follows the worker (a round a second): echoed as they resolve
        assert list(ex.map(_quick, range(3))) == [0, 1, 2]
        future = ex.submit(_talk_then_wait, str(flag))
        _until(output, "first line")  # streamed: the worker is followed from now on
        flag.write_text("go")
        assert future.result(timeout=120) == "done"
        assert list(ex.map(_quick, range(3, 6))) == [3, 4, 5]  # the same worker: streamed
        worker = future.job_id
    lines = output().splitlines()
    for x in range(6):
        assert sum(line.endswith(f"quick {x}") for line in lines) == 1, lines
    for position, x in enumerate(range(3, 6)):  # a map's lines name their items
        assert f"[{worker} item {position}] quick {x}" in lines


def _subprocess_writes_to_stderr(_):
    import subprocess
    import sys

    subprocess.run([sys.executable, "-c", "import sys; sys.stderr.write('sub err\\n')"],
                   check=True)
    return sys.stderr is sys.stdout


@pytest.mark.slow
def test_a_subprocess_stderr_is_in_its_calls_lines_and_sys_stderr_stays_its_own(local_env):
    # docs/warm.md: with live, descriptor 2 is stdout's pipe (os.dup2), for what the call
    # starts too; the Python streams stay two objects
    with BatchExecutor(local_env, keepalive=30, max_workers=1, echo_output="live") as ex:
        assert ex.submit(_subprocess_writes_to_stderr, 0).result(timeout=120) is False
        pool = next(iter(ex._session.warm_pools.values()))
        token, (worker,) = pool.live.token, list(pool.workers)
    assert (0, "sub err") in warmlive.CallSplitter(token).split(_worker_lines(local_env, worker))
