"""A warm map over futures (issue 31): an item that takes a warm call's future waits for it on
the client, per child, as submit does on warm workers; the other items go at once; a failed
argument fails its item only (DependencyFailedError), a cancelled one cancels it; results in
order; shutdown(wait=True) waits for the items still waiting."""

import concurrent.futures
import threading

import pytest

from batchfutures import BatchExecutor
from batchfutures.errors import DependencyFailedError
from batchfutures.mapping import held_on_client
from batchfutures.warmpool import (
    CANCEL,
    CANCELLED,
    FAILED,
    NONE,
    PART,
    RUN,
    SEND,
    item_fate,
    merged_outcomes,
    release_plan,
    window_for,
)


def square(x):
    return x * x


def pair(a, b):
    return (a, b)


def fails_on_two(x):
    if x == 2:
        raise ValueError("two")
    return x


def waits_for(path):
    """Returns 3 once ``path`` exists (the test creates it when it is ready)."""
    import os
    import time

    deadline = time.monotonic() + 60
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.01)
    return 3


# -- decisions --------------------------------------------------------------------------------
@pytest.mark.parametrize("on_batch_jobs, held", [
    ([], False),                 # no future: sent at once
    ([True], False),             # a Batch job's future: read by the worker / dependsOn
    ([True, True], False),
    ([False], True),             # a warm call's (or not sent yet): awaited on the client
    ([True, False], True),       # one such among them holds the child
])
def test_which_children_are_held_on_the_client(on_batch_jobs, held):
    assert held_on_client(on_batch_jobs) is held


@pytest.mark.parametrize("states, fate", [
    ([], RUN),
    ([RUN, RUN], RUN),
    ([RUN, FAILED], FAILED),
    ([FAILED, CANCELLED], CANCELLED),  # cancelled first, as the cold path
    ([CANCELLED], CANCELLED),
])
def test_an_items_fate_from_its_arguments(states, fate):
    assert item_fate(states) == fate


@pytest.mark.parametrize("fates, per_child, plan", [
    ([RUN], False, SEND),
    ([RUN, RUN], True, SEND),
    ([RUN, FAILED], False, PART),
    ([RUN, FAILED], True, PART),
    ([RUN, CANCELLED], False, PART),   # an item's own future is cancelled, the other runs
    ([RUN, CANCELLED], True, CANCEL),  # a map child's one future: cancelled with it
    ([FAILED], True, NONE),
    ([FAILED, CANCELLED], False, NONE),
    ([CANCELLED], False, NONE),
])
def test_what_a_held_call_does_once_its_arguments_are_done(fates, per_child, plan):
    assert release_plan(fates, per_child) == plan


def test_a_childs_outcomes_are_merged_in_item_order():
    error = DependencyFailedError("x")
    assert merged_outcomes([RUN, FAILED, RUN], {1: error}, [(True, 0), (True, 4)]) == \
        [(True, 0), (False, error), (True, 4)]
    assert merged_outcomes([FAILED], {0: error}, []) == [(False, error)]


# -- end to end on the embedded default --------------------------------------------------------
@pytest.mark.slow
def test_a_map_over_a_warm_maps_futures_chains_on_the_pool(local_env):
    with BatchExecutor(local_env, keepalive=30, max_workers=2, echo_output=False) as ex:
        first = ex.map_futures(square, range(6))
        assert list(ex.map(square, first)) == [x ** 4 for x in range(6)]
        second = ex.map_futures(square, first, chunksize=4)  # children of 4 items
        third = ex.map_futures(pair, second, range(6))  # two iterables
        assert [f.result(timeout=60) for f in third] == [(x ** 4, x) for x in range(6)]
        pool = next(iter(ex._session.warm_pools.values()))
        assert all(f.job_id in pool.workers for f in second + third)  # ran on warm workers
        assert len({id(f._bound().job) for f in second}) == 2  # calls of 4 and 2 items
        assert ex._session.submitter.submitted_jobs == []  # no cold job


