"""retries=Retries(on=...) and checkpoints on warm workers (keepalive=): the same per-call
settings as on the cold path. Table tests of the pure parts (warmwire), then real warm workers on
the embedded emulator (slow): nothing of ours is mocked; a worker is taken away by the
emulator's Spot reclaim fault (SIGTERM, then SIGKILL after its notice)."""

import json
import math
import os
import time
from pathlib import Path

import pytest
from spotcases import Throttled, fails_twice, fails_with, flaky_item, wait_for

import batchfutures
from batchfutures import BatchExecutor, Retries, checkpoints, warmwire
from batchfutures.callattempts import Attempt
from batchfutures.emulator.faults import FaultProfile
from batchfutures.retrypolicy import Retrying, delay_after

# -- pure parts ------------------------------------------------------------------------------
A = Attempt(1.0, 2.0, None, "retried: Throttled: x", "job-1")
B = Attempt(3.0, 4.0, None, None, "job-2")
LOST = warmwire.lost_attempt()


@pytest.mark.parametrize("reported, listed", [
    ({}, []),
    ({1: A}, [A]),
    ({2: B}, [LOST, B]),  # the first worker was lost: nobody reported attempt 1
    ({1: A, 3: B}, [A, LOST, B]),
    ({3: B, 1: A, 2: A}, [A, A, B]),
])
def test_attempts_are_listed_by_receive_count_the_unreported_as_lost(reported, listed):
    assert warmwire.attempts_listed(reported) == listed


def test_a_lost_attempt_counts_as_a_reclaim():
    assert LOST.reclaimed and LOST.exit_code is None and LOST.started is None


@pytest.mark.parametrize("delay, seconds", [
    (0, 0), (-1, 0), (float("nan"), 0), (0.2, 1), (1.0, 1), (1.5, 2), (60, 60),
    (1e9, warmwire.MAX_VISIBILITY),
])
def test_a_retrys_delay_is_a_visibility_of_whole_seconds_rounded_up(delay, seconds):
    assert warmwire.retry_visibility(delay) == seconds


@pytest.mark.parametrize("attempt, retry, why", [
    (warmwire.attempt_record(2, 1.5, 2.5, None, "retried: Throttled: x"), True,
     "retried: Throttled: x"),
    (warmwire.attempt_record(1, 1.5, 2.5, 137, None), False, None),
])
def test_a_completion_carries_its_attempt(attempt, retry, why):
    body = warmwire.encode_completion(7, "job-3", None if retry else b"sealed", attempt, retry)
    completion = warmwire.read_completion(body)
    assert (completion.number, completion.worker, completion.retry) == (7, "job-3", retry)
    assert completion.receives == attempt["r"]
    assert completion.attempt == Attempt(1.5, 2.5, attempt["x"], why, "job-3")
    assert warmwire.decode_completion(body)[:2] == (7, "job-3")  # the older reader still reads


@pytest.mark.parametrize("record, expected", [
    ({"r": 1, "s": "x", "e": True, "x": True, "why": 5}, Attempt(None, None, None, None, "w")),
    ({"r": 1, "s": 1, "e": 2.5, "x": -9, "why": "killed"}, Attempt(1.0, 2.5, -9, "killed", "w")),
])
def test_an_attempts_fields_from_a_worker_are_checked(record, expected):
    body = json.dumps({"n": 1, "worker": "w", "result": None, "attempt": record})
    assert warmwire.read_completion(body).attempt == expected


def test_a_lost_workers_attempt_said_by_the_next_holder_is_not_its_own():
    body = warmwire.encode_completion(2, "job-next", b"r", warmwire.lost_record(1))
    completion = warmwire.read_completion(body)
    assert completion.attempt == LOST and completion.receives == 1


@pytest.mark.parametrize("receives", [0, -3, "2"])
def test_an_attempt_without_a_receive_count_is_not_placed(receives):
    body = json.dumps({"n": 1, "worker": "w", "attempt": {"r": receives}})
    assert warmwire.read_completion(body).receives == 0


def raises(error):
    raise error


