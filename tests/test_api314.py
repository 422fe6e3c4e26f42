"""Python 3.14's Executor API on every Python: map(buffersize=), terminate_workers(),
kill_workers(), and `_max_workers` (the attribute Dask reads), on the embedded emulator."""

import itertools
import logging
import os
import time

import pytest
from loopback_proxy import Answer, Forward, LoopbackProxy
from s3server import emulator_endpoint, emulator_environment

from batchfutures import BatchExecutor, JobAbortedError, LocalEnvironment
from batchfutures.emulator.runtime import host
from batchfutures.environments import FALLBACK_MAX_VCPUS, queue_max_vcpus


def square(x):
    return x * x


def fail_at(x):
    if x == 5:
        raise KeyError("five")
    return x


def sleep_and_record(folder, seconds):
    with open(os.path.join(folder, f"pid-{os.getpid()}"), "w") as handle:
        handle.write(str(os.getpid()))
    time.sleep(seconds)
    return "finished"


def counted(drawn, values):
    """``values``, noting each item as map reads it from the iterable."""
    for value in values:
        drawn.append(value)
        yield value


def wait_until(predicate, timeout=60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError("condition not reached in time")


# -- map(buffersize=) --------------------------------------------------------------------------
@pytest.mark.parametrize("buffersize", [0, -1])
def test_buffersize_below_one_is_refused(executor, buffersize):
    with pytest.raises(ValueError):
        executor.map(square, range(3), buffersize=buffersize)


def test_buffersize_must_be_an_integer(executor):
    with pytest.raises(TypeError):
        executor.map(square, range(3), buffersize="2")


@pytest.mark.slow
def test_buffersize_reads_only_that_many_items_before_iteration(executor):
    # as CPython's test_map_buffersize_when_buffer_is_full: the map runs what it read
    items = iter(range(10))
    executor.map(square, items, buffersize=3)
    executor.shutdown(wait=True)
    assert next(items) == 3


@pytest.mark.slow
def test_endless_iterable_with_a_consumer_that_stops(executor):
    drawn = []
    results = executor.map(square, counted(drawn, itertools.count()), buffersize=4)
    taken = []
    for value in results:
        taken.append(value)
        # never more than buffersize items submitted ahead of the ones yielded
        assert len(drawn) <= len(taken) + 4
        if len(taken) == 10:
            break
    assert taken == [x * x for x in range(10)]
    results.close()
    assert len(drawn) <= 14


@pytest.mark.slow
def test_buffersize_counts_items_with_chunksize(executor):
    drawn = []
    results = executor.map(square, counted(drawn, range(40)), chunksize=3, buffersize=7)
    assert len(drawn) == 6  # two children of three items: a third would pass 7 items ahead
    out = []
    for value in results:
        out.append(value)
        assert len(drawn) <= len(out) + 7
    assert out == [x * x for x in range(40)]


@pytest.mark.slow
def test_buffersize_smaller_than_chunksize_makes_smaller_children(executor):
    drawn = []
    results = executor.map(square, counted(drawn, range(9)), chunksize=5, buffersize=2)
    assert len(drawn) == 2
    assert list(results) == [x * x for x in range(9)]


@pytest.mark.slow
def test_buffersize_with_several_iterables_and_a_failure(executor):
    assert list(executor.map(pow, itertools.count(), [2] * 6, buffersize=2)) == \
        [x ** 2 for x in range(6)]
    results = executor.map(fail_at, range(100), buffersize=3, chunksize=2)
    assert [next(results) for _ in range(5)] == [0, 1, 2, 3, 4]
    with pytest.raises(KeyError, match="five"):
        next(results)


# -- terminate_workers(), kill_workers() -------------------------------------------------------
def pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie not reaped yet is dead too
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow
@pytest.mark.parametrize("method", ["terminate_workers", "kill_workers"])
def test_stopping_the_workers_stops_every_unfinished_job(local_env, tmp_path, method):
    folder = str(tmp_path / "pids")
    os.mkdir(folder)
    ex = BatchExecutor(local_env)
    done = ex.submit(square, 3)
    assert done.result(timeout=60) == 9
    running = [ex.submit(sleep_and_record, folder, 300) for _ in range(2)]
    mapped = ex.map(sleep_and_record, [folder] * 3, [300] * 3)
    wait_until(lambda: len(os.listdir(folder)) == 2)  # max_vcpus=2: two run, three wait
    pids = [int(name[4:]) for name in os.listdir(folder)]
    unsent = ex.submit(square, 4)  # still in the coalescing buffer

    getattr(ex, method)()

    for future in running + [unsent]:
        with pytest.raises(JobAbortedError):
            future.result(timeout=60)
    with pytest.raises(JobAbortedError):
        next(mapped)
    assert done.result() == 9  # what had finished keeps its result
    wait_until(lambda: not any(pid_alive(pid) for pid in pids))
    assert len(os.listdir(folder)) == 2  # the waiting calls never started
    with pytest.raises(RuntimeError):
        ex.submit(square, 5)
    ex.shutdown(wait=True)  # already shut down: returns


def test_stopping_an_idle_executor_shuts_it_down(executor):
    executor.kill_workers()
    with pytest.raises(RuntimeError):
        executor.map(square, range(2))


# -- _max_workers ------------------------------------------------------------------------------
@pytest.mark.slow
def test_max_workers_given_wins(local_env):
    ex = BatchExecutor(local_env, max_workers=3, vcpus=2)
    try:
        assert ex._max_workers == 3
    finally:
        ex.shutdown()


def test_max_workers_from_the_local_vcpus(tmp_path):
    env = LocalEnvironment(tmp_path / "w", max_vcpus=8)
    ex = BatchExecutor(env)
    try:
        assert ex._max_workers == 8
        assert ex.with_settings(vcpus=2)._max_workers == 4
        assert ex.with_settings(vcpus=3)._max_workers == 2
        assert ex.with_settings(vcpus=0.5)._max_workers == 16
    finally:
        ex.shutdown()
    default = BatchExecutor(LocalEnvironment(tmp_path / "d"))
    try:
        assert default._max_workers == host.cpu_count()
    finally:
        default.shutdown()


class Queues:
    """A Batch API of two calls, answering as AWS does (DescribeJobQueues,
    DescribeComputeEnvironments) for a queue over an on-demand, a Spot and a disabled CE."""

    def describe_job_queues(self, jobQueues):
        assert jobQueues == ["q"]
        arn = "arn:aws:batch:us-east-1:123456789012:compute-environment/"
        return {"jobQueues": [{"jobQueueName": "q", "computeEnvironmentOrder": [
            {"order": 1, "computeEnvironment": arn + "od"},
            {"order": 2, "computeEnvironment": arn + "spot"},
            {"order": 3, "computeEnvironment": arn + "off"},
        ]}]}

    def describe_compute_environments(self, computeEnvironments):
        assert len(computeEnvironments) == 3
        return {"computeEnvironments": [
            {"computeEnvironmentName": "od", "state": "ENABLED", "type": "MANAGED",
             "computeResources": {"maxvCpus": 64}},
            {"computeEnvironmentName": "spot", "state": "ENABLED", "type": "MANAGED",
             "computeResources": {"maxvCpus": 192}},
            {"computeEnvironmentName": "off", "state": "DISABLED", "type": "MANAGED",
             "computeResources": {"maxvCpus": 1000}},
        ]}


def test_queue_max_vcpus_sums_the_enabled_compute_environments():
    assert queue_max_vcpus(Queues(), "q") == 256


def test_queue_max_vcpus_without_a_managed_compute_environment():
    class Unmanaged(Queues):
        def describe_compute_environments(self, computeEnvironments):
            return {"computeEnvironments": [{"computeEnvironmentName": "own", "state": "ENABLED",
                                             "type": "UNMANAGED"}]}

    with pytest.raises(ValueError, match="maxvCpus"):
        queue_max_vcpus(Unmanaged(), "q")


def test_max_workers_on_the_aws_path_reads_the_queues_compute_environments(tmp_path, s3_endpoint):
    # stock boto3 against the emulator's endpoint: DescribeJobQueues, then
    # DescribeComputeEnvironments (maxvCpus: the emulator's max_vcpus)
    with emulator_endpoint(tmp_path / "emulator", max_vcpus=2):
        ex = BatchExecutor(emulator_environment("bf-max-workers"), vcpus=1)
        try:
            assert ex._max_workers == 2
            assert ex.with_settings(vcpus=4)._max_workers == 1  # never less than one call
        finally:
            ex.shutdown()


def test_max_workers_on_the_aws_path_falls_back_when_unreadable(tmp_path, s3_endpoint, caplog,
                                                                monkeypatch):
    # DescribeComputeEnvironments refused (a client policy without it): the fallback, said
    # once in the log
    refused = Answer(400, b'{"__type": "AccessDeniedException", "message": "not allowed"}',
                     {"x-amzn-ErrorType": "AccessDeniedException"})

    def rule(request):
        return refused if request.path.startswith("/v1/describecomputeenvironments") else Forward()

    with emulator_endpoint(tmp_path / "emulator", max_vcpus=2):
        with LoopbackProxy(os.environ["AWS_ENDPOINT_URL_BATCH"], rule) as proxy, \
                monkeypatch.context() as patch:  # undone before emulator_endpoint's own undo
            patch.setenv("AWS_ENDPOINT_URL_BATCH", proxy.url)
            ex = BatchExecutor(emulator_environment("bf-max-workers"), vcpus=4)
            try:
                with caplog.at_level(logging.WARNING, logger="batchfutures"):
                    assert ex._max_workers == int(FALLBACK_MAX_VCPUS) // 4
                    assert ex.with_settings(vcpus=1)._max_workers == int(FALLBACK_MAX_VCPUS)
                warnings = [r for r in caplog.records if "maxvCpus" in r.getMessage()]
                assert len(warnings) == 1 and "batchfutures" in warnings[0].getMessage()
                assert any(r.path.startswith("/v1/describecomputeenvironments")
                           for r in proxy.requests)
            finally:
                ex.shutdown()
