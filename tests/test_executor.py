"""BatchExecutor end to end on the embedded emulator: real jobs, real processes, real files."""

import asyncio
import concurrent.futures
import os
import threading
import time

import pytest

import batchfutures
from batchfutures import (
    BatchExecutor,
    BatchFuture,
    EnvironmentMismatchError,
    JobAbortedError,
    JobFailedError,
    JobMetadataExpired,
    JobTimeoutError,
    LocalEnvironment,
    MemoryLimitExceeded,
    RemoteError,
    SerializationError,
)


def square(x):
    return x * x


def fail_on(bad):
    def f(x):
        if x == bad:
            raise ValueError("bad item", x)
        return x
    return f


def wait_until(predicate, timeout=30.0, interval=0.02):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    raise AssertionError("condition not reached in time")


class CountingClient:
    """Counts the Batch API calls made through it (instrumentation, not a stand-in)."""

    def __init__(self, client):
        self._client = client
        self.calls = {}
        self.describe_sizes = []
        self._lock = threading.Lock()

    def __getattr__(self, name):
        method = getattr(self._client, name)
        if not callable(method) or name.startswith("_") or name in ("logs", "add_listener"):
            return method

        def counted(*args, **kwargs):
            with self._lock:
                self.calls[name] = self.calls.get(name, 0) + 1
                if name == "describe_jobs":
                    self.describe_sizes.append(len(kwargs.get("jobs", [])))
            return method(*args, **kwargs)
        return counted


class CountedLocalEnvironment(LocalEnvironment):
    @property
    def batch(self):
        if not hasattr(self, "_counting"):
            self._counting = CountingClient(self.emulator)
        return self._counting


# -- map ----------------------------------------------------------------------------------------
@pytest.mark.slow
def test_map_returns_results_in_order_with_chunks(executor):
    assert list(executor.map(square, range(23), chunksize=5)) == [x * x for x in range(23)]


@pytest.mark.slow
def test_map_of_lambdas_and_closures(executor):
    offset = 7
    assert list(executor.map(lambda x: x + offset, [1, 2, 3])) == [8, 9, 10]


@pytest.mark.slow
def test_map_with_several_iterables_stops_at_the_shortest(executor):
    assert list(executor.map(pow, [2, 3, 4, 5], [2, 2, 2])) == [4, 9, 16]


@pytest.mark.slow
def test_map_over_one_iterable_passes_each_item_whole(executor):
    # one iterable: each item is the only argument, tuples and None included
    items = [(1, 2), (3,), (), None, "ab"]
    assert list(executor.map(repr, items, chunksize=2)) == [repr(x) for x in items]
    assert list(executor.map(divmod, [7, 9], [2, 4])) == [(3, 1), (2, 1)]


@pytest.mark.slow
def test_map_yields_items_before_the_failing_one_then_raises_its_exception(executor):
    results = executor.map(fail_on(6), range(10), chunksize=4)
    seen = []
    with pytest.raises(ValueError) as info:
        for value in results:
            seen.append(value)
    assert seen == [0, 1, 2, 3, 4, 5]
    assert info.value.args == ("bad item", 6)
    assert "Traceback" in str(info.value.__cause__)


@pytest.mark.slow
def test_map_futures_fail_only_the_failing_items(executor):
    futures = executor.map_futures(fail_on(2), range(6), chunksize=2)
    assert all(isinstance(f, BatchFuture) for f in futures)
    done, _ = concurrent.futures.wait(futures, timeout=60)
    assert len(done) == 6
    assert [f.exception() is None for f in futures] == [True, True, False, True, True, True]
    assert [f.result() for i, f in enumerate(futures) if i != 2] == [0, 1, 3, 4, 5]
    assert futures[0].job_id.endswith(":0") and futures[2].job_id.endswith(":1")
    assert futures[2].job_id == futures[3].job_id  # one child runs a chunk of two items


