"""Futures as arguments: Batch dependencies, values read by the worker from storage."""

import pytest

from batchfutures import BatchExecutor, DependencyFailedError, wire
from batchfutures.dependencies import FutureRef, Resolver, substitute_call


def _inc(x):
    return x + 1


def _double(x):
    return 2 * x


def _total(values):
    return sum(values)


def _fail_on(x, bad):
    if x == bad:
        raise ValueError(f"bad {x}")
    return x


# -- pure ----------------------------------------------------------------------------------
def test_substitute_finds_futures_in_args_and_lists():
    marker = object()

    def replace(value):
        return "REF" if value is marker else None

    args, kwargs = substitute_call((1, marker, [marker, 2], (3, marker)), {"k": marker, "n": 4},
                                   replace)
    assert args == (1, "REF", ["REF", 2], (3, "REF")) and kwargs == {"k": "REF", "n": 4}


def test_resolver_reads_each_upstream_child_once(local):
    job_url = local.job_url("run", "key")
    outcomes = [wire.encode_ok(10), wire.encode_error(ValueError("x"))]
    local.write_result(job_url, 0, wire.pack_result(outcomes, {}))
    reads = []
    original = local.read_result
    local.read_result = lambda url, index: reads.append(index) or original(url, index)
    resolver = Resolver(local)
    ok_ref, bad_ref = FutureRef(job_url, 0, 0, "j:0"), FutureRef(job_url, 0, 1, "j:0")
    assert resolver.resolve((ok_ref, [ok_ref]), {}) == ((10, [10]), {})
    with pytest.raises(Exception) as failed:
        resolver.resolve((bad_ref,), {})
    assert type(failed.value).__name__ == "UpstreamFailed"
    assert reads == [0]


# -- end to end ----------------------------------------------------------------------------
@pytest.mark.slow
def test_submit_with_a_future_argument(executor):
    first = executor.submit(_inc, 1)
    second = executor.submit(_double, first)  # submitted at once, with dependsOn
    third = executor.submit(_total, [first, second, 10])
    assert (first.result(timeout=120), second.result(timeout=120), third.result(timeout=120)) == \
        (2, 4, 16)
    detail = executor.environment.batch.describe_jobs(jobs=[second.job_id])["jobs"][0]
    assert {"jobId": first.job_id} in detail["dependsOn"] or detail["dependsOn"]


@pytest.mark.slow
def test_map_futures_over_map_futures_is_one_n_to_n_array(executor):
    stage1 = executor.map_futures(_inc, range(6))
    stage2 = executor.map_futures(_double, stage1)
    assert [f.result(timeout=120) for f in stage2] == [2 * (x + 1) for x in range(6)]
    parent1 = stage1[0].job_id.split(":")[0]
    parent2 = stage2[0].job_id.split(":")[0]
    assert parent1 != parent2
    detail = executor.environment.batch.describe_jobs(jobs=[parent2])["jobs"][0]
    assert detail["dependsOn"] == [{"jobId": parent1, "type": "N_TO_N"}]


@pytest.mark.slow
def test_a_failed_dependency_fails_only_its_dependents(executor):
    stage1 = executor.map_futures(_fail_on, range(4), [2] * 4)
    stage2 = executor.map_futures(_inc, stage1)
    results = [f.exception(timeout=120) or f.result() for f in stage2]
    assert results[:2] == [1, 2] and results[3] == 4
    error = results[2]
    assert isinstance(error, DependencyFailedError)
    assert isinstance(error.__cause__, ValueError) and error.__cause__.args == ("bad 2",)
    # a submit given an already failed future fails at once, with the same cause
    late = executor.submit(_inc, stage1[2])
    assert isinstance(late.exception(timeout=5), DependencyFailedError)
    assert isinstance(late.exception().__cause__, ValueError)


@pytest.mark.slow
def test_cancelling_upstream_cancels_dependents(tmp_path):
    import time

    from batchfutures import LocalEnvironment

    env = LocalEnvironment(tmp_path / "work", max_vcpus=1)  # one job at a time
    try:
        with BatchExecutor(env) as ex:
            blocker = ex.submit(time.sleep, 30)
            while not blocker.running():
                time.sleep(0.05)
            waiting = ex.submit(_inc, 1)  # cannot start while the blocker runs
            dependent = ex.submit(_double, waiting)
            assert waiting.cancel()
            assert dependent.cancelled()
            blocker.abort()
    finally:
        env.emulator.close()


def _oom_or_value(x):
    if x == 1:
        import os

        os._exit(3)  # the container fails: Batch fails what depends on it
    return x


@pytest.mark.slow
def test_a_dependency_that_failed_as_a_container_is_a_dependency_error_with_its_cause(executor):
    from batchfutures import JobFailedError

    upstream = executor.submit(_oom_or_value, 1)
    dependent = executor.submit(_inc, upstream)
    error = dependent.exception(timeout=120)
    assert isinstance(error, DependencyFailedError), repr(error)
    assert isinstance(error.__cause__, JobFailedError) and error.__cause__.exit_code == 3
    assert "Dependent Job failed" not in type(error).__name__
