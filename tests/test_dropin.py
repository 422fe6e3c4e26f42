"""ProcessPoolExecutor's constructor, retries that mean retries, and the user's own modules.

End-to-end on the embedded emulator: every call runs in a fresh worker process.
"""

import concurrent.futures
import os
import pickle
import sys
import textwrap
import threading
import time

import pytest

from batchfutures import BatchExecutor, EnvironmentMismatchError, InitializerFailedError, serialization
from batchfutures.emulator.retries import should_retry
from batchfutures.submission import RETRY_RULES

pytestmark = pytest.mark.slow


def _remember(path):
    with open(path, "a") as handle:
        handle.write(f"{os.getpid()}\n")


def _pid_and_mark(path, x):
    # the initializer wrote this process's pid before any item ran
    with open(path) as handle:
        pids = handle.read().split()
    return x, str(os.getpid()) in pids


def _fail_init():
    raise RuntimeError("no model here")


def _square(x):
    return x * x


def test_constructor_takes_process_pool_executor_arguments(local_env):
    with BatchExecutor(local_env, 4, None, None, (), max_tasks_per_child=3) as ex:
        assert list(ex.map(_square, range(5))) == [0, 1, 4, 9, 16]


@pytest.mark.parametrize("bad", [0, -1])
def test_max_workers_must_be_positive(local_env, bad):
    with pytest.raises(ValueError, match="max_workers must be greater than 0"):
        BatchExecutor(local_env, max_workers=bad)


def test_initializer_runs_once_per_child_before_its_items(local_env, tmp_path):
    marks = tmp_path / "pids"
    marks.write_text("")
    with BatchExecutor(local_env, initializer=_remember, initargs=(str(marks),)) as ex:
        results = list(ex.map(_pid_and_mark, [str(marks)] * 6, range(6), chunksize=2))
    assert [x for x, _ in results] == list(range(6))
    assert all(ran_first for _, ran_first in results)
    assert len(marks.read_text().split()) == 3  # three children, one initializer call each


def test_initializer_failure_breaks_only_its_children(local_env):
    with BatchExecutor(local_env, initializer=_fail_init) as ex:
        futures = ex.map_futures(_square, range(3))
        for future in futures:
            error = future.exception(timeout=120)
            assert isinstance(error, InitializerFailedError)
            assert isinstance(error, concurrent.futures.BrokenExecutor)
            assert isinstance(error.__cause__, RuntimeError)
            assert error.__cause__.args == ("no model here",)
        # later work with the same executor still runs its initializer, and fails the same way
        assert isinstance(ex.submit(_square, 2).exception(timeout=120), InitializerFailedError)


def test_unpicklable_result_raises_the_pickling_error_itself(local_env):
    def lock():
        return threading.Lock()

    with BatchExecutor(local_env) as ex:
        error = ex.submit(lock).exception(timeout=120)
    assert isinstance(error, (TypeError, pickle.PicklingError)), repr(error)
    assert "lock" in str(error)
    assert error.__cause__ is not None and "Traceback" in str(error.__cause__)


# -- retries -------------------------------------------------------------------------------------
@pytest.mark.parametrize("exit_code, reason, status_reason, retried", [
    (1, None, "Essential container in task exited", True),              # a crash
    (137, None, "Essential container in task exited", True),            # SIGKILL, not OOM
    (None, None, "Host EC2 (instance i-0123456789abcdef0) terminated.", True),
    (None, None, "Your Spot Task was interrupted.", True),
    (None, "CannotPullContainerError: pull access denied", "Task failed to start", True),
    (None, "ResourceInitializationError: unable to pull secrets", "Task failed to start", True),
    (137, "OutOfMemoryError: Container killed due to memory usage",
     "Essential container in task exited", False),
    (None, None, "Job attempt duration exceeded timeout", False),
    (None, None, "batchfutures: aborted by the user", False),
])
def test_retry_rules(exit_code, reason, status_reason, retried):
    assert should_retry(RETRY_RULES, exit_code=exit_code, reason=reason,
                        status_reason=status_reason) is retried


def _crash_first_attempt(x):
    if os.environ.get("AWS_BATCH_JOB_ATTEMPT") == "1":
        os._exit(3)
    return x + 1


def test_retries_retry_a_crashed_attempt(local_env):
    with BatchExecutor(local_env, retries=2) as ex:
        assert ex.submit(_crash_first_attempt, 41).result(timeout=120) == 42


# -- the user's own modules --------------------------------------------------------------------
def _write_module(folder, name):
    (folder / f"{name}.py").write_text(textwrap.dedent("""
        class Point:
            def __init__(self, x):
                self.x = x

        def double(p):
            return Point(p.x * 2)
    """))


def test_functions_of_the_users_own_module_travel_by_value(local_env, tmp_path, monkeypatch):
    name = "bf_user_module_" + tmp_path.name.replace("-", "_")
    _write_module(tmp_path, name)
    monkeypatch.syspath_prepend(str(tmp_path))
    module = __import__(name)
    assert name in serialization.local_modules()
    with BatchExecutor(local_env) as ex:
        result = ex.submit(module.double, module.Point(21)).result(timeout=120)
    assert isinstance(result, module.Point) and result.x == 42
    sys.modules.pop(name, None)


