"""Why jobs wait, on the progress bar: the poller's WaitWatcher (when it reads, what it reads,
what it shows) and the bar's text. Batch's answers are recorded ones (the shapes of botocore's
model); refusals are botocore's own ClientError."""

import logging

import pytest
from botocore.exceptions import ClientError

from batchfutures import waiting
from batchfutures.progress import render_line, why_of
from batchfutures.waiting import WaitWatcher, is_waiting, queues_due, why_waiting

ARN = "arn:aws:batch:us-east-1:123456789012:job/{}"
QUEUE = "arn:aws:batch:us-east-1:123456789012:job-queue/q"
OTHER = "arn:aws:batch:us-east-1:123456789012:job-queue/other"


@pytest.mark.parametrize("since, now, after, last_read, refused, due", [
    ({}, 100.0, 30.0, {}, (), []),                                     # nothing waits
    ({"a": (QUEUE, 90.0)}, 100.0, 30.0, {}, (), []),                   # not long enough yet
    ({"a": (QUEUE, 70.0)}, 100.0, 30.0, {}, (), [QUEUE]),              # 30 s: read
    ({"a": (QUEUE, 10.0), "b": (QUEUE, 20.0)}, 100.0, 30.0, {}, (), [QUEUE]),  # once a queue
    ({"a": (QUEUE, 10.0), "b": (OTHER, 20.0)}, 100.0, 30.0, {}, (), [QUEUE, OTHER]),
    ({"a": (QUEUE, 10.0)}, 100.0, 30.0, {QUEUE: 95.0}, (), []),        # read 5 s ago
    ({"a": (QUEUE, 10.0)}, 100.0, 30.0, {QUEUE: 90.0}, (), [QUEUE]),   # read 10 s ago
    ({"a": (QUEUE, 10.0)}, 100.0, 30.0, {}, (QUEUE,), []),             # refused before
    ({"a": (QUEUE, 100.0)}, 100.0, 0.0, {}, (), [QUEUE]),              # threshold 0
    ({"a": ("", 10.0)}, 100.0, 30.0, {}, (), []),                      # no queue known
])
def test_queues_due(since, now, after, last_read, refused, due):
    assert queues_due(since, now, after=after, last_read=last_read, refused=refused) == due


@pytest.mark.parametrize("description, expected", [
    ({"status": "RUNNABLE"}, True),
    ({"status": "RUNNING"}, False),
    ({"status": "PENDING", "arrayProperties": {"statusSummary": {"RUNNABLE": 3, "RUNNING": 1}}}, True),
    ({"status": "PENDING", "arrayProperties": {"statusSummary": {"RUNNABLE": 0, "RUNNING": 4}}}, False),
    ({"status": "FAILED", "arrayProperties": {"statusSummary": {"RUNNABLE": 1}}}, False),
])
def test_is_waiting(description, expected):
    assert is_waiting(description) is expected


def job(job_id, status="RUNNABLE", consumes=None, vcpus=1):
    detail = {"jobId": job_id, "jobArn": ARN.format(job_id), "status": status, "jobQueue": QUEUE,
              "container": {"resourceRequirements": [{"type": "VCPU", "value": str(vcpus)},
                                                     {"type": "MEMORY", "value": "2048"}]}}
    if consumes:
        detail["consumableResourceProperties"] = {"consumableResourceList": [
            {"consumableResource": consumes, "quantity": 1}]}
    return detail


def snapshot(*job_ids, in_use=64.0):
    return {"frontOfQueue": {"jobs": [{"jobArn": ARN.format(j), "earliestTimeAtPosition": 1}
                                      for j in job_ids], "lastUpdatedAt": 1},
            "queueUtilization": {"totalCapacityUsage": [{"capacityUnit": "VCPU", "quantity": in_use}]}}


ENVIRONMENT = {"computeEnvironmentName": "ce", "computeEnvironmentArn": "arn:ce/ce",
               "state": "ENABLED", "status": "VALID",
               "computeResources": {"type": "EC2", "maxvCpus": 64}}


