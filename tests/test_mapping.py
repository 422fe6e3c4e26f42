"""mapping.py's pure steps: a slice's shape, map(buffersize=N)'s room, the cache path's runs of
items, the call's checks (the pipeline end to end: tests/test_executor.py, test_cache.py)."""

from __future__ import annotations

import pytest

from batchfutures import mapping
from batchfutures.batchlimits import MAX_ARRAY_SIZE


def budget(buffersize: int, taken: int = 0, yielded: int = 0) -> mapping.Budget:
    made = mapping.Budget(buffersize)
    made.taken, made.yielded = taken, yielded
    return made


@pytest.mark.parametrize("chunksize, given, shape", [
    (1, None, (1, MAX_ARRAY_SIZE)),
    (7, None, (7, MAX_ARRAY_SIZE)),
    (4, budget(10), (4, 2)),  # room for two whole children of 4
    (20, budget(10), (10, 1)),  # a child never holds more than buffersize items
    (4, budget(10, taken=10, yielded=3), None),  # 3 items of room: no whole child
    (1, budget(10, taken=10, yielded=3), (1, 3)),
    (1, budget(10 ** 9), (1, MAX_ARRAY_SIZE)),  # never past Batch's array size
])
def test_slice_shape(chunksize, given, shape):
    assert mapping.slice_shape(chunksize, None, given) == shape


@pytest.mark.parametrize("runs, size, segments", [
    ([True] * 5, 2, [(True, [0, 1]), (True, [2, 3]), (True, [4])]),
    ([False] * 3, 2, [(False, [0, 1, 2])]),  # resolved without running: one segment, any length
    ([True, False, True, True], 5, [(True, [0]), (False, [1]), (True, [2, 3])]),
    ([], 3, []),
])
def test_run_segments(runs, size, segments):
    assert mapping.run_segments(len(runs), lambda i: runs[i], size) == segments


@pytest.mark.parametrize("fn, iterables, chunksize, error", [
    (print, ([1],), 1, None),
    (print, ([1],), "auto", None),
    (print, ([1],), 0, ValueError),
    (print, ([1],), True, ValueError),
    (print, ([1],), "big", ValueError),
    ("print", ([1],), 1, TypeError),
    (print, (), 1, TypeError),
])
def test_check_map_call(fn, iterables, chunksize, error):
    if error is None:
        mapping.check_map_call(fn, iterables, chunksize)
    else:
        with pytest.raises(error):
            mapping.check_map_call(fn, iterables, chunksize)
