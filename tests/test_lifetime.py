"""The executor's lifetime as a script sees it: interpreter exit and Ctrl-C.

Each test runs a real script in a fresh interpreter, as a user would, on the embedded emulator.
"""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from batchfutures.session import THREADS_REFUSED_AT_EXIT

pytestmark = pytest.mark.slow


def run_script(tmp_path, body, **kwargs):
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(body))
    environment = {**os.environ, "BATCHFUTURES_WORKDIR": str(tmp_path / "work")}
    return subprocess.Popen([sys.executable, str(script)], cwd=tmp_path, env=environment,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)


def test_calls_submitted_just_before_exit_still_run(tmp_path):
    marker = tmp_path / "ran"
    process = run_script(tmp_path, f"""
        import pathlib, time
        from batchfutures import BatchExecutor

        def slow_touch(path):
            time.sleep(0.5)
            pathlib.Path(path).write_text("done")

        ex = BatchExecutor()
        ex.submit(slow_touch, {str(marker)!r})  # still in the coalescing buffer at exit
    """)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, err
    if THREADS_REFUSED_AT_EXIT:  # CPython 3.12.0-3.12.2: no thread can start at exit; it says so
        assert "gh-113964" in err and "executor.shutdown()" in err and not marker.exists()
    else:
        assert marker.read_text() == "done"


def test_submit_from_an_atexit_hook_is_refused(tmp_path):
    process = run_script(tmp_path, """
        import atexit
        from batchfutures import BatchExecutor

        ex = BatchExecutor()

        def late():
            try:
                ex.submit(abs, -1)
            except RuntimeError as error:
                print("refused:", error)

        atexit.register(late)
    """)
    out, err = process.communicate(timeout=120)
    assert "refused: cannot schedule new futures after interpreter shutdown" in out, err


def test_shutdown_without_waiting_and_cancel_does_not_wait_at_exit(tmp_path):
    marker = tmp_path / "ran"
    process = run_script(tmp_path, f"""
        import pathlib, time
        from batchfutures import BatchExecutor

        def slow_touch(path):
            time.sleep(60)
            pathlib.Path(path).write_text("done")

        ex = BatchExecutor()
        future = ex.submit(slow_touch, {str(marker)!r})
        ex.shutdown(wait=False, cancel_futures=True)
        print("cancelled:", future.cancelled())
    """)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    assert "cancelled: True" in out
    assert not marker.exists()


def test_ctrl_c_stops_the_jobs_and_leaves_at_once(tmp_path):
    pids = tmp_path / "pids"
    process = run_script(tmp_path, f"""
        import os, sys, time
        from batchfutures import BatchExecutor

        def sleeper(x):
            with open({str(pids)!r}, "a") as handle:
                handle.write(f"{{os.getpid()}}\\n")
            time.sleep(300)
            return x

        with BatchExecutor() as ex:
            futures = ex.map_futures(sleeper, range(2))
            while not os.path.exists({str(pids)!r}) or \
                    len(open({str(pids)!r}).read().split()) < 2:
                time.sleep(0.05)  # both workers started and recorded their pids
            print("running", flush=True)
            results = [f.result() for f in futures]
    """)
    assert process.stdout.readline().strip() == "running"
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=60)  # one Ctrl-C: no hang, no second press
    assert process.returncode != 0
    assert "KeyboardInterrupt" in err
    assert "interrupted; stopping 1 Batch job(s)" in err
    for pid in pids.read_text().split():
        with pytest.raises(ProcessLookupError):  # the emulator's attempts were terminated
            for _ in range(300):  # up to 30 s on a loaded machine
                os.kill(int(pid), 0)
                time.sleep(0.1)


def test_ctrl_c_while_the_with_block_waits(tmp_path):
    process = run_script(tmp_path, """
        import time
        from batchfutures import BatchExecutor

        def sleeper(x):
            time.sleep(300)

        with BatchExecutor() as ex:
            future = ex.submit(sleeper, 1)
            while not future.running():
                time.sleep(0.05)
            print("running", flush=True)
        # leaving the block waits for the sleeper
    """)
    assert process.stdout.readline().strip() == "running"
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=60)
    assert process.returncode != 0 and "KeyboardInterrupt" in err
    assert "interrupted; stopping 1 Batch job(s)" in err