@pytest.mark.parametrize("kwargs, short", [
    (dict(job=job("j12"), snapshot=snapshot(*[f"x{i}" for i in range(11)], "j12"),
          environments=[ENVIRONMENT]), "12th in queue, 64/64 vCPUs in use"),
    (dict(job=job("j1"), snapshot=snapshot("j1", in_use=8.0), environments=[ENVIRONMENT]),
     "1st in queue, 8/64 vCPUs in use"),
    (dict(job=job("j2"), snapshot=snapshot("a", "j2", in_use=8.0)), "2nd in queue, 8 vCPUs in use"),
    (dict(job=job("j3"), snapshot=snapshot("a", "b", "j3", in_use=8.0)), "3rd in queue, 8 vCPUs in use"),
    (dict(job=job("z"), snapshot=snapshot("a", in_use=64.0), environments=[ENVIRONMENT]),
     "behind the first 100 in queue, 64/64 vCPUs in use"),
    (dict(job=job("j1", consumes="licence"), snapshot=snapshot("j1", in_use=2.0),
          resources=[{"consumableResourceName": "licence", "totalQuantity": 3, "inUseQuantity": 3,
                      "availableQuantity": 0}]), "licence busy (3/3 in use), 1st in queue"),
    (dict(job=job("j1"), queue={"jobQueueName": "q", "state": "DISABLED", "status": "VALID"}),
     "queue DISABLED/VALID"),
    (dict(job=job("j1", vcpus=128), environments=[ENVIRONMENT]),
     "too large for its queue (128 vCPU, 2048 MiB)"),
])
def test_the_short_reason_of_each_case(kwargs, short):
    assert why_waiting(kwargs.pop("job"), **kwargs).short == short


@pytest.mark.parametrize("counts, why, line", [
    ({"RUNNABLE": 2, "RUNNING": 1}, "", "f: 0/3 children | RUNNABLE 2, RUNNING 1"),
    ({"RUNNABLE": 2, "RUNNING": 1}, "waiting: 2nd in queue, 64/64 vCPUs in use",
     "f: 0/3 children | RUNNABLE 2, RUNNING 1 | waiting: 2nd in queue, 64/64 vCPUs in use"),
])
def test_the_line_ends_with_why(counts, why, line):
    assert render_line(counts, "f", why) == line


class RecordedBatch:
    """Batch's answers for one queue, recorded; every request counted by operation. ``refuse``:
    GetJobQueueSnapshot answers AccessDeniedException (a stack whose policy predates it)."""

    def __init__(self, front, refuse=False, resources=None):
        self.front, self.refuse, self.resources = front, refuse, resources or {}
        self.calls = []

    def get_job_queue_snapshot(self, jobQueue):
        self.calls.append(("GetJobQueueSnapshot", jobQueue))
        if self.refuse:
            raise ClientError({"Error": {"Code": "AccessDeniedException", "Message": "no"},
                               "ResponseMetadata": {"HTTPStatusCode": 403}}, "GetJobQueueSnapshot")
        return snapshot(*self.front)

    def describe_job_queues(self, jobQueues):
        self.calls.append(("DescribeJobQueues", jobQueues[0]))
        return {"jobQueues": [{"jobQueueName": "q", "jobQueueArn": QUEUE, "state": "ENABLED",
                               "status": "VALID",
                               "computeEnvironmentOrder": [{"order": 1, "computeEnvironment": "ce"}]}]}

    def describe_compute_environments(self, computeEnvironments):
        self.calls.append(("DescribeComputeEnvironments", tuple(computeEnvironments)))
        return {"computeEnvironments": [ENVIRONMENT]}

    def describe_consumable_resource(self, consumableResource):
        self.calls.append(("DescribeConsumableResource", consumableResource))
        return self.resources[consumableResource]

    def count(self, operation):
        return sum(1 for name, _ in self.calls if name == operation)


