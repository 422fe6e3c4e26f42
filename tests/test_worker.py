"""The worker as the container runs it: ``python -m batchfutures.worker <job_url>`` in a fresh
process, reading and writing real storage (local files, and S3 on moto's server)."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import threading
import uuid
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import pytest
import s3server

from batchfutures import EnvironmentMismatchError, RemoteError, serialization, wire
from batchfutures.storage import Storage
from batchfutures.wire import RemoteTraceback
from batchfutures.worker import calls
from batchfutures.worker import main as worker

# moto S3 fixtures (tests/s3server.py), registered for this module
moto_server, aws_env, s3_bucket, s3_root = (
    s3server.moto_server, s3server.aws_env, s3server.s3_bucket, s3server.s3_root)

Call = Tuple[Callable[..., Any], tuple, dict]



def make_job(storage: Storage, children: Sequence[Sequence[Call]], *,
             stamp: Optional[Dict[str, str]] = None, function_urls: Optional[List[str]] = None,
             by_value: bool = True, extra: Optional[Dict[str, Any]] = None) -> str:
    """Upload functions and inputs the way the executor does; returns the job URL.

    ``extra``: more header entries (``{"output": True}``: echo_output's)."""
    run_id = "run-" + uuid.uuid4().hex[:8]
    job_key = uuid.uuid4().hex
    functions: List[Callable[..., Any]] = []
    blobs = []
    for child_calls in children:
        items = []
        for fn, args, kwargs in child_calls:
            if not any(fn is known for known in functions):
                functions.append(fn)
            index = next(i for i, known in enumerate(functions) if known is fn)
            items.append((index, args, kwargs))
        blobs.append(wire.pack_items(items, by_value=by_value))
    urls = function_urls or [storage.put_function(run_id, serialization.dumps(fn, by_value=by_value))
                             for fn in functions]
    header: Dict[str, Any] = {"functions": urls, "items": sum(len(c) for c in children),
                              "chunksize": max(len(c) for c in children), "run_id": run_id,
                              "job_key": job_key}
    header.update(stamp or serialization.payload_stamp())
    header.update(extra or {})
    job_url = storage.job_url(run_id, job_key)
    storage.write_inputs(job_url, header, blobs)
    return job_url


def run_worker(job_url: str, index: Optional[int] = 0, *, attempt: str = "1",
               preexec: Optional[Callable[[], None]] = None,
               argv: Optional[List[str]] = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop("AWS_BATCH_JOB_ARRAY_INDEX", None)
    if index is not None:
        env["AWS_BATCH_JOB_ARRAY_INDEX"] = str(index)
    env["AWS_BATCH_JOB_ATTEMPT"] = attempt
    command = argv or [sys.executable, "-m", "batchfutures.worker", job_url]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=60,
                          preexec_fn=preexec)


def results(storage: Storage, job_url: str, index: int = 0) -> Tuple[Dict[str, Any], List[Tuple[bool, Any]]]:
    data = storage.read_result(job_url, index)
    assert data is not None, "the worker wrote no result"
    meta, outcomes = wire.unpack_result(data)
    return meta, [wire.outcome_result(outcome) for outcome in outcomes]


# -- the ordinary run ---------------------------------------------------------------------------
@pytest.mark.slow
def test_array_child_runs_its_items_values_errors_and_prints(storage):
    factor = 3

    def scale(x, *, plus=0):  # a closure defined in the test: pickled by value
        return x * factor + plus

    def shout(text):
        print(f"hello from the job: {text}")
        print("to stderr too", file=sys.stderr)
        return len(text)

    def fail(x):
        raise ValueError("bad item", x)

    job = make_job(storage, [
        [(scale, (100,), {})],
        [(lambda x: x * x, (4,), {}), (scale, (2,), {"plus": 1}), (shout, ("hi",), {}),
         (fail, (9,), {}), (scale, (5,), {})],
    ])
    done = run_worker(job, 1, attempt="2")
    assert done.returncode == 0, done.stderr
    assert "hello from the job: hi" in done.stdout and "to stderr too" in done.stderr
    meta, outcomes = results(storage, job, 1)
    assert meta["index"] == 1 and meta["attempt"] == "2"
    assert outcomes[:3] == [(True, 16), (True, 7), (True, 2)] and outcomes[4] == (True, 15)
    ok, error = outcomes[3]
    assert not ok and type(error) is ValueError and error.args == ("bad item", 9)
    assert isinstance(error.__cause__, RemoteTraceback)
    # the frame is named; its source line shows only where cloudpickle keeps the file name
    assert "in fail" in str(error.__cause__) and "ValueError" in str(error.__cause__)
    assert storage.list_results(job) == {1}  # child 0 has not run

    assert run_worker(job, None).returncode == 0  # no AWS_BATCH_JOB_ARRAY_INDEX: child 0
    assert results(storage, job, 0)[1] == [(True, 300)]
    assert storage.list_results(job) == {0, 1}


@pytest.mark.slow
def test_with_output_each_items_prints_are_kept_and_still_reach_the_log(local):
    def talk(x):
        print(f"out {x}")
        print(f"err {x}", file=sys.stderr)
        sys.stdout.writelines([f"more {x}\n"])
        return x

    def silent(x):
        return x

    def noisy_failure():
        print("about to fail")
        raise ValueError("failed")

    job = make_job(local, [[(talk, (0,), {}), (silent, (1,), {}), (noisy_failure, (), {}),
                            (talk, (3,), {})]], extra={"output": True})
    done = run_worker(job)
    assert done.returncode == 0, done.stderr
    # tee'd: the container's log has all of it, as without the header entry
    assert done.stdout.count("out 0") == done.stdout.count("out 3") == 1
    assert "more 3" in done.stdout and "about to fail" in done.stdout and "err 3" in done.stderr
    data = local.read_result(job, 0)
    # [stdout, stderr, cut, cut, records, the runs of what was written in order (only where
    # more than one source wrote: outputorder)]
    in_order = [[0, len("out 0\n")], [1, len("err 0\n")], [0, len("more 0\n")]]
    assert wire.result_output(data) == {
        0: ["out 0\nmore 0\n", "err 0\n", 0, 0, [], in_order],
        2: ["about to fail\n", "", 0, 0],  # a call that raised printed too
        3: ["out 3\nmore 3\n", "err 3\n", 0, 0, [], in_order],
    }
    assert [ok for ok, _ in results(local, job)[1]] == [True, True, False, True]

    quiet = make_job(local, [[(talk, (0,), {})]])  # no "output": only the log has it
    assert run_worker(quiet).returncode == 0
    assert wire.result_output(local.read_result(quiet, 0)) == {}
    assert results(local, quiet)[1] == [(True, 0)]


def test_kept_output_is_bounded_to_its_end():
    tee = calls._Tee(io.StringIO())
    tee.write("x" * (3 * calls.OUTPUT_LIMIT))
    tee.write("the end")
    text, cut = tee.take()
    assert len(text) == calls.OUTPUT_LIMIT and text.endswith("the end")
    assert cut == 3 * calls.OUTPUT_LIMIT + len("the end") - calls.OUTPUT_LIMIT
    assert tee.take() == ("", 0)  # each take starts afresh
    assert tee._stream.getvalue().endswith("x" * 10 + "the end")  # the stream had all of it


@pytest.mark.slow
def test_unpicklable_exception_and_value_come_back_typed(storage):
    def raise_with_lock():
        raise ValueError("holds a lock", threading.Lock())

    def return_generator():
        return (i for i in range(3))

    def exit_early(code):
        sys.exit(code)

    job = make_job(storage, [[(raise_with_lock, (), {}), (return_generator, (), {}),
                            (exit_early, (5,), {}), (lambda: "still runs", (), {})]])
    done = run_worker(job)
    assert done.returncode == 0, done.stderr
    outcomes = results(storage, job)[1]
    (ok0, lock_error), (ok1, generator_error), (ok2, exit_error) = outcomes[:3]
    assert not ok0 and type(lock_error) is RemoteError and "ValueError" in str(lock_error)
    assert "raise_with_lock" in lock_error.traceback
    # a value that cannot be pickled: the pickling error itself, as ProcessPoolExecutor raises
    assert not ok1 and type(generator_error) is TypeError and "generator" in str(generator_error)
    assert "returned generator, which could not be pickled" in str(generator_error.__cause__)
    assert not ok2 and type(exit_error) is SystemExit and exit_error.code == 5  # an outcome
    assert outcomes[3] == (True, "still runs")


# -- the container ends --------------------------------------------------------------------------
@pytest.mark.slow
def test_memory_error_exits_137_without_a_result(local):
    def out_of_memory():
        raise MemoryError

    job = make_job(local, [[(lambda: 1, (), {}), (out_of_memory, (), {})]])
    done = run_worker(job)
    assert done.returncode == 137
    assert "MemoryError" in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert local.read_result(job, 0) is None


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_DATA as the emulator uses it")
def test_a_real_allocation_over_rlimit_data_exits_137(local):
    import resource

    limit = 1 << 30

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))

    job = make_job(local, [[(lambda n: len(bytearray(n)), (4 * limit,), {})]])
    done = run_worker(job, preexec=cap)
    assert done.returncode == 137, done.stderr
    assert local.read_result(job, 0) is None


