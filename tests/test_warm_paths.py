"""Warm pools take what used to fall back to cold jobs (issue 31): futures as arguments
(awaited on the client), retry_on_oom (a call killed for memory runs again on a pool with more),
dry_run (what would be sent, no worker started); nodes > 1 stays cold, said once."""

import logging

import pytest
from botocore.session import get_session
from botocore.validate import ParamValidator

from batchfutures import BatchExecutor, DryRunResult, LocalEnvironment
from batchfutures.errors import DependencyFailedError, MemoryLimitExceeded
from batchfutures.oomretry import Decision, Verdict
from batchfutures.settings import JobSettings
from batchfutures.warmpool import (
    WarmDryRun,
    futures_among,
    oom_retry_settings,
    resolved,
    runs_warm,
    window_for,
)


def square(x):
    return x * x


def total(*values, extra=()):
    return sum(values) + sum(extra)


def waits_for(path):
    """Returns 3 once ``path`` exists (the test creates it when it is ready)."""
    import os
    import time

    deadline = time.monotonic() + 60
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.01)
    return 3


def fails(x):
    raise ValueError(f"bad {x}")


def allocates(mib):
    block = bytearray(mib * 1024 * 1024)
    for i in range(0, len(block), 4096):  # touched: resident, as the kernel counts it
        block[i] = 1
    return len(block) // (1024 * 1024)


@pytest.fixture
def env(tmp_path):
    environment = LocalEnvironment(tmp_path / "work", max_vcpus=2)
    yield environment
    environment.emulator.close()


# -- decisions ---------------------------------------------------------------------------------
@pytest.mark.parametrize("settings, warm", [
    (JobSettings(), False),
    (JobSettings(keepalive=30), True),
    (JobSettings(keepalive=30, retry_on_oom=2), True),  # retried on a pool with more memory
    (JobSettings(keepalive=30, nodes=2), False),  # a multi-node job per call
    (JobSettings(nodes=2), False),
])
def test_which_calls_run_on_warm_workers(settings, warm):
    assert runs_warm(settings) is warm


def test_multi_node_calls_under_keepalive_are_said_to_stay_cold_once(caplog, monkeypatch):
    import threading

    from batchfutures import warmpool

    monkeypatch.setattr(warmpool, "_MULTINODE_NOTED", threading.Event())
    with caplog.at_level(logging.INFO, logger="batchfutures"):
        for _ in range(3):
            assert not runs_warm(JobSettings(keepalive=30, nodes=3))
    said = [r.getMessage() for r in caplog.records if "multi-node" in r.getMessage()]
    assert len(said) == 1 and "nodes=3" in said[0] and "not on warm workers" in said[0]


@pytest.mark.parametrize("decision, memory, vcpus", [
    (Decision(Verdict.RESUBMIT, memory_mib=4096), 4096, 1.0),
    (Decision(Verdict.RESUBMIT, memory_mib=8192, vcpus=2.0), 8192, 2.0),  # a Fargate pair
])
def test_a_retry_for_memory_has_settings_of_its_own(decision, memory, vcpus):
    settings = JobSettings(keepalive=30, retry_on_oom=2, memory=2048)
    retry = oom_retry_settings(settings, decision)
    assert (retry.memory, retry.vcpus) == (memory, vcpus)
    assert retry.keepalive == 30 and retry.retry_on_oom == 2  # a pool of its own, still warm
    assert retry != settings


def test_futures_among_arguments_are_found_where_has_future_looks():
    import concurrent.futures

    from batchfutures.futures import BatchFuture

    a, b = BatchFuture(None), BatchFuture(None)
    a.set_result(2)
    b.set_result(None)  # a result of None is a result, not "no future here"
    found = futures_among((a, [b, 1], (a,), 5), {"k": b, "n": [[a]]})
    assert found == [a, b]  # each once; a future in a nested list is not looked for
    assert resolved(a) == 2 and resolved([b, 1]) == [None, 1] and resolved((a, 3)) == (2, 3)
    assert resolved("text") == "text"
    assert isinstance(concurrent.futures.Future(), concurrent.futures.Future)


# -- dry run -----------------------------------------------------------------------------------
def test_a_warm_dry_run_says_what_it_would_do_and_starts_no_worker(env):
    model = get_session().get_service_model("batch").operation_model("SubmitJob").input_shape
    with BatchExecutor(env, dry_run=True, keepalive=30, max_workers=2) as ex:
        errors = [f.exception(timeout=30) for f in ex.map_futures(square, range(12))]
        submitted = ex.submit(square, 3).exception(timeout=30)
        pools = list(ex._session.warm_pools.values())
    assert all(isinstance(e, DryRunResult) for e in errors + [submitted])
    assert len(pools) == 1 and isinstance(pools[0], WarmDryRun)
    first = errors[0]
    assert len(first.requests) == 2  # max_workers workers, one SubmitJob each, none sent
    for request in first.requests:
        assert not ParamValidator().validate(request, model).has_errors()
        assert "--warm" in request["containerOverrides"]["command"]
    assert submitted.requests == []  # the two workers would be running already
    operations = [r["Operation"] for r in first.sqs_requests]
    assert operations.count("CreateQueue") == 2 and "SendMessageBatch" in operations
    assert sum(r["Entries"] for r in first.sqs_requests if "Entries" in r) == 12
    assert any("/functions/" in key for key, _ in first.objects)
    assert "no worker started" in str(first)
    assert env.batch.list_jobs(jobQueue=env.job_queue, jobStatus="RUNNING")["jobSummaryList"] == []