@pytest.mark.slow
def test_map_timeout_counts_from_the_call(executor):
    results = executor.map(time.sleep, [10, 10], timeout=0.5)
    with pytest.raises(concurrent.futures.TimeoutError):
        list(results)


def test_chunksize_below_one_is_a_value_error(executor):
    with pytest.raises(ValueError):
        executor.map(square, [1], chunksize=0)


def test_map_of_nothing(executor):
    assert list(executor.map(square, [])) == []


# -- submit ------------------------------------------------------------------------------------
@pytest.mark.slow
def test_submit_returns_a_real_future(executor):
    future = executor.submit(square, 12)
    assert isinstance(future, concurrent.futures.Future)
    assert future.result(timeout=60) == 144
    assert future.status == "SUCCEEDED" and future.job_id


@pytest.mark.slow
def test_submit_passes_keyword_arguments(executor):
    assert executor.submit(int, "ff", base=16).result(timeout=60) == 255


@pytest.mark.slow
def test_close_submits_go_out_as_one_array_job(tmp_path):
    env = CountedLocalEnvironment(tmp_path, max_vcpus=2)
    with BatchExecutor(env) as executor:
        futures = [executor.submit(square, i) for i in range(12)]
        assert [f.result(timeout=60) for f in futures] == [i * i for i in range(12)]
    assert env.batch.calls["submit_job"] == 1
    parents = {f.job_id.rpartition(":")[0] for f in futures}
    assert len(parents) == 1
    assert sorted(int(f.job_id.rpartition(":")[2]) for f in futures) == list(range(12))


@pytest.mark.slow
def test_settings_views_submit_separately_and_share_the_poller(tmp_path):
    env = CountedLocalEnvironment(tmp_path, max_vcpus=2)
    with BatchExecutor(env) as executor:
        big = executor.with_settings(memory="1GiB")
        a, b = executor.submit(square, 2), big.submit(square, 3)
        assert (a.result(timeout=60), b.result(timeout=60)) == (4, 9)
        assert big._session is executor._session
    assert env.batch.calls["submit_job"] == 2


@pytest.mark.slow
def test_as_completed_wait_and_callbacks(executor):
    seen = []
    futures = [executor.submit(square, i) for i in range(5)]
    for future in futures:
        future.add_done_callback(lambda f: seen.append(f.result()))
    assert sorted(f.result() for f in concurrent.futures.as_completed(futures, timeout=60)) == \
        [0, 1, 4, 9, 16]
    done, not_done = concurrent.futures.wait(futures, timeout=60)
    assert len(done) == 5 and not not_done
    wait_until(lambda: len(seen) == 5)
    assert sorted(seen) == [0, 1, 4, 9, 16]


@pytest.mark.slow
def test_asyncio_wrap_future_and_run_in_executor(executor):
    async def main():
        loop = asyncio.get_running_loop()
        first = await asyncio.wrap_future(executor.submit(square, 5))
        second = await loop.run_in_executor(executor, square, 6)
        return first, second
    assert asyncio.run(main()) == (25, 36)


@pytest.mark.slow
def test_user_exception_comes_back_as_itself(executor):
    class Custom(Exception):
        pass

    def boom():
        raise Custom("nope", 3)
    error = executor.submit(boom).exception(timeout=60)
    assert type(error).__name__ == "Custom" and error.args == ("nope", 3)
    assert "boom" in str(error.__cause__)
    future = executor.submit(boom)
    assert future.exception(timeout=60) is not None and future.status == "SUCCEEDED"


@pytest.mark.slow
def test_unpicklable_exception_becomes_remote_error(executor):
    def raise_unpicklable():
        import threading as t

        class Bad(Exception):
            def __init__(self):
                super().__init__("has a lock")
                self.lock = t.Lock()
        raise Bad()
    error = executor.submit(raise_unpicklable).exception(timeout=60)
    assert isinstance(error, RemoteError) and "has a lock" in error.traceback


