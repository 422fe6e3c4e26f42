"""The scheduler's RUNNABLE queue (emulator/runtime/runqueue.py): order, holds, vCPUs, time
limits; real jobs, no process."""

import pytest

from batchfutures.emulator.jobstate import MISCONFIGURED, Job, JobSpec
from batchfutures.emulator.runtime.placement import Host
from batchfutures.emulator.runtime.runqueue import RunQueue, ask_of
from batchfutures.statuses import JobStatus

HOST = Host(max_vcpus=4.0, memory_mib=8192, gpus=0)


def job(seq, vcpus=1.0, queue="q", **fields):
    return Job(JobSpec(job_id=f"j{seq}", name=f"n{seq}", queue=queue, created=0, seq=seq,
                       vcpus=vcpus, **fields))


def runnable(unit, tick=0, reason=None):
    unit.job.move(unit, JobStatus.RUNNABLE, 0, reason)
    unit.tick = tick
    return unit


def test_the_ask_of_a_plain_job_a_child_and_a_node():
    assert ask_of(job(1, vcpus=2.0, memory=512).units[0]).vcpus == 2.0
    assert ask_of(job(1, vcpus=None).units[0]).vcpus == 1.0  # no vCPUs asked: one
    assert ask_of(job(1, array_size=3).units[2]).total_vcpus == 1.0
    nodes = job(1, num_nodes=2, main_node=0, nodes=[{"vcpus": 1}, {"vcpus": 3}], vcpus=None)
    assert [ask_of(u).vcpus for u in nodes.units] == [1.0, 3.0]
    assert ask_of(nodes.units[0]).total_vcpus == 4.0  # the nodes run at once


def test_units_start_in_submission_order_while_their_vcpus_are_free():
    queue = RunQueue(HOST)
    second, first, third = job(2, vcpus=2.0), job(1, vcpus=2.0), job(3, vcpus=1.0)
    for unit in (second.units[0], first.units[0], third.units[0]):
        assert queue.add(runnable(unit), now=0.0)
    assert queue.head_fits()
    assert queue.take(tick=1) is first.units[0]
    assert queue.take(tick=1) is second.units[0]
    assert (queue.used_vcpus, first.units[0].reserved) == (4.0, 2.0)
    assert not queue.head_fits() and queue.take(tick=1) is None  # strict FIFO: the head waits
    queue.release(first.units[0])
    assert (queue.used_vcpus, first.units[0].reserved) == (2.0, 0.0)
    queue.release(first.units[0])  # twice: nothing more
    assert queue.used_vcpus == 2.0
    assert queue.take(tick=1) is third.units[0]


def test_a_unit_queued_in_this_tick_starts_in_the_next():
    queue = RunQueue(HOST)
    unit = runnable(job(1).units[0], tick=5)
    queue.add(unit, now=0.0)
    assert queue.take(tick=5) is None
    assert queue.take(tick=6) is unit


def test_a_unit_cancelled_while_queued_is_dropped_at_the_head():
    queue = RunQueue(HOST)
    first, second = runnable(job(1).units[0]), runnable(job(2).units[0])
    queue.add(first, now=0.0)
    queue.add(second, now=0.0)
    first.job.move(first, JobStatus.FAILED, 0, "cancelled")
    assert queue.take(tick=1) is second
    assert queue.take(tick=1) is None and not queue.head_fits()


def test_a_unit_that_never_fits_is_held_and_keeps_its_place_in_the_snapshot():
    queue = RunQueue(HOST)
    small, big, other = job(1), job(2, vcpus=8.0), job(3, queue="elsewhere")
    assert queue.add(runnable(small.units[0]), now=0.0)
    assert not queue.add(runnable(big.units[0], reason=MISCONFIGURED), now=7.0)
    assert big.units[0].runnable_since == 7.0
    assert queue.add(runnable(other.units[0]), now=0.0)
    assert queue.front("q", 10) == [small.units[0], big.units[0]]
    assert queue.front("q", 1) == [small.units[0]]
    assert queue.take(tick=1) is small.units[0]
    assert queue.take(tick=1) is other.units[0]  # a held unit is never taken
    assert queue.front("q", 10) == [big.units[0]]


CANCEL = {"state": "RUNNABLE", "action": "CANCEL", "reason": "MISCONFIGURATION:", "maxTimeSeconds": 60}


@pytest.mark.parametrize("now, status, due", [
    (159.0, JobStatus.RUNNABLE, False),   # held 59 s of 60
    (160.0, JobStatus.RUNNABLE, True),
    (160.0, JobStatus.FAILED, False),     # ended meanwhile: leaves the held list
])
def test_held_units_past_their_queues_time_limit(now, status, due):
    queue = RunQueue(HOST)
    unit = runnable(job(1, vcpus=8.0).units[0], reason=MISCONFIGURED)
    queue.add(unit, now=100.0)
    unit.job.move(unit, status, 0)
    found = queue.past_time_limit(lambda name: [CANCEL] if name == "q" else [], now)
    assert [u for u, _ in found] == ([unit] if due else [])
    if due:
        assert found[0][1] == ("Canceled by JobStateTimeLimit action due to reason: "
                               "MISCONFIGURATION:")
    still_held = status == JobStatus.RUNNABLE and not due
    assert queue.front("q", 10) == ([unit] if still_held else [])
