"""What a call prints reaches the client's terminal (BatchExecutor(echo_output=True), issue 18).

As a ProcessPoolExecutor's workers print to their parent's terminal: each call's stdout and
stderr are written to the client's sys.stdout and sys.stderr when its future resolves, and they
still go to the job's log. The worker keeps the last calls.OUTPUT_LIMIT characters of each
stream per call in the result object's output section. Each end-to-end test runs a real script
in a fresh interpreter on the emulator and reads its stdout and stderr.
"""

import io
import os
import subprocess
import sys
import textwrap

import pytest

from batchfutures import wire
from batchfutures.worker import calls, pool

slow = pytest.mark.slow


def run_script(tmp_path, body):
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(body))
    environment = {**os.environ, "BATCHFUTURES_WORKDIR": str(tmp_path / "work")}
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=environment,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    return done


def lines_with(prefix, text):
    return [line for line in text.splitlines() if line.startswith(prefix)]


# -- end to end ---------------------------------------------------------------------------------
@slow
def test_each_calls_stdout_and_stderr_reach_the_clients(tmp_path):
    done = run_script(tmp_path, """
        import sys
        from batchfutures import BatchExecutor

        def shout(x):
            print(f"out {x}")
            print(f"err {x}", file=sys.stderr)
            return x

        if __name__ == "__main__":
            with BatchExecutor() as ex:
                assert ex.submit(shout, "submit").result() == "submit"
                assert list(ex.map(shout, ["map-0", "map-1", "map-2"], chunksize=2)) == [
                    "map-0", "map-1", "map-2"]
                assert [f.result() for f in ex.map_futures(shout, ["futures-0", "futures-1"])] == [
                    "futures-0", "futures-1"]
    """)
    names = ["submit", "map-0", "map-1", "map-2", "futures-0", "futures-1"]
    assert sorted(lines_with("out ", done.stdout)) == sorted(f"out {n}" for n in names)
    assert sorted(lines_with("err ", done.stderr)) == sorted(f"err {n}" for n in names)
    assert not lines_with("err ", done.stdout) and not lines_with("out ", done.stderr)


@slow
def test_the_output_is_written_before_the_future_resolves(tmp_path):
    done = run_script(tmp_path, """
        import io, sys
        from batchfutures import BatchExecutor

        def hello(x):
            print(f"hello {x}")
            return x

        if __name__ == "__main__":
            real, sys.stdout = sys.stdout, io.StringIO()
            seen = []
            with BatchExecutor() as ex:
                future = ex.submit(hello, "submit")
                future.add_done_callback(
                    lambda f: seen.append("hello submit" in sys.stdout.getvalue()))
                future.result()
                seen.append("hello submit" in sys.stdout.getvalue())
                for x in ex.map(hello, ["map"]):  # map's iterator: the child's output first
                    seen.append("hello map" in sys.stdout.getvalue())
            sys.stdout = real
            print("seen:", seen)
    """)
    assert lines_with("seen:", done.stdout) == ["seen: [True, True, True]"]


@slow
def test_echo_output_false_leaves_it_in_the_log_only(tmp_path):
    done = run_script(tmp_path, """
        import sys
        from batchfutures import BatchExecutor

        def quiet(x):
            print(f"out {x}")
            print(f"err {x}", file=sys.stderr)
            return x

        if __name__ == "__main__":
            with BatchExecutor(echo_output=False) as ex:
                future = ex.submit(quiet, "silent")
                assert future.result() == "silent"
                assert list(ex.map(quiet, ["mapped"])) == ["mapped"]
                log = future.log()
            print("in the log:", "out silent" in log, "err silent" in log)
    """)
    assert "out silent" not in done.stdout and "out mapped" not in done.stdout
    assert "err silent" not in done.stderr and "err mapped" not in done.stderr
    assert lines_with("in the log:", done.stdout) == ["in the log: True True"]


@slow
def test_long_output_keeps_its_end_and_says_how_much_was_cut(tmp_path):
    done = run_script(tmp_path, """
        from batchfutures import BatchExecutor

        def chatty():
            for i in range(20_000):
                print(f"line {i:05d}")  # 11 characters each: 220,000 in all
            return "done"

        if __name__ == "__main__":
            with BatchExecutor() as ex:
                future = ex.submit(chatty)
                assert future.result() == "done"
                log = future.log()
            print("log has the first line:", "line 00000" in log)
    """)
    limit = calls.OUTPUT_LIMIT
    cut = 20_000 * 11 - limit
    marker = (f"[batchfutures: the first {cut} characters this call wrote to stdout were cut; "
              f"future.log() has them]")
    assert marker in done.stdout
    echoed = done.stdout.split(marker + "\n", 1)[1].split("log has the first line:")[0]
    assert len(echoed) == limit and echoed.endswith("line 19999\n")
    assert lines_with("log has the first line:", done.stdout) == ["log has the first line: True"]


@slow
def test_output_of_calls_resolved_at_interpreter_exit_is_written(tmp_path):
    done = run_script(tmp_path, """
        from batchfutures import BatchExecutor

        def late(x):
            print(f"late {x}", flush=True)
            return x

        ex = BatchExecutor()
        for x in range(3):
            ex.submit(late, x)  # never waited for: the interpreter's exit waits for them
        print("script ends")
    """)
    assert sorted(lines_with("late ", done.stdout)) == ["late 0", "late 1", "late 2"]
    assert lines_with("script ends", done.stdout)