def test_unpicklable_arguments_raise_at_once_and_upload_nothing(local_env):
    executor = BatchExecutor(local_env)
    lock = threading.Lock()
    with pytest.raises(SerializationError):
        executor.submit(square, lock)
    with pytest.raises(SerializationError):
        executor.map(square, [1, lock, 3])
    with pytest.raises(SerializationError):
        executor.submit(lambda: lock)
    executor.shutdown()
    storage = local_env.workdir / "storage"
    assert not storage.exists() or not [p for p in storage.rglob("*") if p.is_file()]
    assert local_env.batch.list_jobs(jobQueue="batchfutures", jobStatus="SUCCEEDED")["jobSummaryList"] == []


# -- shutdown ----------------------------------------------------------------------------------
def test_submit_and_map_after_shutdown_raise(local_env):
    executor = BatchExecutor(local_env)
    executor.shutdown()
    with pytest.raises(RuntimeError):
        executor.submit(square, 1)
    with pytest.raises(RuntimeError):
        executor.map(square, [1])


@pytest.mark.slow
def test_shutdown_waits_for_every_future(local_env):
    executor = BatchExecutor(local_env)
    futures = [executor.submit(square, i) for i in range(4)]
    executor.shutdown(wait=True)
    assert all(f.done() for f in futures)
    assert [f.result() for f in futures] == [0, 1, 4, 9]


@pytest.mark.slow
def test_shutdown_cancel_futures_cancels_queued_calls_and_their_jobs(tmp_path):
    env = LocalEnvironment(tmp_path, max_vcpus=1)
    executor = BatchExecutor(env)
    running = executor.submit(time.sleep, 3)
    wait_until(lambda: running.running(), timeout=30)
    queued = [executor.submit(square, i) for i in range(3)]
    executor._session.flush_all()
    wait_until(lambda: all(f.job_id for f in queued))
    executor.shutdown(wait=True, cancel_futures=True)
    assert all(f.cancelled() for f in queued)
    assert running.result() is None  # a started call is not cancelled
    jobs = env.batch.describe_jobs(jobs=[f.job_id for f in queued])["jobs"]
    wait_until(lambda: all(j["status"] == "FAILED" for j in
                           env.batch.describe_jobs(jobs=[f.job_id for f in queued])["jobs"]))
    assert jobs and all(j["status"] in ("FAILED", "RUNNABLE") for j in jobs)


def wait_for_path(path):
    """Run until ``path`` exists: the test says when the call may end (never a guessed sleep)."""
    import os
    import time

    while not os.path.exists(path):
        time.sleep(0.02)


@pytest.mark.slow
def test_cancel_succeeds_only_before_the_call_starts(tmp_path):
    env = LocalEnvironment(tmp_path / "work", max_vcpus=1)
    gate = tmp_path / "gate"
    with BatchExecutor(env) as executor:
        running = executor.submit(wait_for_path, str(gate))  # holds the one vCPU until the gate
        wait_until(running.running)
        assert running.cancel() is False
        queued = executor.submit(square, 3)
        executor._session.flush_all()
        wait_until(lambda: queued.job_id is not None)
        assert queued.cancel() is True
        wait_until(lambda: env.batch.describe_jobs(jobs=[queued.job_id])["jobs"][0]["status"] == "FAILED")
        gate.write_text("")
        assert running.result(timeout=60) is None


# -- failures ----------------------------------------------------------------------------------
@pytest.mark.slow
def test_abort_terminates_a_running_job(executor):
    future = executor.submit(time.sleep, 60)
    wait_until(lambda: future.status == "RUNNING")
    assert future.abort(reason="enough") is True
    error = future.exception(timeout=30)
    assert isinstance(error, JobAbortedError) and "enough" in error.status_reason
    env = executor.environment
    wait_until(lambda: env.batch.describe_jobs(jobs=[future.job_id])["jobs"][0]["status"] == "FAILED")