def test_one_snapshot_a_queue_a_round_for_all_its_jobs_only_after_the_threshold():
    batch = RecordedBatch(front=["a", "b", "c"])
    watcher = WaitWatcher(after=30.0)
    described = {name: job(name) for name in "abc"}
    watcher.observe(batch, described, set(described), now=0.0)
    watcher.observe(batch, described, set(described), now=29.0)
    assert batch.calls == [] and watcher.reason("a") is None  # not waiting long enough
    watcher.observe(batch, described, set(described), now=30.0)
    assert batch.count("GetJobQueueSnapshot") == 1  # one for the three jobs
    assert [watcher.reason(j).position for j in "abc"] == [1, 2, 3]
    assert waiting.reason_of("b").short == "2nd in queue, 64/64 vCPUs in use"
    assert why_of(["c", "b"]) == "waiting: 2nd in queue, 64/64 vCPUs in use"  # nearest the front
    watcher.observe(batch, described, set(described), now=35.0)  # a round 5 s later: no read
    watcher.observe(batch, described, set(described), now=40.0)  # 10 s later: read again
    assert batch.count("GetJobQueueSnapshot") == 2
    assert batch.count("DescribeJobQueues") == 1  # the queue's details are kept a while
    # a job that starts loses its reason; a job no longer tracked is forgotten
    watcher.observe(batch, {"a": job("a", status="RUNNING")}, {"a", "b"}, now=41.0)
    assert watcher.reason("a") is None and waiting.reason_of("a") is None
    assert watcher.reason("c") is None and watcher.reason("b") is not None


def test_a_consumable_resource_a_waiting_job_holds_is_read_with_the_snapshot():
    licence = {"consumableResourceName": "licence", "totalQuantity": 1, "inUseQuantity": 1,
               "availableQuantity": 0}
    batch = RecordedBatch(front=["a"], resources={"licence": licence})
    watcher = WaitWatcher(after=0.0)
    watcher.observe(batch, {"a": job("a", consumes="licence")}, {"a"}, now=0.0)
    assert watcher.reason("a").reason == "resource-busy"
    assert why_of(["a"]) == "waiting: licence busy (1/1 in use), 1st in queue"
    assert batch.count("DescribeConsumableResource") == 1


def test_a_refused_snapshot_shows_nothing_is_logged_once_and_not_asked_again(caplog):
    batch = RecordedBatch(front=["a"], refuse=True)
    watcher = WaitWatcher(after=0.0)
    with caplog.at_level(logging.DEBUG, logger="batchfutures"):
        for now in (0.0, 20.0, 40.0):
            watcher.observe(batch, {"a": job("a")}, {"a"}, now=now)
    assert batch.calls == [("GetJobQueueSnapshot", QUEUE)]  # refused once, never asked again
    assert watcher.reason("a") is None and why_of(["a"]) == ""
    logged = [r for r in caplog.records if "GetJobQueueSnapshot" in r.getMessage()
              or "get_job_queue_snapshot" in r.getMessage()]
    assert len(logged) == 1 and logged[0].levelno == logging.DEBUG


def test_a_client_without_the_operation_shows_nothing():
    class Old:  # a botocore too old to know GetJobQueueSnapshot
        pass

    watcher = WaitWatcher(after=0.0)
    watcher.observe(Old(), {"a": job("a")}, {"a"}, now=0.0)
    assert watcher.reason("a") is None


def test_the_threshold_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("BATCHFUTURES_WAIT_REASON_AFTER", "2.5")
    assert WaitWatcher().after == 2.5
    monkeypatch.setenv("BATCHFUTURES_WAIT_REASON_AFTER", "soon")
    assert WaitWatcher().after == waiting.WAIT_REASON_AFTER
    monkeypatch.delenv("BATCHFUTURES_WAIT_REASON_AFTER")
    assert WaitWatcher().after == 30.0
