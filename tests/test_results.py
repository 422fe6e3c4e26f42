"""results.ResultReader: result objects read concurrently, bounded, off the poller thread; and
end to end, a poller whose Batch rounds go on while result reads hang."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest

from batchfutures import BatchExecutor, LocalEnvironment
from batchfutures.emulator import BatchEmulator
from batchfutures.errors import IntegrityError
from batchfutures.results import READERS, ReadFailed, ResultReader, batches
from batchfutures.storage import Storage


class GatedStore:
    """read_result waits at a gate and records how many reads are in flight at once."""

    def __init__(self, results: Dict[int, Any]) -> None:
        self.results = results
        self.gate = threading.Event()
        self.lock = threading.Lock()
        self.in_flight = 0
        self.peak = 0
        self.reads = 0

    def read_result(self, job_url: str, index: int) -> Optional[bytes]:
        with self.lock:
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)
            self.reads += 1
        try:
            assert self.gate.wait(30)
            value = self.results.get(index)
            if isinstance(value, BaseException):
                raise value
            return value
        finally:
            with self.lock:
                self.in_flight -= 1


@pytest.mark.parametrize("count, concurrency, sizes", [
    (0, 64, []),
    (1, 64, [1]),
    (32, 64, [1] * 32),                  # up to READERS reads: one reader each
    (64, 64, [2] * 32),                  # then READERS readers...
    (130, 64, [5] * 2 + [4] * 30),
    (724, 64, [23] * 20 + [22] * 12),
    (1024, 64, [32] * 32),               # ...up to READERS² reads
    (1500, 64, [39] * 18 + [38] * 21),   # then about √n readers
    (4096, 64, [64] * 64),               # from 64² on every reader is busy
    (10_000, 64, [157] * 16 + [156] * 48),
    (5, 2, [3, 2]),
])
def test_a_burst_of_reads_runs_on_a_bounded_number_of_readers(count, concurrency, sizes):
    assert READERS == 32
    split = batches(list(range(count)), concurrency)
    assert [len(task) for task in split] == sizes
    assert sorted(i for task in split for i in task) == list(range(count))
    # task k reads every k-th index: the readers' first reads are the first indices, and so on
    assert [task[0] for task in split] == list(range(len(split)))
    assert all(list(task) == list(range(task[0], count, len(split))) for task in split)


@pytest.mark.parametrize("count, idle, tasks", [
    (2000, 50, 50),  # readers an earlier burst started read a later one: less wait, no thread more
    (2000, 3, 45),   # fewer idle than √n: √n
    (5, 40, 5),      # never more tasks than reads
    (5000, 100, 64),  # never more than the bound
])
def test_idle_readers_are_used_when_more(count, idle, tasks):
    split = batches(list(range(count)), 64, idle=idle)
    assert len(split) == tasks
    assert sorted(i for task in split for i in task) == list(range(count))


def test_reads_run_concurrently_up_to_the_bound_and_arrive_in_the_inbox():
    store = GatedStore({i: b"r%d" % i for i in range(300)})
    woken = threading.Semaphore(0)
    reader = ResultReader(store, woken.release, concurrency=8)
    job = object()
    reader.request(job, "mem://job", list(range(300)))
    while store.in_flight < 8:  # eight reads wait at the gate at once, and no more
        threading.Event().wait(0.01)
    assert store.peak == 8 and reader.busy and reader.take() == {}
    store.gate.set()
    assert woken.acquire(timeout=30)  # the first arrival into an empty inbox wakes the poller
    while reader.busy:
        threading.Event().wait(0.01)
    arrived = reader.take()
    assert arrived == {job: {i: b"r%d" % i for i in range(300)}}
    assert not reader.busy and reader.take() == {} and store.peak == 8
    reader.close()


def test_missing_refused_and_failed_reads_arrive_as_what_they_are():
    refused = IntegrityError("bad seal")
    store = GatedStore({0: b"ok", 2: refused, 3: OSError("503 SlowDown, past the budget")})
    store.gate.set()
    reader = ResultReader(store, lambda: None)
    found = reader.read_now("mem://job", [0, 1, 2, 3])
    assert found[0] == b"ok" and found[1] is None and found[2] is refused
    assert isinstance(found[3], ReadFailed) and "503" in str(found[3].error)
    reader.close()


# -- end to end: the poller never waits on a GET -----------------------------------------------
class SlowReadStorage(Storage):
    """The client's storage, whose result reads wait until the test lets them go."""

    gate: threading.Event
    started: threading.Event

    def read_result(self, job_url: str, index: int) -> Optional[bytes]:
        self.started.set()
        assert self.gate.wait(60)
        return super().read_result(job_url, index)


class CountingEmulator:
    """The emulator as the executor's Batch client, counting DescribeJobs calls."""

    def __init__(self, emulator: BatchEmulator) -> None:
        self._emulator = emulator
        self.describes = 0

    def describe_jobs(self, **kwargs: Any) -> Any:
        self.describes += 1
        return self._emulator.describe_jobs(**kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._emulator, name)


class GatedEnvironment(LocalEnvironment):
    """Attempts in threads (opted into here), result reads gated, no wake-ups from the
    emulator (as on AWS): only the poll interval drives Batch rounds."""

    poll_intervals = (0.05, 0.05)

    def __init__(self, workdir: Path) -> None:
        super().__init__(workdir, max_vcpus=4)
        self._emulator = BatchEmulator(self.workdir / "emulator", launcher="threads",
                                       max_vcpus=4)
        self.counting = CountingEmulator(self._emulator)
        base = super().storage
        self._storage = SlowReadStorage(base.root_url, signer=base.signer)
        self._storage.gate, self._storage.started = threading.Event(), threading.Event()

    @property
    def batch(self) -> Any:
        return self.counting

    def subscribe(self, callback: Any) -> None:
        pass


def square(x: int) -> int:
    return x * x


def test_batch_rounds_go_on_while_result_reads_hang_and_thousands_of_children_resolve(tmp_path):
    env = GatedEnvironment(tmp_path / "work")
    try:
        with BatchExecutor(env, vcpus=1, memory=256) as executor:
            slow = executor.map_futures(square, range(2000), chunksize=1)
            assert env._storage.started.wait(60)  # some result read has begun and hangs
            described = env.counting.describes
            while env.counting.describes < described + 3:  # ...while the poller keeps polling
                threading.Event().wait(0.05)
            assert not any(f.done() for f in slow)
            env._storage.gate.set()
            assert [f.result(timeout=120) for f in slow] == [x * x for x in range(2000)]
    finally:
        env.emulator.close()


def test_a_result_read_that_fails_is_read_again(tmp_path, monkeypatch):
    """Storage failing past its retry budget on a result read: the child is read again later."""
    env = GatedEnvironment(tmp_path / "work")
    failures: List[int] = []
    original = Storage.read_result

    def flaky(self: Storage, job_url: str, index: int) -> Optional[bytes]:
        if index == 3 and not failures:
            failures.append(index)
            raise OSError("503 SlowDown, past the retry budget")
        return original(self, job_url, index)

    env._storage.gate.set()
    monkeypatch.setattr(SlowReadStorage, "read_result", flaky)
    try:
        with BatchExecutor(env, vcpus=1, memory=256) as executor:
            assert [f.result(timeout=60) for f in executor.map_futures(square, range(6))] == \
                [x * x for x in range(6)]
        assert failures == [3]
    finally:
        env.emulator.close()