@pytest.mark.slow
def test_out_of_memory_is_typed(executor):
    small = executor.with_settings(memory=256)
    future = small.submit(lambda: len(bytearray(600 * 1024 * 1024)))
    error = future.exception(timeout=60)
    assert isinstance(error, MemoryLimitExceeded)
    assert error.memory_mib == 256 and error.exit_code == 137
    assert "256 MiB" in str(error)
    assert future.status == "FAILED" and future.exit_code == 137


@pytest.mark.slow
def test_timeout_is_typed(executor):
    future = executor.with_settings(timeout=1).submit(time.sleep, 30)
    error = future.exception(timeout=60)
    assert isinstance(error, JobTimeoutError)
    assert "timeout" in error.status_reason


@pytest.mark.slow
def test_container_exit_is_a_job_failure_with_its_code(executor):
    future = executor.submit(os._exit, 3)
    error = future.exception(timeout=60)
    assert type(error) is JobFailedError and error.exit_code == 3
    assert future.exit_code == 3


def exit_quietly_on(bad):
    def f(x):
        if x == bad:
            os._exit(0)  # the process ends "successfully" before the worker records anything
        return x
    return f


@pytest.mark.slow
def test_a_child_that_succeeded_without_a_result_fails_only_its_items(executor):
    futures = executor.map_futures(exit_quietly_on(2), range(6))
    assert [f.result(timeout=60) for i, f in enumerate(futures) if i != 2] == [0, 1, 3, 4, 5]
    error = futures[2].exception(timeout=60)
    assert isinstance(error, RemoteError) and "succeeded but wrote no result" in str(error)
    assert futures[2].status == "SUCCEEDED"


@pytest.mark.slow
def test_one_failed_child_fails_only_its_items(executor):
    futures = executor.map_futures(lambda x: os._exit(4) if x == 1 else x, range(4))
    concurrent.futures.wait(futures, timeout=60)
    assert isinstance(futures[1].exception(), JobFailedError)
    assert [futures[i].result() for i in (0, 2, 3)] == [0, 2, 3]


@pytest.mark.slow
def test_version_mismatch_names_both_versions(executor, monkeypatch):
    real = batchfutures.serialization.payload_stamp

    def stamped_elsewhere():
        stamp = dict(real())
        stamp.update(python="2.7.18", python_minor="2.7")
        return stamp
    monkeypatch.setattr(batchfutures.serialization, "payload_stamp", stamped_elsewhere)
    error = executor.submit(square, 3).exception(timeout=60)
    assert isinstance(error, EnvironmentMismatchError)
    assert "2.7" in str(error) and "3." in str(error)


@pytest.mark.slow
def test_log_holds_what_the_function_printed(executor):
    future = executor.submit(print, "hello from the job")
    future.result(timeout=60)
    assert "hello from the job" in future.log()


# -- attach and metadata expiry ----------------------------------------------------------------
@pytest.mark.slow
def test_attach_from_a_second_executor(local_env):
    with BatchExecutor(local_env) as first:
        futures = first.map_futures(square, range(6), chunksize=2)
        concurrent.futures.wait(futures, timeout=60)
        array_id = futures[0].job_id.rpartition(":")[0]
    with BatchExecutor(LocalEnvironment(local_env.workdir)) as second:
        again = second.attach(array_id)
        assert [f.result(timeout=60) for f in again] == [x * x for x in range(6)]
        child = second.attach(f"{array_id}:1")
        assert [f.result(timeout=60) for f in child] == [4, 9]


@pytest.mark.slow
def test_expired_metadata_with_a_stored_result_still_yields_it(tmp_path):
    env = LocalEnvironment(tmp_path, metadata_ttl=1)
    with BatchExecutor(env) as executor:
        future = executor.submit(square, 9)
        assert future.result(timeout=60) == 81
        job_id = future.job_id
    wait_until(lambda: not env.batch.describe_jobs(jobs=[job_id])["jobs"], timeout=30, interval=0.2)
    with BatchExecutor(LocalEnvironment(tmp_path, metadata_ttl=1)) as again:
        assert again.attach(job_id).result(timeout=30) == 81


