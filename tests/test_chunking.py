"""``chunksize="auto"`` (batchfutures/chunking.py): the rule, then maps on the emulator."""

from __future__ import annotations

import functools
import os
import time

import pytest

from batchfutures import BatchExecutor, chunking, wire
from batchfutures.worker import pool


@pytest.mark.parametrize("vcpus, expected", [(1, 1), (0.25, 1), (2, 2), (2.5, 2), (16, 16)])
def test_processes_per_child(vcpus, expected):
    assert chunking.processes_per_child(vcpus) == expected


@pytest.mark.parametrize("processes, items, seconds, expected", [
    (2, 2, 1.0, 120),          # 0.5 s per item per process: 120 items make a minute on 2
    (1, 1, 60.0, 1),           # one item is already a minute
    (4, 4, 600.0, 4),          # long items: never fewer than one per process
    (2, 2, 0.0001, chunking.MAX_AUTO_CHUNKSIZE),
    (2, 2, 0.0, chunking.MAX_AUTO_CHUNKSIZE),
    (2, 1, 1.0, 120),          # a sample of 1 item on 2 processes took one item's time
    (2, 0, 1.0, 2), (2, 2, float("nan"), 2), (2, 2, -1.0, 2),
])
def test_chunksize_from_timing(processes, items, seconds, expected):
    assert chunking.chunksize_from_timing(processes, items, seconds) == expected


def test_sample_seconds_reads_the_run_time_from_the_result_metadata():
    data = wire.pack_result([wire.encode_ok(1)], {"started": 10.0, "finished": 12.5})
    assert chunking.sample_seconds(functools.partial(print, data, 1)) == 2.5
    assert chunking.sample_seconds(functools.partial(print, b"not a result", 1)) is None
    assert chunking.sample_seconds(functools.partial(print, wire.pack_result([], {}), 1)) is None
    assert chunking.sample_seconds([1, 2]) is None


def test_auto_is_the_only_word_chunksize_takes(executor):
    for bad in ("big", 0, -1, 1.5, True):
        with pytest.raises(ValueError, match="chunksize"):
            list(executor.map(abs, [1], chunksize=bad))
        with pytest.raises(ValueError, match="chunksize"):
            executor.map_futures(abs, [1], chunksize=bad)


def index_and_pid(x):
    time.sleep(0.02)
    return x, os.getpid()


def another_index_and_pid(x):
    return index_and_pid(x)


@pytest.mark.slow
@pytest.mark.skipif(not pool.FORK_AVAILABLE, reason="the pool forks on Linux only")
def test_auto_samples_one_child_then_sizes_the_rest(local_env):
    # BATCHFUTURES_VCPUS by hand until the client sets it from vcpus (session's request builder)
    with BatchExecutor(local_env, vcpus=2, environment={pool.VCPUS_VARIABLE: "2"}) as ex:
        values = list(ex.map(index_and_pid, range(10), chunksize="auto"))
        assert [x for x, _ in values] == list(range(10))
        sample, rest = {pid for _, pid in values[:2]}, {pid for _, pid in values[2:]}
        # the sample: 2 items (one per process); then 8 items of ~0.02 s are far under a
        # minute, so they all went to one child: its 2 processes ran all of them
        assert len(sample) == 2 and len(rest) == 2 and not sample & rest

        # map_futures knows the function's timing now: one child for everything
        futures = ex.map_futures(index_and_pid, range(6), chunksize="auto")
        values = [future.result() for future in futures]
        assert [x for x, _ in values] == list(range(6)) and len({pid for _, pid in values}) == 2

        # a function never timed: N = 2 items per child, so 4 children and their own processes
        futures = ex.map_futures(another_index_and_pid, range(8), chunksize="auto")
        values = [future.result() for future in futures]
        assert [x for x, _ in values] == list(range(8))
        assert len({pid for _, pid in values}) > 2
