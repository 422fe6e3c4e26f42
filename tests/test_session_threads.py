"""The session, the coalescer and the poller end to end on the emulator's process-free launcher.

`BatchEmulator(launcher="threads")` runs the worker's own code in threads of this process, with
the same storage reads and writes, lifecycle and records as real attempts; no process starts,
so these run in the fast tier (issue 21, point 4). What needs a real process (memory kills,
exit codes of a dying interpreter, the fork server) stays in the slow tests.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from batchfutures import BatchExecutor, JobAbortedError, LocalEnvironment
from batchfutures.emulator.service import BatchEmulator

# A call blocks here until the test lets it go: in the threads launcher the function runs in
# this process, so it sees this very Event (pickled by reference to this module: the executors
# that use it do not ship local modules by value).
GATE = threading.Event()
STARTED = threading.Event()


class ThreadsEnvironment(LocalEnvironment):
    """A local environment whose emulator runs attempts in threads (chosen here explicitly)."""

    def __init__(self, workdir: Path, vcpus: int = 4) -> None:
        super().__init__(workdir, max_vcpus=vcpus)
        self._emulator = BatchEmulator(self.workdir / "emulator", launcher="threads",
                                       max_vcpus=vcpus)


@pytest.fixture
def env(tmp_path: Path) -> Iterator[ThreadsEnvironment]:
    GATE.clear()
    STARTED.clear()
    environment = ThreadsEnvironment(tmp_path / "work")
    try:
        yield environment
    finally:
        GATE.set()
        environment.emulator.close()


def wait_until(predicate: Any, timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def square(x: int) -> int:
    return x * x


class Odd(ValueError):
    pass


def reject_odd(x: int) -> int:
    if x % 2:
        raise Odd(f"{x} is odd")
    return x


def wait_for_gate(x: int) -> int:
    STARTED.set()
    if not GATE.wait(60):
        raise TimeoutError("the test never opened the gate")
    return x


def test_map_and_submit_resolve_every_call_in_order(env):
    with BatchExecutor(env, vcpus=1, memory=256) as ex:
        assert list(ex.map(square, range(100), chunksize=7)) == [x * x for x in range(100)]
        futures = [ex.submit(square, x) for x in range(20)]  # coalesced into one array job
        assert [f.result(timeout=60) for f in futures] == [x * x for x in range(20)]
    assert len({f.job_id.split(":")[0] for f in futures}) == 1
    assert {f.status for f in futures} == {"SUCCEEDED"}
    assert all(f.exit_code == 0 for f in futures)


def test_a_calls_own_exception_comes_back_as_itself_and_spares_its_neighbours(env):
    with BatchExecutor(env, vcpus=1, memory=256) as ex:
        futures = ex.map_futures(reject_odd, range(6), chunksize=3)  # two children of 3 items
        concurrent.futures.wait(futures, timeout=60)
    for x, future in enumerate(futures):
        if x % 2:
            error = future.exception()
            assert type(error) is Odd and str(error) == f"{x} is odd"
        else:
            assert future.result() == x
    # the call raised, the container did not fail
    assert {f.status for f in futures} == {"SUCCEEDED"}


def test_map_raises_the_first_failing_calls_exception_when_it_is_reached(env):
    with BatchExecutor(env, vcpus=1, memory=256) as ex:
        results = ex.map(reject_odd, [0, 2, 3, 4])
        assert next(results) == 0 and next(results) == 2
        with pytest.raises(Odd, match="3 is odd"):
            next(results)


def test_abort_terminates_a_running_call_and_its_future_raises_job_aborted(env):
    with BatchExecutor(env, vcpus=1, memory=256, ship_local_modules=False) as ex:
        running = ex.submit(wait_for_gate, 1)
        assert STARTED.wait(60)
        running.abort(reason="not needed any more")
        with pytest.raises(JobAbortedError):
            running.result(timeout=60)
        # the future failed at once; the poller thread sends TerminateJob, and Batch shows the
        # job FAILED (the call still blocks: had it returned first, the job would have ended
        # SUCCEEDED, as on AWS a termination that comes too late does nothing)
        assert wait_until(lambda: ex.job(running.job_id).status == "FAILED")
        GATE.set()  # a thread cannot be killed: its attempt ended, the thread ends now


def test_shutdown_with_cancel_futures_cancels_what_has_not_started(env):
    ex = BatchExecutor(env, vcpus=1, memory=256, max_workers=1, ship_local_modules=False)
    running = ex.submit(wait_for_gate, 0)
    assert STARTED.wait(60)
    # what the client knows has started: a future whose status it has not yet seen RUNNING
    # counts as not started and is cancelled
    assert wait_until(lambda: running.status == "RUNNING")
    waiting = [ex.submit(square, x) for x in range(5)]  # held back by max_workers=1
    ex.shutdown(wait=False, cancel_futures=True)
    GATE.set()
    assert running.result(timeout=60) == 0
    assert all(f.cancelled() for f in waiting)
    with pytest.raises(RuntimeError):
        ex.submit(square, 1)


def test_a_future_cancelled_before_its_call_starts_is_never_run(env):
    with BatchExecutor(env, vcpus=1, memory=256, max_workers=1, ship_local_modules=False) as ex:
        first = ex.submit(wait_for_gate, 0)
        assert STARTED.wait(60)
        later = ex.submit(square, 3)
        assert later.cancel() and later.cancelled()
        GATE.set()
        assert first.result(timeout=60) == 0
    assert later.job_id is None  # never submitted to Batch


def test_attach_rebuilds_the_futures_of_a_finished_job(env):
    with BatchExecutor(env, vcpus=1, memory=256) as ex:
        futures = ex.map_futures(square, range(12), chunksize=4)
        assert [f.result(timeout=60) for f in futures] == [x * x for x in range(12)]
        job_id = futures[0].job_id.split(":")[0]
    with BatchExecutor(env) as again:
        attached: Any = again.attach(job_id)
        assert [f.result(timeout=60) for f in attached] == [x * x for x in range(12)]
