"""Warm workers on the local default (issue 31): real worker jobs, real processes, SQS's shape."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from batchfutures import BatchExecutor, LocalEnvironment
from batchfutures.errors import (
    HostTerminatedError,
    JobAbortedError,
    JobTimeoutError,
    MemoryLimitExceeded,
)
from batchfutures.warmpool import window_for

pytestmark = pytest.mark.slow

_calls = 0
_value = None


def square(x):
    print(f"square of {x}")
    return x * x


def counted(_):
    """What a call leaves in its module's globals is seen by the next call on its worker."""
    global _calls
    _calls += 1
    return _calls


def init(value, marker):
    global _value
    _value = value
    with open(marker, "a") as file:
        file.write(f"{os.getpid()}\n")


def read_value(_):
    return _value


def fails(x):
    raise ValueError(f"bad {x}")


def sleeps(seconds):
    time.sleep(seconds)
    return seconds


def allocates(mib):
    block = bytearray(mib * 1024 * 1024)
    return len(block)


def worker_pid(_):
    return os.getppid()  # the runner's parent: the worker loop


def finished_workers(env, ids, timeout):
    """Wait until Batch shows every job of ``ids`` finished; their statuses."""
    deadline = time.monotonic() + timeout
    while True:
        found = env.batch.describe_jobs(jobs=list(ids))["jobs"]
        statuses = {job["jobId"]: job["status"] for job in found}
        if all(s in ("SUCCEEDED", "FAILED") for s in statuses.values()) or \
                time.monotonic() > deadline:
            return statuses
        time.sleep(0.1)


@pytest.fixture
def env(tmp_path):
    environment = LocalEnvironment(tmp_path / "work", max_vcpus=2)
    yield environment
    environment.emulator.close()


def test_map_and_submit_run_on_warm_workers_with_their_own_log(env):
    with BatchExecutor(env, keepalive=30, max_workers=2, echo_output=False) as ex:
        assert list(ex.map(square, range(10))) == [x * x for x in range(10)]
        future = ex.submit(square, 7)
        assert future.result(timeout=60) == 49
        assert future.log() == "square of 7\n"  # its own output, not its worker's
        assert future.status == "SUCCEEDED"
        assert future.usage is not None and future.usage.wall_s >= 0  # measured per call
        pool = next(iter(ex._session.warm_pools.values()))
        assert future.job_id in pool.workers  # its worker's Batch job
        assert len(pool.workers) <= 2
        assert list(ex.map(square, range(3), chunksize=2)) == [0, 1, 4]
        assert pool.requests["batch:SubmitJob"] == len(pool.workers)  # per worker, not per call


def test_globals_a_call_leaves_are_seen_by_the_next_call_on_its_worker(env):
    with BatchExecutor(env, keepalive=30, max_workers=1) as ex:
        assert list(ex.map(counted, range(5))) == [1, 2, 3, 4, 5]
        assert ex.submit(counted, 0).result(timeout=60) == 6


def test_the_initializer_runs_once_per_worker(env, tmp_path):
    marker = tmp_path / "inits"
    with BatchExecutor(env, keepalive=30, max_workers=2, initializer=init,
                       initargs=(42, str(marker))) as ex:
        assert list(ex.map(read_value, range(12))) == [42] * 12
        workers = len(next(iter(ex._session.warm_pools.values())).workers)
    assert 1 <= len(marker.read_text().split()) <= workers


def test_a_calls_exception_comes_back_as_itself_and_the_pool_goes_on(env):
    with BatchExecutor(env, keepalive=30, max_workers=2) as ex:
        futures = [ex.submit(fails, 1), ex.submit(square, 3)]
        with pytest.raises(ValueError, match="bad 1"):
            futures[0].result(timeout=60)
        assert futures[1].result(timeout=60) == 9
        assert futures[0].status == "FAILED"