@pytest.mark.parametrize("error, receives, retried", [
    (Throttled("x"), 1, True),
    (Throttled("x"), 2, True),
    (Throttled("x"), 3, False),  # the last attempt: the exception is the outcome
    (ValueError("x"), 1, False),  # not listed
    (KeyboardInterrupt(), 1, False),
])
def test_a_warm_attempt_asks_for_a_retry_by_retrypolicys_decision(error, receives, retried):
    """The path of worker/warm.py's Runner._attempt: the call's context with the message's
    receive count as its attempt, the function as sent (Retrying)."""
    policy = Retries(3, on=(Throttled,), backoff=0.5, max_delay=0.8)
    checkpoints.begin_call(None, "file:///pool", 4, str(receives))  # type: ignore[arg-type]
    try:
        with pytest.raises(type(error)):
            Retrying(raises, policy)(error)
        delay, why = checkpoints.retry_requested(), checkpoints.retry_reason()
    finally:
        checkpoints.end_call()
    if retried:
        assert delay == delay_after(policy, receives) and why == f"Throttled: {error}"
        assert warmwire.retry_visibility(delay) == math.ceil(delay)
    else:
        assert delay is None and why is None


# -- real warm workers (slow) ----------------------------------------------------------------
def square(x):
    return x * x


def worker_id(_):
    return os.environ.get("AWS_BATCH_JOB_ID")


@pytest.mark.slow
def test_a_listed_exception_is_retried_on_the_pool_without_holding_its_worker(local_env,
                                                                               tmp_path):
    counter = tmp_path / "runs"
    policy = Retries(3, on=(Throttled,), backoff=1.5, max_delay=2)
    with BatchExecutor(local_env, keepalive=30, max_workers=1, retries=policy) as ex:
        future = ex.submit(fails_twice, str(counter))
        wait_for(lambda: counter.exists(), what="the first attempt")
        # one worker: this call runs on it while the first one waits for its retry
        assert ex.submit(square, 5).result(timeout=60) == 25
        assert len(counter.read_text().splitlines()) == 1 and not future.done()
        assert future.result(timeout=60) == 3
        starts = [float(line) for line in counter.read_text().splitlines()]
        assert starts[1] - starts[0] >= delay_after(policy, 1)  # 2 s: whole seconds, up
        assert starts[2] - starts[1] >= delay_after(policy, 2)
        attempts = future.attempts
        assert [a.reason for a in attempts] == ["retried: Throttled: run 1",
                                                "retried: Throttled: run 2", None]
        assert all(a.started and a.stopped and a.stopped >= a.started for a in attempts)
        assert [a.exit_code for a in attempts] == [None] * 3  # no process ended: warm
        assert all(a.job_id == future.job_id for a in attempts) and future.reclaims == 0


@pytest.mark.slow
def test_an_exception_not_listed_fails_at_once(local_env, tmp_path):
    counter = tmp_path / "runs"
    policy = Retries(3, on=(Throttled,), backoff=0)
    with BatchExecutor(local_env, keepalive=30, max_workers=1, retries=policy) as ex:
        future = ex.submit(fails_with, ValueError, str(counter))
        with pytest.raises(ValueError, match="not listed"):
            future.result(timeout=60)
        assert counter.read_text() == "x\n"
        assert [a.reason for a in future.attempts] == ["ValueError: not listed"]
        # a listed one on every attempt: retried up to n attempts, then the outcome
        listed = ex.submit(fails_with, Throttled, str(tmp_path / "listed"))
        with pytest.raises(Throttled):
            listed.result(timeout=60)
        assert (tmp_path / "listed").read_text() == "x\n" * 3
        assert [a.reason for a in listed.attempts] == ["retried: Throttled: not listed"] * 2 \
            + ["Throttled: not listed"]


def saves_then_fails_once(folder):
    """Checkpoint, then raise a listed exception; the retry carries on from the checkpoint."""
    state = batchfutures.restored()
    if state is not None:
        return ("restored", state)
    batchfutures.checkpoint({"step": 7})
    raise Throttled("once")