@pytest.mark.slow
def test_expired_metadata_without_a_result_raises(tmp_path):
    env = LocalEnvironment(tmp_path, metadata_ttl=1)
    with BatchExecutor(env) as executor:
        future = executor.submit(square, 9)
        future.result(timeout=60)
        job_id = future.job_id
    for path in (tmp_path / "storage").rglob("results/*"):
        path.unlink()
    wait_until(lambda: not env.batch.describe_jobs(jobs=[job_id])["jobs"], timeout=30, interval=0.2)
    with BatchExecutor(LocalEnvironment(tmp_path, metadata_ttl=1)) as again:
        with pytest.raises(JobMetadataExpired):
            again.attach(job_id).result(timeout=30)


# -- the poller's budget -----------------------------------------------------------------------
@pytest.mark.slow
def test_poller_calls_grow_with_jobs_not_items(tmp_path):
    env = CountedLocalEnvironment(tmp_path, max_vcpus=2)
    with BatchExecutor(env) as executor:
        results = list(executor.map(square, range(5000), chunksize=250))
        polls = executor._session.poller.polls
    assert results == [x * x for x in range(5000)]
    calls = env.batch.calls
    assert calls["submit_job"] == 1  # 20 children, one array job
    assert max(env.batch.describe_sizes) <= 100
    # one DescribeJobs per poll for one outstanding job; listings only when counts changed
    assert calls["describe_jobs"] <= polls + 2
    assert calls.get("list_jobs", 0) <= 2 * polls
    assert sum(calls.values()) < 5000 / 10


@pytest.mark.slow
def test_throttled_batch_api_is_retried_and_every_future_resolves(local_env):
    local_env.emulator.inject_faults(0.3, seed=7)
    try:
        with BatchExecutor(local_env) as executor:
            assert list(executor.map(square, range(30), chunksize=3)) == [x * x for x in range(30)]
            assert executor.submit(square, 4).result(timeout=60) == 16
        assert local_env.emulator.faults.injected > 0
    finally:
        local_env.emulator.inject_faults(0)


def test_disabled_queue_is_a_configuration_error_before_any_upload(local_env):
    local_env.emulator.update_job_queue(jobQueue="batchfutures", state="DISABLED")
    try:
        executor = BatchExecutor(local_env)
        with pytest.raises(batchfutures.ConfigurationError, match="DISABLED"):
            executor.map(square, [1, 2])
        error = executor.submit(square, 1).exception(timeout=30)
        assert isinstance(error, batchfutures.ConfigurationError)
        executor.shutdown()
        storage = local_env.workdir / "storage"
        assert not storage.exists() or not [p for p in storage.rglob("*") if p.is_file()]
    finally:
        local_env.emulator.update_job_queue(jobQueue="batchfutures", state="ENABLED")


@pytest.mark.slow
def test_failure_carries_the_tail_of_the_log(executor):
    def crash():
        print("about to crash")
        os._exit(5)
    error = executor.submit(crash).exception(timeout=60)
    assert isinstance(error, JobFailedError) and "about to crash" in error.log_tail


@pytest.mark.slow
def test_log_of_a_job_that_has_not_started_says_so(tmp_path):
    env = LocalEnvironment(tmp_path, max_vcpus=1)
    with BatchExecutor(env) as executor:
        running = executor.submit(time.sleep, 30)  # holds the only vCPU
        wait_until(running.running, timeout=30)
        waiting = executor.submit(square, 2)  # stays RUNNABLE behind it
        executor._session.flush_all()
        wait_until(lambda: waiting.status == "RUNNABLE")
        assert "no log yet" in waiting.log() and "RUNNABLE" in waiting.log()
        waiting.cancel()
        running.abort()