@slow
@pytest.mark.skipif(not pool.FORK_AVAILABLE, reason="the inner pool forks on Linux only")
def test_the_inner_pools_items_and_initializer_output_reach_the_client(tmp_path):
    done = run_script(tmp_path, """
        import os, sys
        from batchfutures import BatchExecutor

        def init():
            print(f"init in {os.getpid()}")

        def item(x):
            print(f"item {x}")
            print(f"item err {x}", file=sys.stderr)
            return os.getpid()

        if __name__ == "__main__":
            # vcpus=2: the child's 6 items run on 2 forked sub-processes (batchfutures/worker/pool.py)
            with BatchExecutor(initializer=init, vcpus=2) as ex:
                pids = list(ex.map(item, range(6), chunksize=6))
            print("processes:", len(set(pids)))
    """)
    assert sorted(lines_with("item ", done.stdout)) == [f"item {x}" for x in range(6)]
    assert sorted(lines_with("item err ", done.stderr)) == [f"item err {x}" for x in range(6)]
    processes = int(lines_with("processes:", done.stdout)[0].split()[1])
    assert len(lines_with("init in ", done.stdout)) == processes  # once per sub-process


# -- the result object's output section ---------------------------------------------------------
def test_the_output_section_travels_apart_from_the_outcomes():
    outcomes = [wire.encode_ok(x) for x in range(3)]
    printed = {1: ["one\n", "", 0, 0], 2: ["", "two é \udcff\n", 0, 5]}
    data = wire.pack_result(outcomes, {"index": 0}, printed)
    meta, back = wire.unpack_result(data)
    assert back == outcomes and meta["index"] == 0 and meta["output"] > 0
    assert wire.result_output(data) == printed
    # written before echo_output existed (no output section), or by a worker that kept none: no output
    for old in (wire.pack_result(outcomes, {"index": 0}),
                wire.pack_result(outcomes, {"index": 0}, {})):
        assert wire.unpack_result(old)[1] == outcomes
        assert wire.result_output(old) == {}
    # nothing readable: no output (decoding the outcomes reports what is wrong)
    assert wire.result_output(b"garbage") == {}
    assert isinstance(wire.result_output(data[:-3]), dict)  # never raises
    with pytest.raises(ValueError):
        wire.unpack_result(data[:-3])


def test_echo_writes_each_stream_with_the_cut_said(monkeypatch):
    out, err = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)
    wire.echo_output(["kept end\n", "warning\n", 12, 0])
    assert out.getvalue() == ("[batchfutures: the first 12 characters this call wrote to stdout "
                              "were cut; future.log() has them]\nkept end\n")
    assert err.getvalue() == "warning\n"
    wire.echo_output(None)
    assert out.getvalue().count("kept end") == 1


# -- with the order of the prints and records (outputorder) -------------------------------------
RECORD = {"name": "echo_app", "levelno": 30, "levelname": "WARNING", "msg": "a record"}


@pytest.fixture
def one_terminal(monkeypatch):
    """A function that puts stdout, stderr and the root logger's handler on one stream, as a
    terminal shows them (called in the test: pytest sets sys.stdout again as the test starts)."""
    import logging

    root = logging.getLogger()
    saved = list(root.handlers)

    def install():
        terminal = io.StringIO()
        monkeypatch.setattr(sys, "stdout", terminal)
        monkeypatch.setattr(sys, "stderr", terminal)
        handler = logging.StreamHandler(terminal)
        handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
        root.handlers[:] = [handler]
        return terminal

    yield install
    root.handlers[:] = saved


@pytest.mark.parametrize("entry, expected", [
    # the order kept: interleaved as made
    (["o1\no2\n", "e1\n", 0, 0, [RECORD], [[0, 3], [2, 1], [1, 3], [0, 3]]],
     "o1\nWARNING a record\ne1\no2\n"),
    # an entry written before the order was kept (or without records): grouped, as before
    (["o1\no2\n", "e1\n", 0, 0, [RECORD]], "o1\no2\ne1\nWARNING a record\n"),
    (["o1\n", "e1\n", 0, 0], "o1\ne1\n"),
    # a malformed order: grouped
    (["o1\no2\n", "e1\n", 0, 0, [RECORD], [[0, 99]]], "o1\no2\ne1\nWARNING a record\n"),
    (["o1\no2\n", "e1\n", 0, 0, [RECORD], "junk"], "o1\no2\ne1\nWARNING a record\n"),
    # the cut said before the first stdout written, wherever it falls in the order
    (["o2\n", "e1\n", 5, 0, [RECORD], [[1, 3], [2, 1], [0, 3]]],
     "e1\nWARNING a record\n[batchfutures: the first 5 characters this call wrote to stdout were "
     "cut; future.log() has them]\no2\n"),
    # a later worker's longer entry: what this client knows of it
    (["o1\n", "", 0, 0, [RECORD], [[2, 1], [0, 3]], "later"], "WARNING a record\no1\n"),
])
def test_echo_writes_and_replays_in_the_order_kept(one_terminal, entry, expected):
    terminal = one_terminal()
    wire.echo_output(entry)
    assert terminal.getvalue() == expected


def test_a_streamed_calls_prints_are_not_written_again(one_terminal):
    terminal = one_terminal()
    wire.echo_output(["o1\n", "e1\n", 0, 0, [RECORD], [[0, 3], [2, 1], [1, 3]]], streams=False)
    assert terminal.getvalue() == "WARNING a record\n"


def test_the_order_travels_in_the_result_object():
    entry = ["o1\n", "e1\n", 0, 0, [RECORD], [[0, 3], [2, 1], [1, 3]]]
    data = wire.pack_result([wire.encode_ok(1)], {"index": 0}, {0: entry})
    assert wire.result_output(data) == {0: entry}