@pytest.mark.slow
def test_os_exit_in_the_function_leaves_no_result_and_its_exit_code(local):
    job = make_job(local, [[(os._exit, (3,), {})]])
    done = run_worker(job)
    assert done.returncode == 3
    assert local.read_result(job, 0) is None and local.list_results(job) == set()


@pytest.mark.slow
def test_a_thread_left_running_does_not_keep_the_job_alive(local):
    def start_a_thread_that_never_ends():
        import atexit
        import threading

        atexit.register(print, "atexit handlers still run")
        threading.Thread(target=threading.Event().wait, daemon=False).start()
        return "returned"

    job = make_job(local, [[(start_a_thread_that_never_ends, (), {})]])
    done = run_worker(job)  # a plain interpreter exit would join the thread: a timeout here
    assert done.returncode == 0, done.stderr
    assert "atexit handlers still run" in done.stdout
    assert results(local, job)[1] == [(True, "returned")]


@pytest.mark.slow
def test_missing_inputs_fail_the_container(local):
    job = local.job_url("run1", "never-written")
    done = run_worker(job)
    assert done.returncode == 1
    assert "FileNotFoundError" in done.stderr
    assert local.read_result(job, 0) is None


@pytest.mark.slow
def test_usage_and_bad_index(local):
    done = run_worker("", argv=[sys.executable, "-m", "batchfutures.worker"])
    assert done.returncode == 2 and "usage" in done.stderr
    job = make_job(local, [[(abs, (-1,), {})]])
    env_index = run_worker(job, index=None, argv=[sys.executable, "-c", (
        "import os, sys; os.environ['AWS_BATCH_JOB_ARRAY_INDEX'] = 'x'; "
        "from batchfutures.worker import main as worker; sys.exit(worker.main([sys.argv[1]]))"), job])
    assert env_index.returncode == 2 and "AWS_BATCH_JOB_ARRAY_INDEX" in env_index.stderr