# -- end to end --------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_future_as_an_argument_is_awaited_and_its_call_runs_on_the_pool(env):
    with BatchExecutor(env, keepalive=30, max_workers=2, echo_output=False) as ex:
        a = ex.submit(square, 3)
        b = ex.submit(total, a, 1, extra=[a, ex.submit(square, 2)])
        c = ex.submit(square, b)
        assert c.result(timeout=60) == (9 + 1 + 9 + 4) ** 2
        pool = next(iter(ex._session.warm_pools.values()))
        assert b.job_id in pool.workers and c.job_id in pool.workers  # on the warm workers
        assert ex._session.submitter.submitted_jobs == []  # no cold job
        # many dependents of one upstream, and an upstream already done
        later = [ex.submit(total, a, i) for i in range(window_for(2) + 4)]
        assert [f.result(timeout=60) for f in later] == [9 + i for i in range(len(later))]


@pytest.mark.slow
def test_a_warm_map_over_a_done_jobs_futures_reads_their_results_on_the_worker(env):
    with BatchExecutor(env, keepalive=30, max_workers=1, echo_output=False) as ex:
        cold = ex.with_settings(keepalive=0)
        done = [cold.submit(square, x) for x in (2, 3)]
        assert [f.result(timeout=60) for f in done] == [4, 9]
        futures = ex.map_futures(square, [done[0], 5, done[1]])
        assert [f.result(timeout=60) for f in futures] == [16, 25, 81]
        pool = next(iter(ex._session.warm_pools.values()))
        assert all(f.job_id in pool.workers for f in futures)  # on the warm worker


@pytest.mark.slow
def test_a_failed_or_cancelled_argument_settles_its_dependents(env):
    with BatchExecutor(env, keepalive=30, max_workers=1, echo_output=False) as ex:
        bad = ex.submit(fails, 1)
        dependent = ex.submit(square, bad)
        with pytest.raises(DependencyFailedError) as raised:
            dependent.result(timeout=60)
        assert isinstance(raised.value.__cause__, ValueError)
        # a dependent waiting for its argument can be cancelled: it was never sent
        gate = env.workdir / "gate"
        slow = ex.submit(waits_for, str(gate))
        waiting = ex.submit(square, slow)
        assert waiting.cancel() and waiting.cancelled()
        gate.touch()
        assert slow.result(timeout=60) == 3
        assert ex.submit(square, 5).result(timeout=60) == 25  # the pool goes on
        assert waiting.cancelled()
        # an argument cancelled before it was sent cancels its dependent
        second_gate = env.workdir / "second gate"
        blocker = ex.submit(waits_for, str(second_gate))
        queued = [ex.submit(square, i) for i in range(window_for(1) + 2)]  # the last not sent
        dependent = ex.submit(square, queued[-1])
        assert queued[-1].cancel()
        assert dependent.cancelled()
        second_gate.touch()
        assert blocker.result(timeout=60) == 3
        assert [f.result(timeout=60) for f in queued[:-1]] == [i * i for i in range(
            len(queued) - 1)]


@pytest.mark.slow
def test_a_call_killed_for_memory_runs_again_on_a_pool_with_more(env):
    with BatchExecutor(env, keepalive=30, max_workers=1, memory=300, retry_on_oom=2,
                       echo_output=False) as ex:
        assert ex.submit(allocates, 10).result(timeout=60) == 10
        big = ex.submit(allocates, 450)  # over 300 MiB, under 600
        assert big.result(timeout=120) == 450
        pools = ex._session.warm_pools
        memories = sorted(settings.memory for settings in pools)
        assert memories == [300, 600]
        retry_pool = next(p for s, p in pools.items() if s.memory == 600)
        assert big.job_id in retry_pool.workers  # its job id moved to the worker that ran it
        small = ex.submit(allocates, 5)  # the first pool goes on
        assert small.result(timeout=60) == 5
        assert small.job_id not in retry_pool.workers


@pytest.mark.slow
def test_a_call_killed_for_memory_on_every_try_names_its_tries(env):
    with BatchExecutor(env, keepalive=30, max_workers=1, memory=300, retry_on_oom=1,
                       echo_output=False) as ex:
        with pytest.raises(MemoryLimitExceeded) as raised:
            ex.submit(allocates, 2000).result(timeout=120)
        assert raised.value.tried_mib == (300, 600)
        assert "retry_on_oom" in str(raised.value)
        assert ex.submit(square, 4).result(timeout=60) == 16


def big(n):
    return b"r" * n


@pytest.mark.slow
def test_on_the_local_queues_only_large_results_are_stored(env):
    from batchfutures.warmwire import INLINE_LIMIT

    with BatchExecutor(env, keepalive=30, max_workers=1, echo_output=False) as ex:
        assert ex.submit(square, 3).result(timeout=60) == 9
        assert len(ex.submit(big, INLINE_LIMIT + 1000).result(timeout=60)) == INLINE_LIMIT + 1000
        pool = next(iter(ex._session.warm_pools.values()))
        stored = [env.storage.has_result(pool.pool_url, n) for n in (0, 1)]
    assert stored == [False, True]  # the small one came in its completion message alone