def test_opting_out_of_shipping_makes_a_missing_module_a_mismatch(local_env, tmp_path, monkeypatch):
    name = "bf_user_module_" + tmp_path.name.replace("-", "_")
    _write_module(tmp_path, name)
    monkeypatch.syspath_prepend(str(tmp_path))
    module = __import__(name)
    # the worker never sees the client's sys.path entry for the module's folder
    monkeypatch.delenv("PYTHONPATH", raising=False)
    with BatchExecutor(local_env, ship_local_modules=False) as ex:
        error = ex.submit(module.double, module.Point(1)).exception(timeout=120)
    sys.modules.pop(name, None)
    if error is None:
        pytest.fail("the worker imported the client's module: the emulator shares the client's path")
    assert isinstance(error, EnvironmentMismatchError), repr(error)
    assert name in str(error) and "install it in the image" in str(error)


# -- max_workers ---------------------------------------------------------------------------------
def _interval(folder, x):
    import time

    start = time.time()
    time.sleep(0.3)
    (folder / f"{x}").write_text(f"{start} {time.time()}")
    return x


def _most_at_once(folder):
    spans = [tuple(map(float, p.read_text().split())) for p in folder.iterdir()]
    events = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    most = running = 0
    for _, step in events:
        running += step
        most = max(most, running)
    return most


@pytest.mark.parametrize("workers", [1, 2])
def test_max_workers_bounds_the_children_running_at_once(tmp_path, workers):
    from batchfutures import LocalEnvironment

    env = LocalEnvironment(tmp_path / "work", max_vcpus=4)
    folder = tmp_path / "spans"
    folder.mkdir()
    try:
        with BatchExecutor(env, max_workers=workers) as ex:
            mapped = ex.map(_interval, [folder] * 5, range(5))
            submitted = [ex.submit(_interval, folder, 10 + i) for i in range(2)]
            assert list(mapped) == list(range(5))
            assert [f.result(timeout=120) for f in submitted] == [10, 11]
    finally:
        env.emulator.close()
    assert len(list(folder.iterdir())) == 7
    assert _most_at_once(folder) <= workers


# -- no stale references ------------------------------------------------------------------------
class _Model:
    def predict(self, x):
        return _Value(x)


class _Value:
    def __init__(self, x):
        self.x = x


def test_done_futures_leave_no_callable_or_result_behind(executor):
    import gc
    import weakref

    model = _Model()
    model_ref = weakref.ref(model)
    future = executor.submit(model.predict, 3)
    assert future.result(timeout=120).x == 3
    del model
    gc.collect()
    assert model_ref() is None, gc.get_referrers(model_ref())

    iterator = executor.map(_Model().predict, range(3))
    first = next(iterator)
    first_ref = weakref.ref(first)
    del first
    gc.collect()
    assert first_ref() is None  # the iterator does not keep what it yielded
    assert [v.x for v in iterator] == [1, 2]


# -- the job as a whole --------------------------------------------------------------------
def _maybe_crash(x):
    if x == 2:
        os._exit(3)
    return x


def test_job_shows_the_array_and_each_child(local_env):
    with BatchExecutor(local_env) as ex:
        futures = ex.map_futures(_maybe_crash, range(4))
        concurrent.futures.wait(futures, timeout=120)
        # A future resolves when its result is stored, which can be before Batch shows the
        # child (and so the parent) ended: as on AWS, the job's own view lags the futures.
        job_id = futures[0].job_id.split(":")[0]
        deadline = time.monotonic() + 60
        info = ex.job(job_id)
        while info.status not in ("SUCCEEDED", "FAILED") and time.monotonic() < deadline:
            time.sleep(0.05)
            info = ex.job(job_id)
    assert info.is_array and info.size == 4 and info.status == "FAILED"
    by_index = {child.index: child for child in info.children}
    assert by_index[2].status == "FAILED" and by_index[2].exit_code == 3
    assert {by_index[i].status for i in (0, 1, 3)} == {"SUCCEEDED"}


def test_local_storage_is_cleaned_of_old_finished_runs(tmp_path, monkeypatch):
    from batchfutures import LocalEnvironment, session

    monkeypatch.setenv("BATCHFUTURES_LOCAL_RETENTION_DAYS", "0")  # every finished run is old
    env = LocalEnvironment(tmp_path / "work", max_vcpus=2)
    try:
        with BatchExecutor(env) as ex:
            assert ex.submit(_square, 3).result(timeout=120) == 9
        runs = env.storage.list_runs()
        assert len(runs) == 1
        monkeypatch.setattr(session, "_cleaned_workdirs", set())
        import time

        time.sleep(1.1)  # older than the horizon, by the clock the cleanup reads
        with BatchExecutor(env) as ex:
            deadline = time.monotonic() + 60  # the cleanup runs on a thread of its own
            while time.monotonic() < deadline:
                if not any(run == runs[0][0] for run, _ in env.storage.list_runs()):
                    break
                time.sleep(0.05)
        assert not any(run == runs[0][0] for run, _ in env.storage.list_runs())
    finally:
        env.emulator.close()
