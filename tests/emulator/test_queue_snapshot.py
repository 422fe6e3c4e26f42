"""GetJobQueueSnapshot: the first RUNNABLE jobs in the order they will start, and the queue's
capacity use (queueUtilization: vCPUs of its starting and running jobs; on a fair-share queue,
the shares using them), checked against botocore's model by the harness.
"""

from __future__ import annotations

import pytest
from emulator_harness import QUEUE, py

from batchfutures.emulator.service import queue_utilization


@pytest.mark.parametrize("usage, fair_share, expected", [
    ({}, False, {"totalCapacityUsage": [{"capacityUnit": "VCPU", "quantity": 0.0}]}),
    ({None: 1.5}, False, {"totalCapacityUsage": [{"capacityUnit": "VCPU", "quantity": 1.5}]}),
    ({"a": 1.0, "b": 2.0}, True, {
        "totalCapacityUsage": [{"capacityUnit": "VCPU", "quantity": 3.0}],
        "fairshareUtilization": {"activeShareCount": 2, "topCapacityUtilization": [
            {"shareIdentifier": "b", "capacityUsage": [{"capacityUnit": "VCPU", "quantity": 2.0}]},
            {"shareIdentifier": "a", "capacityUsage": [{"capacityUnit": "VCPU", "quantity": 1.0}]}]}}),
])
def test_queue_utilization(usage, fair_share, expected):
    assert queue_utilization(usage, fair_share, 7) == dict(expected, lastUpdatedAt=7)


def test_only_the_top_20_shares_are_listed():
    usage = {f"s{i:02d}": float(i + 1) for i in range(25)}
    shares = queue_utilization(usage, True, 0)["fairshareUtilization"]
    assert shares["activeShareCount"] == 25
    assert [s["shareIdentifier"] for s in shares["topCapacityUtilization"]] == [
        f"s{i:02d}" for i in range(24, 4, -1)]


@pytest.mark.slow
def test_the_snapshot_shows_the_waiting_jobs_in_order_and_the_capacity_in_use(make_emulator):
    emu = make_emulator(max_vcpus=1)
    running = emu.job(py("import time; time.sleep(60)"), name="running")
    emu.wait(running, ["RUNNING"])
    waiting = [emu.job(py("pass"), name=f"waiting{i}") for i in range(3)]
    array = emu.job(py("pass"), name="array", size=2)
    expected = waiting + [f"{array}:0", f"{array}:1"]
    for job_id in expected:
        emu.wait(job_id, ["RUNNABLE"])
    snapshot = emu.get_job_queue_snapshot(jobQueue=QUEUE)
    front = snapshot["frontOfQueue"]["jobs"]
    assert [j["jobArn"].rsplit("/", 1)[1] for j in front] == expected
    assert all(j["earliestTimeAtPosition"] <= snapshot["frontOfQueue"]["lastUpdatedAt"]
               for j in front)
    assert snapshot["queueUtilization"]["totalCapacityUsage"] == [
        {"capacityUnit": "VCPU", "quantity": 1.0}]
    emu.terminate_job(jobId=running, reason="done")
    for job_id in expected:
        assert emu.wait(job_id)["status"] == "SUCCEEDED"
    after = emu.get_job_queue_snapshot(jobQueue=QUEUE)
    assert after["frontOfQueue"]["jobs"] == []
    assert after["queueUtilization"]["totalCapacityUsage"][0]["quantity"] == 0.0


@pytest.mark.slow
def test_a_fair_share_queue_shows_its_shares(make_emulator):
    emu = make_emulator(max_vcpus=2)
    arn = emu.create_scheduling_policy(name="shares", fairsharePolicy={
        "shareDistribution": [{"shareIdentifier": "a"}, {"shareIdentifier": "b"}]})["arn"]
    emu.create_job_queue(jobQueueName="fair", priority=1, schedulingPolicyArn=arn,
                         computeEnvironmentOrder=[])
    long = py("import time; time.sleep(60)")
    first = emu.job(long, queue="fair", shareIdentifier="a", vcpus=1.5)
    second = emu.job(long, queue="fair", shareIdentifier="b", vcpus=0.5)
    emu.wait(first, ["RUNNING"])
    emu.wait(second, ["RUNNING"])
    usage = emu.get_job_queue_snapshot(jobQueue="fair")["queueUtilization"]
    assert usage["totalCapacityUsage"] == [{"capacityUnit": "VCPU", "quantity": 2.0}]
    assert usage["fairshareUtilization"] == {"activeShareCount": 2, "topCapacityUtilization": [
        {"shareIdentifier": "a", "capacityUsage": [{"capacityUnit": "VCPU", "quantity": 1.5}]},
        {"shareIdentifier": "b", "capacityUsage": [{"capacityUnit": "VCPU", "quantity": 0.5}]}]}
    # another queue's snapshot does not count them
    assert emu.get_job_queue_snapshot(jobQueue=QUEUE)["queueUtilization"][
        "totalCapacityUsage"][0]["quantity"] == 0.0
    for job_id in (first, second):
        emu.terminate_job(jobId=job_id, reason="done")