def test_cancel_works_until_the_call_is_sent(env):
    with BatchExecutor(env, keepalive=30, max_workers=1) as ex:
        first = ex.submit(sleeps, 1.0)
        queued = [ex.submit(counted, i) for i in range(window_for(1) + 3)]  # 3 not sent
        assert not queued[0].cancel()  # sent: running, as in ProcessPoolExecutor's call queue
        assert queued[-1].cancel()
        assert queued[-1].cancelled()
        assert first.result(timeout=60) == 1.0
        assert [f.result(timeout=60) for f in queued[:-1]] == list(range(1, len(queued)))


def test_a_call_out_of_memory_fails_alone_and_the_worker_goes_on(env):
    with BatchExecutor(env, keepalive=30, max_workers=1, memory=300) as ex:
        assert ex.submit(allocates, 10).result(timeout=60) == 10 * 1024 * 1024
        pid = ex.submit(worker_pid, 0).result(timeout=60)
        killed = ex.submit(allocates, 2000)
        with pytest.raises(MemoryLimitExceeded):
            killed.result(timeout=60)
        after = [ex.submit(square, x) for x in range(3)]
        assert [f.result(timeout=60) for f in after] == [0, 1, 4]
        assert ex.submit(worker_pid, 0).result(timeout=60) == pid  # the same worker


def test_a_call_past_its_timeout_fails_alone(env):
    with BatchExecutor(env, keepalive=30, max_workers=1, timeout=1) as ex:
        slow = ex.submit(sleeps, 30)
        with pytest.raises(JobTimeoutError):  # stopped: a 30 s sleep left alone would return
            slow.result(timeout=60)
        assert ex.submit(sleeps, 0).result(timeout=60) == 0


def test_with_settings_gives_each_settings_its_own_pool(env):
    with BatchExecutor(env, keepalive=30, max_workers=1) as ex:
        other = ex.with_settings(memory=512)
        assert ex.submit(square, 2).result(timeout=60) == 4
        assert other.submit(square, 3).result(timeout=60) == 9
        pools = list(ex._session.warm_pools.values())
        assert len(pools) == 2
        assert not set(pools[0].workers) & set(pools[1].workers)


def test_idle_workers_exit_after_keepalive(env):
    ex = BatchExecutor(env, keepalive=1, max_workers=1)
    assert ex.submit(square, 2).result(timeout=60) == 4
    pool = next(iter(ex._session.warm_pools.values()))
    statuses = finished_workers(env, pool.workers, timeout=30)
    assert set(statuses.values()) == {"SUCCEEDED"}  # exit 0: idle, not stopped
    ex.shutdown()


def test_shutdown_with_calls_queued_stops_the_workers(env):
    ex = BatchExecutor(env, keepalive=60, max_workers=1)
    running = ex.submit(sleeps, 0.5)
    queued = [ex.submit(sleeps, 0.1) for _ in range(window_for(1) + 5)]
    ex.shutdown(wait=True, cancel_futures=True)
    assert running.result() == 0.5
    assert sum(f.cancelled() for f in queued) >= 5  # those the window had not sent
    assert all(f.result() == 0.1 for f in queued if not f.cancelled())
    pool = next(iter(ex._session.warm_pools.values()))
    statuses = finished_workers(env, pool.workers, timeout=30)
    assert all(s in ("SUCCEEDED", "FAILED") for s in statuses.values())


def test_terminate_workers_fails_the_running_calls_at_once(env):
    ex = BatchExecutor(env, keepalive=60, max_workers=1)
    assert ex.submit(square, 1).result(timeout=60) == 1
    marker = env.workdir / "running"
    running = ex.submit(sleeps_once, str(marker))
    deadline = time.monotonic() + 30
    while not marker.exists() and time.monotonic() < deadline:  # the call has started
        time.sleep(0.02)
    ex.terminate_workers()
    with pytest.raises(JobAbortedError):
        running.result(timeout=10)
    pool = next(iter(ex._session.warm_pools.values()))
    statuses = finished_workers(env, pool.workers, timeout=30)
    assert all(s in ("SUCCEEDED", "FAILED") for s in statuses.values())