@pytest.mark.slow
def test_a_failed_argument_fails_only_its_item(local_env):
    with BatchExecutor(local_env, keepalive=30, max_workers=2, echo_output=False) as ex:
        upstream = ex.map_futures(fails_on_two, range(4))
        for chunksize in (1, 2):  # item 2 alone, and with item 3 in its child
            futures = ex.map_futures(square, upstream, chunksize=chunksize)
            assert [futures[i].result(timeout=60) for i in (0, 1, 3)] == [0, 1, 9]
            with pytest.raises(DependencyFailedError) as raised:
                futures[2].result(timeout=60)
            assert isinstance(raised.value.__cause__, ValueError)
        for chunksize in (1, 4):  # map's iterator: the items before it, then the failure
            results = ex.map(square, upstream, chunksize=chunksize)
            assert [next(results), next(results)] == [0, 1]
            with pytest.raises(DependencyFailedError):
                next(results)


@pytest.mark.slow
def test_a_waiting_item_can_be_cancelled_and_a_cancelled_argument_cancels_its_item(local_env, tmp_path):
    with BatchExecutor(local_env, keepalive=30, max_workers=2, echo_output=False) as ex:
        gate = tmp_path / "gate"
        slow = ex.submit(waits_for, str(gate))
        futures = ex.map_futures(square, [slow, 4])
        assert futures[1].result(timeout=60) == 16  # not held: ran while its neighbour waits
        assert not slow.done()
        assert futures[0].cancel() and futures[0].cancelled()  # held: never sent
        gate.touch()
        assert slow.result(timeout=60) == 3
        assert futures[0].cancelled()
        # an argument cancelled before it was sent cancels the item that takes it
        second_gate = tmp_path / "second gate"
        blockers = [ex.submit(waits_for, str(second_gate)) for _ in range(2)]  # both workers
        queued = [ex.submit(square, i) for i in range(window_for(2))]  # the last two not sent
        dependents = ex.map_futures(square, [queued[-1], 5])
        results = ex.map(square, [queued[-1]])
        assert queued[-1].cancel()
        assert dependents[0].cancelled()
        with pytest.raises(concurrent.futures.CancelledError):
            next(results)
        second_gate.touch()
        assert [b.result(timeout=60) for b in blockers] == [3, 3]
        assert dependents[1].result(timeout=60) == 25


@pytest.mark.slow
def test_mixed_items_keep_their_order(local_env):
    with BatchExecutor(local_env, keepalive=30, max_workers=2, echo_output=False) as ex:
        cold = ex.with_settings(keepalive=0)
        done_cold = cold.submit(square, 5)
        assert done_cold.result(timeout=60) == 25
        warm = ex.submit(square, 3)
        items = [1, warm, done_cold, [warm, 2], (7,)]
        assert list(ex.map(pair, items, [warm, 0, 0, 0, warm])) == [
            (1, 9), (9, 0), (25, 0), ([9, 2], 0), ((7,), 9)]
        assert list(ex.map(square, [2, warm, 4], chunksize=2)) == [4, 81, 16]


@pytest.mark.slow
def test_shutdown_waits_for_items_still_waiting_for_their_arguments(local_env, tmp_path):
    gate = tmp_path / "gate"
    ex = BatchExecutor(local_env, keepalive=30, max_workers=1, echo_output=False)
    slow = ex.submit(waits_for, str(gate))
    futures = ex.map_futures(square, [slow, 2, slow])
    results = ex.map(square, [slow])
    seen = {}

    def shut_down():
        ex.shutdown(wait=True)
        seen["done"] = [f.done() for f in futures]

    closing = threading.Thread(target=shut_down)
    closing.start()
    while not ex._session.closed:  # shutdown has begun; the items still wait for `slow`
        closing.join(0.01)
    assert not futures[0].done() and not futures[2].done()
    gate.touch()
    closing.join(120)
    assert not closing.is_alive()
    assert seen["done"] == [True, True, True]
    assert [f.result() for f in futures] == [9, 4, 9]
    assert list(results) == [9]


@pytest.mark.slow
def test_with_the_cache_on_items_taking_warm_futures_are_held_too(local_env):
    with BatchExecutor(local_env, keepalive=30, max_workers=2, cache=True, echo_output=False) as ex:
        warm = ex.submit(square, 3)
        futures = ex.map_futures(square, [1, warm, 2, warm])  # the cache's path (CachedSlices)
        assert [f.result(timeout=60) for f in futures] == [1, 81, 4, 81]
        assert list(ex.map(square, [warm, 2], chunksize=2)) == [81, 4]
