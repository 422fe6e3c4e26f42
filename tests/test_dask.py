"""dask.compute(..., scheduler=ex): Dask keeps `ex._max_workers` calls in flight, and the
executor coalesces them into array jobs; each call records how many calls had started."""

import os
import time

import dask
import pytest

from batchfutures import BatchExecutor, LocalEnvironment

CALLS = 8


def rendezvous(folder, index, wanted):
    """Note this call's start, then wait (bounded) until ``wanted`` calls have started; return
    how many had started when it stopped waiting, and its end is noted too."""
    open(os.path.join(folder, f"start-{index}"), "w").close()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        started = sum(name.startswith("start-") for name in os.listdir(folder))
        if started >= wanted:
            break
        time.sleep(0.05)
    ended = sum(name.startswith("end-") for name in os.listdir(folder))
    open(os.path.join(folder, f"end-{index}"), "w").close()
    return index, started - ended  # the calls running at once with this one


@pytest.fixture
def wide_env(tmp_path):
    env = LocalEnvironment(tmp_path / "work", max_vcpus=8)
    yield env
    env.emulator.close()


@pytest.mark.slow
def test_dask_keeps_max_workers_calls_in_flight(wide_env, tmp_path):
    folder = str(tmp_path / "calls")
    os.mkdir(folder)
    with BatchExecutor(wide_env, vcpus=1, memory="256MiB") as ex:
        assert ex._max_workers == 8
        tasks = [dask.delayed(rendezvous)(folder, i, 4) for i in range(CALLS)]
        results = dask.compute(*tasks, scheduler=ex)
    assert sorted(index for index, _ in results) == list(range(CALLS))
    overlap = max(running for _, running in results)
    assert overlap > 2, f"at most {overlap} calls ran at once"
    assert len(ex._session.submitted_jobs) < CALLS  # coalesced into array jobs


@pytest.mark.slow
def test_dask_graph_with_dependencies(executor):
    total = dask.delayed(sum)([dask.delayed(pow)(i, 2) for i in range(6)])
    assert dask.compute(total, scheduler=executor) == (55,)
