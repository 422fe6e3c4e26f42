"""Issue 33 end to end on the embedded emulator: retries by exception, checkpoints across a
reclaim, consumable resources. Real worker processes (the slow tier); nothing of ours is mocked."""

import os
import signal
import time
from pathlib import Path

import pytest
from spotcases import Throttled, add_on_demand_queue, fails_twice, fails_with, flaky_item, steps_to, wait_for

import batchfutures
from batchfutures import BatchExecutor, Retries
from batchfutures.emulator.faults import FaultProfile

pytestmark = pytest.mark.slow


def test_a_listed_exception_is_retried_with_its_delays_and_the_attempts_recorded(local_env, tmp_path):
    counter = tmp_path / "runs"
    with BatchExecutor(local_env, retries=Retries(3, on=(Throttled,), backoff=0.3)) as ex:
        future = ex.submit(fails_twice, str(counter))
        assert future.result(timeout=120) == 3
        starts = [float(line) for line in counter.read_text().splitlines()]
        assert len(starts) == 3
        assert starts[1] - starts[0] >= 0.3 and starts[2] - starts[1] >= 0.6  # backoff doubles
        attempts = future.attempts
        assert [a.exit_code for a in attempts] == [75, 75, 0]
        assert all(a.started and a.stopped and a.stopped >= a.started for a in attempts)
        assert future.reclaims == 0


def test_an_exception_not_listed_is_not_retried(local_env, tmp_path):
    counter = tmp_path / "runs"
    with BatchExecutor(local_env, retries=Retries(3, on=(Throttled,), backoff=0)) as ex:
        future = ex.submit(fails_with, ValueError, str(counter))
        with pytest.raises(ValueError, match="not listed"):
            future.result(timeout=120)
        assert counter.read_text() == "x\n" and [a.exit_code for a in future.attempts] == [0]


def test_only_the_failed_child_of_an_array_runs_again(local_env, tmp_path):
    with BatchExecutor(local_env, retries=Retries(2, on=(Throttled,), backoff=0)) as ex:
        futures = ex.map_futures(flaky_item, range(3), [str(tmp_path)] * 3)
        assert [f.result(timeout=120) for f in futures] == [0, 10, 20]
        assert [len(f.attempts) for f in futures] == [1, 2, 1]


def until_interrupted(folder):
    """A long call that checkpoints as it goes and when it is told to stop."""
    folder = Path(folder)
    state = batchfutures.restored()
    if state is not None:  # a later attempt: carry on from the checkpoint
        return ("restored", state)
    (folder / "pid").write_text(str(os.getpid()))
    steps = 0
    while not batchfutures.interrupted():
        steps += 1
        batchfutures.checkpoint(("steps", steps))
        time.sleep(0.01)
    batchfutures.checkpoint(("interrupted at", steps))
    (folder / "interrupted").write_text(str(steps))
    time.sleep(600)  # the kill comes


def test_a_checkpoint_survives_the_kill_that_follows_sigterm(local_env, tmp_path):
    with BatchExecutor(local_env, retries=2) as ex:
        future = ex.submit(until_interrupted, str(tmp_path))
        pid = int(wait_for(lambda: (tmp_path / "pid").exists() and (tmp_path / "pid").read_text(),
                           what="the call to start"))
        os.kill(pid, signal.SIGTERM)  # what ECS sends first when Spot takes the host back
        steps = int(wait_for(lambda: (tmp_path / "interrupted").exists()
                             and (tmp_path / "interrupted").read_text(), what="interrupted()"))
        os.kill(pid, signal.SIGKILL)  # and then, after the notice
        assert future.result(timeout=120) == ("restored", ("interrupted at", steps))
        assert [a.exit_code for a in future.attempts][-1] == 0 and len(future.attempts) == 2


def until_reclaimed(folder):
    """until_interrupted, on an attempt after a first one that saved nothing: no wait."""
    if batchfutures.restored() is None and os.environ.get("AWS_BATCH_JOB_ATTEMPT", "1") != "1":
        return ("fresh", None)  # the first was reclaimed before it ran this call's first line
    return until_interrupted(folder)


