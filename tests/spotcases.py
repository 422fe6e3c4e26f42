"""Calls and waits shared by the retry, Spot reclaim and fallback-queue tests (cold and warm
workers): one definition each, imported by those test files. The calls run on real workers,
which get them by value (serialization.local_modules_by_value), as a test file's own."""

import time
from pathlib import Path

import batchfutures


class Throttled(Exception):
    pass


def fails_twice(counter):
    """Raise Throttled on the first two runs (counted in a file), then succeed."""
    path = Path(counter)
    with path.open("a") as out:
        out.write(f"{time.time()}\n")
    runs = len(path.read_text().splitlines())
    if runs < 3:
        raise Throttled(f"run {runs}")
    return runs


def fails_with(kind, counter):
    with Path(counter).open("a") as out:
        out.write("x\n")
    raise kind("not listed")


def flaky_item(index, folder):
    marker = Path(folder) / str(index)
    first = not marker.exists()
    marker.write_text("ran")
    if index == 1 and first:
        raise Throttled("the first run of item 1")
    return index * 10


def steps_to(total):
    """Count to ``total`` from the last checkpoint, one checkpoint a step."""
    step = batchfutures.restored(default=0)
    while step < total:
        step += 1
        batchfutures.checkpoint(step)
        time.sleep(0.05)
    return step


def wait_for(predicate, timeout=60.0, what="the condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def add_on_demand_queue(batch, job_queue):
    """Make an "on-demand" queue on `job_queue`'s compute environments and wait until it is
    VALID (the emulator's queues are CREATING for a moment, as Batch's are); `job_queue`'s
    description is returned (its name and ARN mark it the Spot one)."""
    (queue,) = batch.describe_job_queues(jobQueues=[job_queue])["jobQueues"]
    batch.create_job_queue(jobQueueName="on-demand", priority=1,
                           computeEnvironmentOrder=queue["computeEnvironmentOrder"])
    wait_for(lambda: batch.describe_job_queues(jobQueues=["on-demand"])["jobQueues"][0]["status"]
             == "VALID", what="the on-demand queue")
    return queue