@pytest.mark.slow
def test_a_listed_exceptions_retry_restores_the_calls_checkpoint(local_env, tmp_path):
    policy = Retries(2, on=(Throttled,), backoff=0)
    with BatchExecutor(local_env, keepalive=30, max_workers=1, retries=policy) as ex:
        futures = [ex.submit(saves_then_fails_once, str(tmp_path)) for _ in range(2)]
        # each call its own key: the pool's checkpoints/<call number>.<item>
        assert [f.result(timeout=60) for f in futures] == [("restored", {"step": 7})] * 2
        pool = next(iter(ex._session.warm_pools.values()))
        assert checkpoints.checkpoint_url(pool.pool_url, 0, 0).endswith("/checkpoints/00000.0")
        for number in (0, 1):
            url = checkpoints.checkpoint_url(pool.pool_url, number, 0)
            assert pool.storage.read_sealed(url, checkpoints.CHECKPOINT_KIND) is not None


def until_interrupted(folder):
    """A long call that checkpoints as it goes and when told to stop; then the kill comes."""
    folder = Path(folder)
    state = batchfutures.restored()
    if state is not None:  # a later attempt: carry on from the checkpoint
        return ("restored", state, os.environ.get("AWS_BATCH_JOB_ID"))
    (folder / "started").write_text(os.environ.get("AWS_BATCH_JOB_ID", ""))
    steps = 0
    while not batchfutures.interrupted():
        steps += 1
        batchfutures.checkpoint(("steps", steps))
        time.sleep(0.01)
    batchfutures.checkpoint(("interrupted at", steps))
    (folder / "interrupted").write_text(str(steps))
    time.sleep(600)  # the kill comes


@pytest.mark.slow
def test_a_checkpoint_survives_a_worker_reclaimed_mid_call(local_env, tmp_path):
    # Spot reclaims the first worker 2 s after it runs (the call has started by then: it is
    # a forked process taking one message), SIGKILL 1 s after SIGTERM
    local_env.emulator.set_faults(FaultProfile(spot_reclaim_rate=1.0, spot_reclaim_after=2.0,
                                               spot_notice=1.0))
    with BatchExecutor(local_env, keepalive=30, max_workers=1, retries=2) as ex:
        future = ex.submit(until_interrupted, str(tmp_path))
        first = wait_for(lambda: (tmp_path / "started").exists()
                         and (tmp_path / "started").read_text(), what="the call to start")
        local_env.emulator.set_faults(FaultProfile(spot_notice=1.0))  # its replacement stays
        steps = int(wait_for(lambda: (tmp_path / "interrupted").exists()
                             and (tmp_path / "interrupted").read_text(), what="interrupted()"))
        kind, state, second = future.result(timeout=60)
        assert (kind, state) == ("restored", ("interrupted at", steps)) and second != first
        attempts = future.attempts
        assert len(attempts) == 2 and attempts[0].reason == warmwire.LOST_REASON
        assert future.reclaims == 1 and attempts[1].job_id == second == future.job_id
        (ended,) = local_env.batch.describe_jobs(jobs=[first])["jobs"]
        assert ended["status"] == "FAILED"
        assert ex.submit(square, 4).result(timeout=60) == 16


def stops_when_interrupted(folder):
    (Path(folder) / "started").write_text(os.environ.get("AWS_BATCH_JOB_ID", ""))
    deadline = time.monotonic() + 60
    while not batchfutures.interrupted():
        if time.monotonic() > deadline:
            return "never interrupted"
        time.sleep(0.01)
    batchfutures.checkpoint("saved")
    return "interrupted"