def test_the_emulators_spot_reclaim_then_the_checkpoint_on_the_next_attempt(local_env, tmp_path):
    # Spot reclaims within 3 s of RUNNING, at a random time: almost always once the call saves
    local_env.emulator.set_faults(FaultProfile(spot_reclaim_rate=1.0, spot_reclaim_after=3.0,
                                               spot_notice=1.0))
    with BatchExecutor(local_env, retries=3) as ex:
        future = ex.submit(until_reclaimed, str(tmp_path))
        wait_for(lambda: (tmp_path / "pid").exists() or future.done(), what="the call to start")
        # its next attempt is not reclaimed; the notice (read when Spot reclaims) stays short
        local_env.emulator.set_faults(FaultProfile(spot_notice=1.0))
        kind, state = future.result(timeout=120)
        if (tmp_path / "interrupted").exists():  # SIGTERM came once the call could act on it
            assert (kind, state) == ("restored",
                                     ("interrupted at", int((tmp_path / "interrupted").read_text())))
        else:  # reclaimed before the call's first line ran: nothing was saved
            assert kind == "fresh"
        attempts = future.attempts
        assert future.reclaims >= 1 and attempts[0].reason == "Your Spot Task was interrupted."
        assert attempts[-1].exit_code == 0


def one_at_a_time(index, folder):
    """Record when this call held the licence."""
    started = time.time()
    time.sleep(0.3)
    (Path(folder) / str(index)).write_text(f"{started} {time.time()}")
    return index


def test_consumes_holds_a_call_until_its_licence_is_free(local_env, tmp_path):
    local_env.batch.create_consumable_resource(consumableResourceName="licence", totalQuantity=1,
                                               resourceType="REPLENISHABLE")
    with BatchExecutor(local_env, vcpus=0.5) as ex:  # room for 4 at once: the licence decides
        licensed = ex.with_settings(consumes={"licence": 1})
        futures = licensed.map_futures(one_at_a_time, range(4), [str(tmp_path)] * 4)
        assert [f.result(timeout=120) for f in futures] == [0, 1, 2, 3]
    spans = sorted(tuple(map(float, (tmp_path / str(i)).read_text().split())) for i in range(4))
    for (_, end), (start, _) in zip(spans, spans[1:]):
        assert start >= end  # never two at once


def held_briefly(index, folder):
    """Record when this call held its licence."""
    started = time.time()
    time.sleep(0.1)
    (Path(folder) / str(index)).write_text(f"{started} {time.time()}")
    return index


def most_at_once(spans):
    """The largest number of (start, end) spans open at one moment (an end before a start at
    the same instant: one call's licence freed is the next one's)."""
    events = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    running = peak = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    return peak


@pytest.mark.parametrize("spans, expected", [
    ([], 0),
    ([(0, 1), (1, 2), (2, 3)], 1),          # back to back: never two
    ([(0, 2), (1, 3), (1.5, 4)], 3),
    ([(0, 5), (1, 2), (3, 4), (3.5, 6)], 3),
])
def test_most_at_once_counts_overlapping_spans(spans, expected):
    assert most_at_once(spans) == expected


def test_a_map_of_100_calls_holding_one_of_3_licences_never_runs_more_than_3_at_once(
        local_env, tmp_path):
    batch = local_env.batch
    batch.create_consumable_resource(consumableResourceName="seats", totalQuantity=3,
                                     resourceType="REPLENISHABLE")
    with BatchExecutor(local_env, vcpus=0.25) as ex:  # vCPUs for 8 at once: the seats decide
        seated = ex.with_settings(consumes={"seats": 1})
        assert list(seated.map(held_briefly, range(100), [str(tmp_path)] * 100)) == list(range(100))
    spans = [tuple(map(float, (tmp_path / str(i)).read_text().split())) for i in range(100)]
    assert most_at_once(spans) <= 3
    after = batch.describe_consumable_resource(consumableResource="seats")
    assert (after["inUseQuantity"], after["availableQuantity"]) == (0, 3)  # all given back