# -- versions and loading ------------------------------------------------------------------------
@pytest.mark.slow
def test_stamp_mismatch_fails_every_item_naming_both_versions(storage):
    stamp = dict(serialization.payload_stamp(), python="2.7")  # only "python" differs
    job = make_job(storage, [[(abs, (-1,), {}), (abs, (-2,), {})]], stamp=stamp)
    done = run_worker(job)
    assert done.returncode == 0, done.stderr
    outcomes = results(storage, job)[1]
    assert len(outcomes) == 2
    for ok, error in outcomes:
        assert not ok and type(error) is EnvironmentMismatchError
        assert "Python 2.7," in str(error)
        assert f"Python {serialization.payload_stamp()['python']}" in str(error)
    assert "Python 2.7," in done.stderr  # the worker says why in the job's log


@pytest.mark.slow
def test_function_that_cannot_be_loaded(local, tmp_path, monkeypatch):
    # pickled by reference (shipping by value turned off) to a module the worker cannot import
    (tmp_path / "client_only.py").write_text("def triple(x):\n    return 3 * x\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import client_only

    job = make_job(local, [[(client_only.triple, (1,), {}), (client_only.triple, (2,), {}),
                            (abs, (-3,), {})]], by_value=False)
    done = run_worker(job)
    assert done.returncode == 0, done.stderr
    outcomes = results(local, job)[1]
    for ok, error in outcomes[:2]:  # a missing module is an environment mismatch, named
        assert not ok and type(error) is EnvironmentMismatchError
        assert "could not load the function" in str(error) and "'client_only'" in str(error)
        assert "install it in the image" in str(error) and "by value" in str(error)
    assert outcomes[2] == (True, 3)

    # shipped by value (the default), the same function runs
    job = make_job(local, [[(client_only.triple, (2,), {})]])
    assert run_worker(job).returncode == 0
    assert results(local, job)[1] == [(True, 6)]


@pytest.mark.slow
def test_missing_function_object(local):
    job = make_job(local, [[(abs, (-1,), {})]], function_urls=[local.url("runs", "r", "functions", "x.pkl")])
    assert run_worker(job).returncode == 0
    ((ok, error),) = results(local, job)[1]
    assert not ok and type(error) is RemoteError and "missing" in str(error)


# -- retries -------------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_retry_keeps_the_finished_result_and_does_not_run(local, tmp_path):
    marker = tmp_path / "ran"
    job = make_job(local, [[(marker.write_text, ("ran",), {})]])
    earlier = wire.pack_result([wire.encode_ok("first attempt")], {"attempt": "1"})
    assert local.write_result(job, 0, earlier)
    done = run_worker(job, attempt="2")
    assert done.returncode == 0, done.stderr
    assert "already" in done.stderr
    assert not marker.exists()
    assert local.read_result(job, 0) == earlier


@pytest.mark.slow
def test_a_second_run_does_not_overwrite_the_first_result(storage, tmp_path):
    log = tmp_path / "runs.log"

    def append_line(path, text):  # local: pickled by value (the worker cannot import tests/)
        with open(path, "a") as handle:
            handle.write(text + "\n")
        return text

    job = make_job(storage, [[(append_line, (str(log), "child 0"), {})],
                             [(append_line, (str(log), "child 1"), {})]])
    assert run_worker(job, 1, attempt="1").returncode == 0
    first = storage.read_result(job, 1)
    assert first is not None and log.read_text() == "child 1\n"
    again = run_worker(job, 1, attempt="2")
    assert again.returncode == 0, again.stderr
    assert "already" in again.stderr
    assert log.read_text() == "child 1\n"  # the function did not run again
    assert storage.read_result(job, 1) == first  # byte for byte: attempt "1" is kept
    assert results(storage, job, 1)[0]["attempt"] == "1"
    assert storage.list_results(job) == {1}


# -- imports ------------------------------------------------------------------------------------
@pytest.mark.slow
def test_worker_does_not_import_boto3_for_local_storage(local):
    job = make_job(local, [[(abs, (-1,), {})]])
    probe = ("import sys; from batchfutures.worker import main as worker; code = worker.main([sys.argv[1]]); "
             "print(sorted(m for m in ('boto3', 'botocore', 's3fs') if m in sys.modules)); "
             "sys.exit(code)")
    done = run_worker(job, argv=[sys.executable, "-c", probe, job])
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
    assert results(local, job)[1] == [(True, 1)]


# -- in a thread (the emulator's launcher="threads"): run(job_url, environ, ...) -----------------
def test_run_takes_the_attempts_environment_and_runs_the_items_in_this_thread(local):
    from batchfutures import signing

    def pid_of(x):
        return x, os.getpid()

    job = make_job(local, [[(pid_of, (0,), {})], [(pid_of, (x,), {}) for x in range(1, 7)]])
    environ = {"AWS_BATCH_JOB_ARRAY_INDEX": "1", "AWS_BATCH_JOB_ATTEMPT": "3",
               signing.SOURCE_VARIABLE: local.signer.source, "BATCHFUTURES_VCPUS": "4"}
    assert "AWS_BATCH_JOB_ARRAY_INDEX" not in os.environ
    assert worker.run(job, environ, fork=False) == 0
    meta, outcomes = results(local, job, 1)
    assert meta["attempt"] == "3"  # from the mapping, not os.environ
    assert outcomes == [(True, (x, os.getpid())) for x in range(1, 7)]  # no forked pool
    assert local.list_results(job) == {1}


def test_a_cancelled_run_stops_before_the_next_item_and_writes_nothing(local, tmp_path):
    from batchfutures import signing

    ran = tmp_path / "ran"

    def note(x):
        with open(ran, "a") as handle:
            handle.write(f"{x}\n")
        return x

    job = make_job(local, [[(note, (x,), {}) for x in range(5)]])
    environ = {signing.SOURCE_VARIABLE: local.signer.source}
    calls = []

    def cancelled():  # the attempt is killed while its second item runs
        calls.append(1)
        return len(calls) > 2

    assert worker.run(job, environ, fork=False, cancelled=cancelled) == worker.OOM_EXIT_STATUS
    assert ran.read_text() == "0\n1\n"
    assert not local.has_result(job, 0)