@pytest.mark.slow
def test_sigterm_makes_interrupted_true_and_the_worker_stops_taking_calls(local_env, tmp_path):
    # a long notice: the call finishes, and its worker leaves before the kill
    local_env.emulator.set_faults(FaultProfile(spot_reclaim_rate=1.0, spot_reclaim_after=2.0,
                                               spot_notice=60.0))
    with BatchExecutor(local_env, keepalive=30, max_workers=1) as ex:
        future = ex.submit(stops_when_interrupted, str(tmp_path))
        first = wait_for(lambda: (tmp_path / "started").exists()
                         and (tmp_path / "started").read_text(), what="the call to start")
        local_env.emulator.set_faults(FaultProfile(spot_notice=60.0))
        assert future.result(timeout=60) == "interrupted" and future.job_id == first
        assert [a.reason for a in future.attempts] == [None]
        # the worker exits by itself, long before its kill, and the pool replaces it
        wait_for(lambda: local_env.batch.describe_jobs(jobs=[first])["jobs"][0]["status"]
                 in ("SUCCEEDED", "FAILED"), timeout=30, what="the reclaimed worker to leave")
        later = ex.submit(worker_id, 0).result(timeout=60)
        assert later and later != first


def crashes_once(marker):
    """Ends its process (no outcome) the first time, returns the second."""
    if os.path.exists(marker):
        return "second attempt"
    Path(marker).write_text("crashed")
    os._exit(3)


@pytest.mark.slow
def test_a_crashed_attempt_is_listed_with_its_exit_status(local_env, tmp_path):
    with BatchExecutor(local_env, keepalive=30, max_workers=1, retries=2) as ex:
        future = ex.submit(crashes_once, str(tmp_path / "crashed"))
        assert future.result(timeout=60) == "second attempt"
        assert [(a.exit_code, a.reason) for a in future.attempts] == [
            (3, "the call's process ended with status 3"), (None, None)]


def saves_then_allocates(mib):
    """Checkpoint, then take ``mib`` MiB the first time (killed for memory); the retry with
    more memory finds the checkpoint."""
    state = batchfutures.restored()
    if state is not None:
        return ("restored", state)
    batchfutures.checkpoint("before the allocation")
    block = bytearray(mib * 1024 * 1024)
    for i in range(0, len(block), 4096):  # touched: resident, as the kernel counts it
        block[i] = 1
    return ("not killed", len(block))


@pytest.mark.slow
def test_a_call_resent_for_memory_keeps_its_checkpoint_and_attempts(local_env):
    with BatchExecutor(local_env, keepalive=30, max_workers=1, memory=300, retry_on_oom=1,
                       echo_output=False) as ex:
        future = ex.submit(saves_then_allocates, 450)  # over 300 MiB: resent with 600
        assert future.result(timeout=120) == ("restored", "before the allocation")
        first, second = future.attempts
        assert first.exit_code is not None and "memory" in (first.reason or "").lower()
        assert second.reason is None and second.job_id == future.job_id != first.job_id


def sleeps_until_killed(folder):
    (Path(folder) / "started").write_text(os.environ.get("AWS_BATCH_JOB_ID", ""))
    time.sleep(120)
    return "not killed"


@pytest.mark.slow
def test_a_worker_stopped_mid_call_is_a_lost_attempt(local_env, tmp_path):
    from batchfutures.errors import HostTerminatedError

    with BatchExecutor(local_env, keepalive=30, max_workers=1, retries=1) as ex:
        future = ex.submit(sleeps_until_killed, str(tmp_path))
        worker = wait_for(lambda: (tmp_path / "started").exists()
                          and (tmp_path / "started").read_text(), what="the call to start")
        # SIGTERM: the call (no checkpoint API) ends at once and goes back as a worker lost
        local_env.batch.terminate_job(jobId=worker, reason="stopped by the test")
        with pytest.raises(HostTerminatedError):
            future.result(timeout=20)  # at once, not after the 30 s visibility timeout
        assert future.attempts == [warmwire.lost_attempt()] and future.reclaims == 1


@pytest.mark.slow
def test_only_the_failed_call_of_a_warm_map_runs_again(local_env, tmp_path):
    policy = Retries(2, on=(Throttled,), backoff=0)
    with BatchExecutor(local_env, keepalive=30, max_workers=2, retries=policy) as ex:
        futures = ex.map_futures(flaky_item, range(3), [str(tmp_path)] * 3)
        assert [f.result(timeout=60) for f in futures] == [0, 10, 20]
        assert [len(f.attempts) for f in futures] == [1, 2, 1]