def test_k_reclaims_on_spot_then_the_next_attempt_on_the_on_demand_queue(local_env):
    batch = local_env.batch
    queue = add_on_demand_queue(batch, local_env.job_queue)
    spot_queue = {queue["jobQueueName"], queue["jobQueueArn"]}  # only this one is Spot
    local_env.emulator.set_faults(FaultProfile(spot_reclaim_rate=1.0, spot_reclaim_after=0.5,
                                               spot_notice=0.5, spot_queues=frozenset(spot_queue)))
    with BatchExecutor(local_env, spot_attempts=2, fallback_queue="on-demand") as ex:
        future = ex.submit(steps_to, 40)  # 2 s: Spot reclaims it within 0.5 s, every time
        assert future.result(timeout=120) == 40
        attempts = future.attempts
        assert future.reclaims == 2 and [a.reclaimed for a in attempts] == [True, True, False]
        assert attempts[0].reason == "Your Spot Task was interrupted." and attempts[-1].exit_code == 0
        first_job, last_job = attempts[0].job_id, attempts[-1].job_id
        assert first_job != last_job and future.job_id == last_job
        (described,) = batch.describe_jobs(jobs=[last_job])["jobs"]
        assert described["jobQueue"].endswith("on-demand")


def plus_one(value):
    return value + 1


def test_a_dependent_of_a_call_that_fell_back_runs_on_its_result(local_env):
    batch = local_env.batch
    queue = add_on_demand_queue(batch, local_env.job_queue)
    local_env.emulator.set_faults(FaultProfile(
        spot_reclaim_rate=1.0, spot_reclaim_after=0.5, spot_notice=0.5,
        spot_queues=frozenset({queue["jobQueueName"], queue["jobQueueArn"]})))
    with BatchExecutor(local_env, spot_attempts=1, fallback_queue="on-demand") as ex:
        upstream = ex.submit(steps_to, 30)
        dependent = ex.with_settings(spot_attempts=0).submit(plus_one, upstream)  # dependsOn
        first_job = wait_for(lambda: upstream.job_id, what="the upstream job")
        wait_for(lambda: upstream.job_id != first_job, what="the fall back to on demand")
        local_env.emulator.set_faults(FaultProfile(spot_notice=0.5))  # the rerun runs in peace
        assert upstream.result(timeout=120) == 30 and upstream.reclaims == 1
        assert dependent.result(timeout=120) == 31


def unaware(folder, seconds):
    """A call that knows nothing of checkpoints: SIGTERM ends it at once, as before."""
    (Path(folder) / "runs").write_text("started")
    if os.environ.get("AWS_BATCH_JOB_ATTEMPT", "1") == "1":
        time.sleep(seconds)  # the first attempt: reclaimed meanwhile
    return "done"


def test_a_reclaim_without_a_checkpoint_ends_the_call_on_sigterm_and_batch_retries_it(local_env,
                                                                                     tmp_path):
    local_env.emulator.set_faults(FaultProfile(spot_reclaim_rate=1.0, spot_reclaim_after=0.5,
                                               spot_notice=600.0))
    with BatchExecutor(local_env, retries=3) as ex:
        future = ex.submit(unaware, str(tmp_path), 600)
        wait_for(lambda: (tmp_path / "runs").exists() or future.done(), what="the call to start")
        local_env.emulator.set_faults(FaultProfile(spot_notice=600.0))  # the retry is not reclaimed
        assert future.result(timeout=120) == "done"  # long before the notice's SIGKILL
        attempts = future.attempts
        assert attempts[0].reclaimed and attempts[0].exit_code == 128 + signal.SIGTERM
        assert attempts[-1].exit_code == 0 and future.reclaims >= 1