def test_a_killed_clients_workers_exit(tmp_path):
    script = tmp_path / "client.py"
    script.write_text(textwrap.dedent(f"""
        import os, sys
        from batchfutures import BatchExecutor, LocalEnvironment

        def worker_pid(_):
            return os.getppid()

        ex = BatchExecutor(LocalEnvironment({str(tmp_path / "work")!r}, max_vcpus=2),
                           keepalive=3, max_workers=1)
        print(ex.submit(worker_pid, 0).result(timeout=60), flush=True)
        sys.stdin.read()
    """))
    client = subprocess.Popen([sys.executable, str(script)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        pid = int(client.stdout.readline())
        os.kill(pid, 0)  # the worker runs
        client.send_signal(signal.SIGKILL)
        client.wait(timeout=30)
        deadline = time.monotonic() + 3 + 10  # keepalive, and some
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        else:
            pytest.fail(f"the worker {pid} outlived its client by more than its keepalive")
    finally:
        client.kill()
        client.wait()


def running_worker(pool, timeout=30):
    """The worker job that is running, once there is one."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = pool.env.batch.describe_jobs(jobs=list(pool.workers))["jobs"]
        running = [job["jobId"] for job in found if job["status"] == "RUNNING"]
        if running:
            return running[0]
        time.sleep(0.05)
    pytest.fail("no warm worker started")


@pytest.mark.parametrize("retries, survives", [(1, False), (2, True)])
def test_a_worker_lost_mid_call_fails_or_reruns_that_call_by_its_retries(env, monkeypatch,
                                                                         retries, survives):
    monkeypatch.setattr("batchfutures.warmpool.VISIBILITY_TIMEOUT", 2)
    with BatchExecutor(env, keepalive=30, max_workers=1, retries=retries) as ex:
        marker = env.workdir / "started"
        call = ex.submit(sleeps_once, str(marker))
        pool = next(iter(ex._session.warm_pools.values()))
        worker = running_worker(pool)
        deadline = time.monotonic() + 30
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        env.batch.terminate_job(jobId=worker, reason="the host went away (test)")
        if survives:  # the message came back to a new worker, which ran it again
            assert call.result(timeout=60) == "second run"
            assert call.job_id != worker
        else:
            with pytest.raises(HostTerminatedError):
                call.result(timeout=60)
        assert ex.submit(square, 4).result(timeout=60) == 16  # the pool goes on


def sleeps_once(marker):
    """Sleeps for long the first time (its worker is killed meanwhile), not the second."""
    if os.path.exists(marker):
        return "second run"
    with open(marker, "w"):
        pass
    time.sleep(60)
    return "first run"


def test_ctrl_c_in_the_with_block_stops_the_running_calls_and_workers(env):
    with pytest.raises(KeyboardInterrupt):
        with BatchExecutor(env, keepalive=60, max_workers=1) as ex:
            assert ex.submit(square, 1).result(timeout=60) == 1
            running = ex.submit(sleeps, 30)
            raise KeyboardInterrupt
    with pytest.raises(JobAbortedError):
        running.result(timeout=10)
    pool = next(iter(ex._session.warm_pools.values()))
    statuses = finished_workers(env, pool.workers, timeout=10)
    assert all(s in ("SUCCEEDED", "FAILED") for s in statuses.values())


def test_interpreter_exit_waits_for_the_calls_then_stops_the_workers(tmp_path):
    script = tmp_path / "client.py"
    script.write_text(textwrap.dedent(f"""
        import time
        from batchfutures import BatchExecutor, LocalEnvironment

        def late(x):
            time.sleep(0.5)
            print("done", x, flush=True)
            return x

        ex = BatchExecutor(LocalEnvironment({str(tmp_path / "work")!r}, max_vcpus=2),
                           keepalive=120, max_workers=2)
        futures = [ex.submit(late, i) for i in range(3)]
        # no shutdown: the interpreter's exit waits for them, as ProcessPoolExecutor's does
    """))
    # timeout=60, under keepalive's 120 s: the exit stops the workers, it does not wait them out
    finished = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                              timeout=60)
    assert finished.returncode == 0, finished.stderr
    assert sorted(finished.stdout.split("\n")[:-1]) == ["done 0", "done 1", "done 2"]


def crashes_once(marker):
    """Ends its process (no outcome, no kill) the first time, returns the second."""
    if os.path.exists(marker):
        return "second attempt"
    with open(marker, "w"):
        pass
    os._exit(3)


@pytest.mark.parametrize("retries", [1, 2])
def test_a_call_whose_process_crashes_is_tried_again_by_its_retries(env, retries):
    from batchfutures.errors import JobFailedError

    with BatchExecutor(env, keepalive=30, max_workers=1, retries=retries) as ex:
        call = ex.submit(crashes_once, str(env.workdir / f"crashed-{retries}"))
        if retries == 2:
            assert call.result(timeout=60) == "second attempt"
        else:
            with pytest.raises(JobFailedError, match="status 3"):
                call.result(timeout=60)
        assert ex.submit(square, 5).result(timeout=60) == 25


def test_workers_that_cannot_start_fail_the_calls_instead_of_being_restarted_for_ever(
        env, monkeypatch):
    from batchfutures.errors import JobFailedError
    from batchfutures.warmpool import MAX_FAILED_STARTS, WarmPool

    monkeypatch.setattr(WarmPool, "_write_config", lambda self: None)  # nothing to read
    ex = BatchExecutor(env, keepalive=30, max_workers=1)
    call = ex.submit(square, 2)
    with pytest.raises(JobFailedError) as failed:
        call.result(timeout=60)
    assert "config" in str(failed.value)  # the worker's log says why
    pool = next(iter(ex._session.warm_pools.values()))
    assert len(pool.workers) == MAX_FAILED_STARTS
    ex.shutdown()


def size_of(data):
    return len(data)


def big_result(n):
    return b"r" * n


def test_large_arguments_and_results_travel_through_storage(env):
    with BatchExecutor(env, keepalive=30, max_workers=2) as ex:
        # inline calls of ~150 KiB each: several SendMessageBatch requests under 1 MiB
        assert list(ex.map(size_of, [b"a" * 150_000] * 12)) == [150_000] * 12
        # a call over the inline limit: stored, the message points to it
        assert ex.submit(size_of, b"b" * 1_000_000).result(timeout=60) == 1_000_000
        # a result over the inline limit: read from storage by the client
        assert ex.submit(big_result, 500_000).result(timeout=60) == b"r" * 500_000


def test_an_executor_dropped_without_shutdown_closes_its_pool(env):
    import gc

    ex = BatchExecutor(env, keepalive=120, max_workers=1)
    assert ex.submit(square, 3).result(timeout=60) == 9
    pool = next(iter(ex._session.warm_pools.values()))
    del ex
    gc.collect()
    assert pool._closed.wait(timeout=10)  # as ProcessPoolExecutor's manager thread notices
    statuses = finished_workers(env, pool.workers, timeout=10)
    assert all(s in ("SUCCEEDED", "FAILED") for s in statuses.values())


def test_an_item_cancelled_in_a_chunk_leaves_the_others_to_run(env):
    with BatchExecutor(env, keepalive=30, max_workers=1) as ex:
        first = ex.submit(sleeps, 0.5)
        filler = [ex.submit(sleeps, 0) for _ in range(window_for(1))]
        futures = ex.map_futures(square, range(4), chunksize=2)  # 2 calls of 2 items, unsent
        assert futures[1].cancel()
        assert first.result(timeout=60) == 0.5 and all(f.result(timeout=60) == 0 for f in filler)
        assert [futures[i].result(timeout=60) for i in (0, 2, 3)] == [0, 4, 9]
        assert futures[1].cancelled()


def test_workers_whose_hosts_are_lost_fail_the_call_as_host_lost(env, monkeypatch):
    from batchfutures.emulator.faults import FaultProfile

    monkeypatch.setattr("batchfutures.warmpool.VISIBILITY_TIMEOUT", 2)
    env.emulator.set_faults(FaultProfile(host_loss_rate=1.0, host_loss_after=1.0))
    with BatchExecutor(env, keepalive=30, max_workers=1) as ex:
        call = ex.submit(sleeps, 60)
        with pytest.raises(HostTerminatedError):  # Batch's host-lost reason, typed
            call.result(timeout=60)
        env.emulator.set_faults(FaultProfile())
        assert ex.submit(square, 6).result(timeout=60) == 36  # the pool starts over
