"""Usage per call (`future.usage`) and per job (`ex.job(id).usage`, `batchfutures status`), issue 22.

The slow tests run real workers on the emulator: calls that allocate a known amount, burn a
known amount of CPU (in the worker, or in a child process it waits for), sleep, raise, or get
killed for memory. Their assertions are bounds derived from what the call does, not timings.
The pure parts (usage.py, the result object's meta, calls.Meter in this process) are fast.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import subprocess
import sys
import time

import pytest

from batchfutures import BatchExecutor, LocalEnvironment, MemoryLimitExceeded, wire
from batchfutures.usage import (
    ItemUsage,
    JobUsage,
    Totals,
    Usage,
    advice,
    memory_text,
    run_seconds,
    suggest_memory,
)
from batchfutures.worker.calls import Meter

MIB = 1024 * 1024


# -- what the jobs run ----------------------------------------------------------------------------
def allocate(mib: int) -> int:
    """Hold ``mib`` MiB resident (every page touched) until it returns."""
    block = bytearray(mib * MIB)
    for position in range(0, len(block), 4096):
        block[position] = 1
    return len(block) // MIB


def burn(cpu_seconds: float) -> float:
    """Spin until this process has used ``cpu_seconds`` more CPU."""
    start = time.process_time()
    while time.process_time() - start < cpu_seconds:
        pass
    return cpu_seconds


def burn_this_thread(cpu_seconds: float) -> float:
    """Spin until this thread has used ``cpu_seconds`` more CPU."""
    start = time.thread_time()
    while time.thread_time() - start < cpu_seconds:
        pass
    return cpu_seconds


def burn_in_a_child(cpu_seconds: float) -> int:
    """Run a child process that spins ``cpu_seconds`` of CPU, and wait for it."""
    code = ("import time\nstart = time.process_time()\n"
            f"while time.process_time() - start < {cpu_seconds}:\n    pass\n")
    return subprocess.run([sys.executable, "-c", code], check=True).returncode


def nap(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def fail_after_allocating(mib: int) -> None:
    allocate(mib)
    raise ValueError("after allocating", mib)


@pytest.fixture
def ex(tmp_path):
    env = LocalEnvironment(tmp_path / "work", max_vcpus=2)
    executor = BatchExecutor(env, memory="4GiB")
    yield executor
    executor.shutdown(wait=False, cancel_futures=True)
    env.emulator.close()


# -- future.usage on the emulator's workers -------------------------------------------------------
@pytest.mark.slow
def test_a_call_that_allocates_has_that_peak_and_a_call_that_burns_cpu_has_that_cpu(ex):
    big, busy, sleepy = ex.submit(allocate, 200), ex.submit(burn, 0.3), ex.submit(nap, 0.5)
    assert sleepy.usage is None  # not ended yet (it sleeps half a second)
    assert [big.result(), busy.result(), sleepy.result()] == [200, 0.3, 0.5]

    assert big.usage.peak_memory_mib >= 200
    assert big.usage.cpu_s > 0 and big.usage.wall_s > 0

    assert busy.usage.cpu_s >= 0.3
    assert busy.usage.wall_s >= busy.usage.cpu_s * 0.5  # measured around the same call

    assert sleepy.usage.wall_s >= 0.5
    assert sleepy.usage.cpu_s < sleepy.usage.wall_s / 2  # a sleep uses next to no CPU
    assert sleepy.usage.peak_memory_mib < 200  # its own container's, not the big call's


@pytest.mark.slow
def test_a_call_that_raises_has_usage_and_cpu_of_children_it_waited_for_counts(ex):
    raised = ex.submit(fail_after_allocating, 150)
    parent = ex.submit(burn_in_a_child, 0.3)
    with pytest.raises(ValueError, match="after allocating"):
        raised.result()
    assert raised.usage is not None and raised.usage.peak_memory_mib >= 150

    assert parent.result() == 0
    assert parent.usage.cpu_s >= 0.3  # the child's CPU (RUSAGE_CHILDREN), not only the worker's


@pytest.mark.slow
def test_each_item_of_a_chunk_has_its_own_peak(ex):
    # one child, three items in order: the high-water mark is reset between items
    futures = ex.map_futures(allocate, [300, 10, 10], chunksize=3)
    assert [f.result() for f in futures] == [300, 10, 10]
    assert len({f.job_id for f in futures}) == 1
    first, second, third = (f.usage for f in futures)
    assert first.peak_memory_mib >= 300
    assert second.peak_memory_mib < first.peak_memory_mib - 200  # not the first item's peak
    assert third.peak_memory_mib < first.peak_memory_mib - 200


@pytest.mark.slow
def test_items_on_the_inner_pool_are_measured_in_their_sub_process(ex):
    pooled = ex.with_settings(vcpus=2, environment={"BATCHFUTURES_VCPUS": "2"})
    futures = pooled.map_futures(allocate, [250, 10, 10, 250], chunksize=4)
    assert [f.result() for f in futures] == [250, 10, 10, 250]
    assert all(f.usage is not None for f in futures)
    assert futures[0].usage.peak_memory_mib >= 250 and futures[3].usage.peak_memory_mib >= 250
    assert min(f.usage.peak_memory_mib for f in futures[1:3]) < 200


@pytest.mark.slow
def test_a_call_killed_for_memory_has_no_usage(tmp_path):
    env = LocalEnvironment(tmp_path / "work", max_vcpus=2)
    with BatchExecutor(env, memory="256MiB") as small:
        killed = small.submit(allocate, 1024)
        with pytest.raises(MemoryLimitExceeded):
            killed.result()
        assert killed.usage is None  # no outcome was stored, so no usage either
    env.emulator.close()


@pytest.mark.slow
def test_the_thread_launcher_measures_cpu_per_thread_and_no_memory(tmp_path):
    from batchfutures.emulator.service import BatchEmulator

    class ThreadsEnvironment(LocalEnvironment):
        def __init__(self, workdir):
            super().__init__(workdir, max_vcpus=2)
            self._emulator = BatchEmulator(self.workdir / "emulator", launcher="threads",
                                           max_vcpus=2)

    env = ThreadsEnvironment(tmp_path / "work")
    with BatchExecutor(env) as threaded:
        # the process is the emulator's: a call's CPU is its thread's
        busy, sleepy = threaded.submit(burn_this_thread, 0.2), threaded.submit(nap, 0.3)
        concurrent.futures.wait([busy, sleepy])
        assert busy.usage.cpu_s >= 0.2 and busy.usage.peak_memory_mib is None
        assert sleepy.usage.wall_s >= 0.3 and sleepy.usage.cpu_s < sleepy.usage.wall_s / 2
    env.emulator.close()


# -- the job's usage ------------------------------------------------------------------------------
@pytest.mark.slow
def test_the_jobs_usage_sums_its_calls_and_what_it_reserved(ex):
    futures = ex.map_futures(allocate, [250, 20, 20, 20, 20, 20], chunksize=2)
    assert sum(f.result() for f in futures) == 350
    array_id = futures[0].job_id.partition(":")[0]
    usage = ex.job(array_id).usage

    assert usage.calls == 6
    assert usage.cpu_s == pytest.approx(sum(f.usage.cpu_s for f in futures), abs=1e-3)
    assert usage.peak_memory_mib == max(f.usage.peak_memory_mib for f in futures) >= 250
    assert (usage.vcpus, usage.memory_mib) == (1.0, 4096)
    # each child ran its items: its run time holds their wall times
    assert usage.run_s >= sum(f.usage.wall_s for f in futures)
    assert usage.vcpu_s == pytest.approx(1.0 * usage.run_s)
    assert usage.gib_s == pytest.approx(4.0 * usage.run_s)
    # 4096 MiB for a peak of ~300 MiB: a setting of a fraction of it is advised
    assert "would hold it" in usage.advice and "of 4096 MiB" in usage.advice
    suggested = suggest_memory(usage.peak_memory_mib)
    assert usage.peak_memory_mib < suggested <= 1024 and memory_text(suggested) in usage.advice

    # one child alone: its own items only
    child = ex.job(futures[0].job_id).usage
    assert child.calls == 2 and child.peak_memory_mib == futures[0].usage.peak_memory_mib


@pytest.mark.slow
def test_status_shows_the_usage_and_the_advice(ex, tmp_path):
    futures = ex.map_futures(allocate, [200, 10], chunksize=1)
    assert [f.result() for f in futures] == [200, 10]
    job_id = futures[0].job_id.partition(":")[0]
    command = [sys.executable, "-m", "batchfutures", "--workdir", str(tmp_path / "work"),
               "status", job_id]
    env = {k: v for k, v in os.environ.items() if not k.startswith("BATCHFUTURES_JOB")}
    text = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env, check=True)
    assert "2 calls measured" in text.stdout
    assert "vCPU-s (1 vCPU)" in text.stdout and "GiB-s (4096 MiB)" in text.stdout
    assert "of 4096 MiB: memory=" in text.stdout and "would hold it" in text.stdout
    shown = subprocess.run(command + ["-o", "json"], capture_output=True, text=True, timeout=120,
                           env=env, check=True)
    usage = json.loads(shown.stdout)["usage"]
    assert usage["calls"] == 2 and usage["peak_memory_mib"] >= 200 and usage["memory_mib"] == 4096


# -- pure parts -------------------------------------------------------------------------------------
def test_the_result_object_carries_usage_in_its_meta_and_older_objects_have_none():
    outcomes = [wire.encode_ok(1), wire.encode_error(ValueError("x"))]
    data = wire.pack_result(outcomes, {"index": 0, "usage": [[0.5, 0.25, 300.0], None]})
    assert wire.result_usage(data) == [[0.5, 0.25, 300.0], None]
    meta, unpacked = wire.unpack_result(data)
    assert unpacked == outcomes and meta["usage"][0] == [0.5, 0.25, 300.0]

    older = wire.pack_result(outcomes, {"index": 0})  # written before usage was measured
    assert wire.result_usage(older) is None
    assert wire.unpack_result(older)[1] == outcomes
    assert wire.result_usage(b"not a result") is None


def test_usage_entries_are_read_strictly():
    assert Usage.from_raw([1.5, 0.5, 200.0]) == Usage(1.5, 0.5, 200.0)
    assert Usage.from_raw([1, 0, None]) == Usage(1.0, 0.0, None)
    for bad in (None, [], [1, 2], [1, "2", 3], [-1, 0, 0], [1, 1, True], "1,1,1", [1, float("nan"), 1]):
        assert Usage.from_raw(bad) is None


def test_totals_sum_cpu_and_wall_and_keep_the_largest_peak():
    totals = Totals()
    totals.add_raw([[1.0, 0.5, 100.0], None, [2.0, 1.5, 300.0], [1.0, 1.0, None], "junk"])
    assert (totals.calls, totals.wall_s, totals.cpu_s, totals.peak_memory_mib) == (3, 4.0, 3.0, 300.0)
    assert Totals().peak_memory_mib is None


def test_reserved_seconds_come_from_settings_and_run_times():
    assert run_seconds([(100.0, 110.0), (100.0, 130.0), (None, None)]) == 40.0
    assert run_seconds([(100.0, None)]) == 0.0  # running, no clock given: not counted
    assert run_seconds([(100.0, None)], now=105.0) == 5.0
    totals = Totals()
    totals.add(Usage(10.0, 8.0, 310.0))
    usage = JobUsage.of(totals, 2.0, 4096, 40.0)
    assert (usage.vcpu_s, usage.gib_s, usage.cpu_utilization) == (80.0, 160.0, 0.1)
    assert usage.advice == "peak 310 MiB of 4096 MiB: memory='512MiB' would hold it"
    assert usage.as_dict()["advice"] == usage.advice and len(usage.lines()) == 3
    unknown = JobUsage.of(Totals(), None, None, 0.0)
    assert unknown.vcpu_s is None and unknown.gib_s is None and unknown.advice is None


def test_advice_says_far_above_close_to_or_nothing():
    assert advice(310, 4096) == "peak 310 MiB of 4096 MiB: memory='512MiB' would hold it"
    assert advice(1900, 2048).startswith("peak 1900 MiB of 2048 MiB: close to the limit")
    assert "memory='3GiB'" in advice(1900, 2048)
    assert advice(700, 1024) is None  # it fits, with room, and no round setting half its size would
    assert advice(None, 4096) is None and advice(300, None) is None
    # the inner pool's processes hold a peak each at once
    assert advice(300, 4096, processes=4) == (
        "peak 300 MiB (4 processes at once) of 4096 MiB: memory='1536MiB' would hold it")
    assert suggest_memory(100) == 128 and suggest_memory(900) == 1536
    assert memory_text(512) == "512MiB" and memory_text(3072) == "3GiB"
    assert suggest_memory(300_000) % 1024 == 0


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="Linux /proc")
def test_the_meter_resets_the_high_water_mark_between_items_in_this_process():
    meter = Meter()
    try:
        started = meter.start()
        held = allocate(120)
        first = meter.stop(started)
        del held
        started = meter.start()
        allocate(1)
        second = meter.stop(started)
    finally:
        meter.close()
    assert first[2] >= 120
    assert second[2] < first[2] - 60  # the 120 MiB were given back: the reset mark is lower
    assert first[0] >= 0 and first[1] >= 0


def test_a_threads_meter_measures_this_thread_and_no_memory():
    meter = Meter(thread=True)
    started = meter.start()
    burn_this_thread(0.05)
    wall, cpu, peak = meter.stop(started)
    assert peak is None and cpu >= 0.05 and wall >= cpu * 0.5


def test_a_multi_node_calls_usage_is_its_nodes_together():
    from batchfutures.jobs import node_usage

    def node(entry):
        return wire.pack_result([wire.encode_ok(None)], {"usage": [entry]})

    combined = node_usage([node([2.0, 1.5, 100.0]), node([3.0, 2.5, 250.0]), None,
                           wire.pack_result([wire.encode_ok(None)], {})])
    assert combined == [3.0, 4.0, 250.0]
    assert node_usage([None, wire.pack_result([], {})]) is None
    assert node_usage([node([1.0, 0.5, None])]) == [1.0, 0.5, None]


def test_a_multi_node_calls_usage_is_read_from_results_as_storage_returns_them():
    from batchfutures.jobs import node_usage

    # Storage.read_result hands the poller a bytearray (the sealed payload as read)
    read = [bytearray(wire.pack_result([wire.encode_ok(None)], {"usage": [[2.0, 1.5, 100.0]]})),
            bytearray(wire.pack_result([wire.encode_ok(None)], {"usage": [[3.0, 2.5, 50.0]]}))]
    assert node_usage(read) == [3.0, 4.0, 100.0]


def test_a_jobs_usage_is_packed_once_and_read_per_child_and_position():
    packed = ItemUsage([2, 3])  # two children: items 0-1 and 2-4 of the job
    assert packed.at(0, 0) is None  # nothing recorded yet
    packed.record(1, 0, [0.5, 0.25, 300.0])
    packed.record(1, 1, [1.0, 0.0, None])
    packed.record(1, 2, "junk")
    packed.record(0, 1, [2.0, 1.0, 50.5])
    assert packed.at(1, 0) == Usage(0.5, 0.25, 300.0)
    assert packed.at(1, 1) == Usage(1.0, 0.0, None)  # the peak unknown (the thread launcher)
    assert packed.at(1, 2) is None and packed.at(0, 0) is None  # not measured
    assert packed.at(0, 1) == Usage(2.0, 1.0, 50.5)  # not another child's item
    # outside the job: nothing, and nothing recorded
    packed.record(0, 2, [9.0, 9.0, 9.0])
    packed.record(2, 0, [9.0, 9.0, 9.0])
    assert packed.at(0, 2) is None and packed.at(2, 0) is None and packed.at(0, -1) is None
    assert packed.at(1, 0) == Usage(0.5, 0.25, 300.0)
    assert [packed.items_in(c) for c in (0, 1, 2, -1)] == [2, 3, 0, 0]
