"""echo_output="live": running calls' output on the client while they run (batchfutures.livetail)."""

import os
import time

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
