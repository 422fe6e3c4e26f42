"""ex.logs(search=TEXT, failed_only=True): a run's log lines across its children (logsearch)."""

import pytest

from batchfutures import BatchExecutor, logsearch


@pytest.mark.parametrize("text, expected", [
    (None, None), ("", None),
    ("Traceback", '"Traceback"'),
    ("item 3 done", '"item 3 done"'),  # a phrase: one quoted term
    ('say "hi"', None), ("C:\\path", None),  # not quotable: filtered here only
])
def test_filter_pattern(text, expected):
    assert logsearch.filter_pattern(text) == expected


@pytest.mark.parametrize("size, failed, failed_only, expected", [
    (4, [], False, [0, 1, 2, 3]),
    (4, [2, 0, 2], True, [0, 2]),
    (4, [7, -1], True, []),  # out of range: ignored
    (0, [], True, []),
])
def test_children_to_search(size, failed, failed_only, expected):
    assert logsearch.children_to_search(size, failed, failed_only) == expected


def _noisy(x):
    print(f"working on {x}")
    if x in (1, 3):
        raise ValueError(f"bad item {x}")
    print(f"done with {x}")
    return x


@pytest.mark.slow
def test_search_across_a_run(local_env):
    with BatchExecutor(local_env, echo_output=False) as ex:
        futures = ex.map_futures(_noisy, range(5))
        [f.exception(timeout=120) for f in futures]
        ex.submit(_noisy, 10).result(timeout=120)
        everything = ex.logs()
        done = ex.logs(search="done with")
        tracebacks = ex.logs(search="Traceback", failed_only=True)
        failed_lines = ex.logs(failed_only=True)
        raised = ex.logs(search='ValueError: bad item')
    assert [line.message for line in done] == [f"done with {x}" for x in (0, 2, 4, 10)]
    assert [line.index for line in done[:3]] == [0, 2, 4]
    assert done[3].index is None  # the submitted call: a plain job
    # each raising call's traceback is in its container's log, found in the failed children only
    assert sorted({line.index for line in tracebacks}) == [1, 3]
    assert {line.index for line in failed_lines} == {1, 3}
    assert sorted(line.message for line in raised) == ["ValueError: bad item 1",
                                                       "ValueError: bad item 3"]
    assert any("working on 2" == line.message for line in everything)
    assert all(line.job_id.endswith(f":{line.index}") for line in done[:3])
